"""How long a semantic index build holds up the event loop beside it, at 50,000 tags.

``python benchmarks/build_lag_bench.py [--tags 50000] [--rounds 3]``

A build runs in a worker thread (intents/matcher.py); whatever part of it holds the GIL in one
piece, the event loop waits for, however low the thread's priority. Here the real
``SemanticMatcher`` builds ``--tags`` tags named as scenario 15 registers them (no descriptions),
in a thread at the matcher's niceness, beside a main thread that sleeps 0.2 ms again and again
and records how late it wakes (its wait for the GIL, mostly), with the gateway's switch interval
and collector thresholds. The model is replaced by a stand-in that leaves the GIL as the real
engine does (it sleeps 1 s and hands out unit vectors made beforehand): the embedding's own cost
is not measured, what the build does around it is. Reported per round: the longest and the p99
lateness before the embedding (reading the tags), after it (the index, with cells at this size),
and the whole build's time.

Beside it, in the same rounds, the single calls the build made before F16 of
docs/reliability.md and the ones that replaced them, each run alone in a thread the same way:
``np.add.reduceat`` of the rows against ``group_sums`` (groups of one row, as scenario 15's tags
have, and of 1-3), ``dict.fromkeys`` of the tags against
``distinct``, and one ``sorted`` of them against ``sorted_order``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from agent_reach.cli.main import SWITCH_INTERVAL_S
from agent_reach.intents.matcher import GIL_FREE_NICE, _below_the_loop, _lookup, distinct
from agent_reach.intents.semantic import SemanticMatcher, group_sums, sorted_order

DIM = 384
PER_ENDPOINT = 250


class StandIn:
    """Leaves the GIL for a second per call, as the real engine does for far longer, then
    hands out rows of a matrix of unit vectors made beforehand."""

    name = "stand-in"
    dim = DIM
    releases_gil = True

    def __init__(self, rows: int) -> None:
        pool = np.random.default_rng(0).standard_normal((rows, DIM)).astype(np.float32)
        self.pool = pool / np.linalg.norm(pool, axis=1, keepdims=True)
        self.marks: list[tuple[str, float]] = []

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.marks.append(("embed", time.perf_counter()))
        if len(texts) > 100:  # the build's; the background's few are at once
            time.sleep(1.0)
        out: np.ndarray = self.pool[: len(texts)].copy()
        self.marks.append(("embedded", time.perf_counter()))
        return out

    embed_passages = embed_queries


def lateness(
    work: Callable[[], object],
) -> tuple[list[tuple[float, float, float]], float, float]:
    """``work()`` in a thread at the matcher's niceness; the main thread's sleeps meanwhile
    as (fell asleep, woke, ms late), and when the work started and ended."""
    span: list[float] = []
    go = threading.Event()  # the work waits until the main thread is measuring

    def run() -> None:
        _below_the_loop(GIL_FREE_NICE)
        go.wait()
        span.append(time.perf_counter())
        work()
        span.append(time.perf_counter())

    late: list[tuple[float, float, float]] = []
    thread = threading.Thread(target=run)
    thread.start()
    go.set()
    while thread.is_alive():
        asleep = time.perf_counter()
        time.sleep(0.0002)
        woke = time.perf_counter()
        late.append((asleep, woke, (woke - asleep - 0.0002) * 1000))
    thread.join()
    return late, span[0], span[1]


def worst(late: list[tuple[float, float, float]], start: float, end: float) -> tuple[float, float]:
    """The longest and the p99 lateness of the sleeps that overlap [start, end)."""
    values = sorted(ms for asleep, woke, ms in late if asleep < end and woke > start)
    if not values:
        return 0.0, 0.0
    return values[-1], values[min(len(values) - 1, int(len(values) * 0.99))]


def one_build(tags: int) -> dict[str, float]:
    embedder = StandIn(tags)
    matcher = SemanticMatcher(embedder, background=())
    matcher.build(["warm.up"], lambda tag: ())
    known = tuple(f"hostile.t{e}.c{c}" for e in range(tags // PER_ENDPOINT) for c in range(250))
    texts = _lookup(dict.fromkeys(known, ()))
    embedder.marks.clear()
    late, start, end = lateness(lambda: matcher.build(known, texts))
    marks = dict(embedder.marks)
    before = worst(late, start, marks["embed"])
    after = worst(late, marks["embedded"], end)
    return {
        "before_max": before[0],
        "before_p99": before[1],
        "after_max": after[0],
        "after_p99": after[1],
        "build_s": end - start - (marks["embedded"] - marks["embed"]),
    }


def one_call(work: Callable[[], object], took: dict[str, float], name: str) -> float:
    """The longest wait of the loop while ``work()`` runs once (its time into ``took``)."""
    late, start, end = lateness(work)
    took[name] = (end - start) * 1000
    return worst(late, start, end)[0]


def calls(tags: int, took: dict[str, float]) -> dict[str, float]:
    """The single calls, alone: the longest wait of each (its time into ``took``). The
    groups: one row each (scenario 15's tags, no descriptions), and 1-3 rows each."""
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((tags, DIM)).astype(np.float32)
    starts = np.arange(tags, dtype=np.intp)
    sizes = rng.integers(1, 4, size=tags)
    mixed_starts = np.zeros(tags, dtype=np.intp)
    mixed_starts[1:] = np.cumsum(sizes[:-1])
    mixed = rng.standard_normal((int(sizes.sum()), DIM)).astype(np.float32)
    known = [f"hostile.t{e}.c{c}" for e in range(tags // PER_ENDPOINT) for c in range(250)]
    shuffled = [known[i] for i in rng.permutation(len(known))]
    work: dict[str, Callable[[], object]] = {
        "reduceat": lambda: np.add.reduceat(rows, starts, axis=0),
        "group_sums": lambda: group_sums(rows, starts),
        "reduceat 1-3 rows": lambda: np.add.reduceat(mixed, mixed_starts, axis=0),
        "group_sums 1-3 rows": lambda: group_sums(mixed, mixed_starts),
        "dict.fromkeys": lambda: dict.fromkeys(known),
        "distinct": lambda: distinct(known),
        "sorted": lambda: sorted(range(len(shuffled)), key=shuffled.__getitem__),
        "sorted_order": lambda: sorted_order(shuffled),
    }
    return {name: one_call(fn, took, name) for name, fn in work.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)  # as the gateway runs (cli/main.py)
    builds: list[dict[str, float]] = []
    singles: list[dict[str, float]] = []
    times: list[dict[str, float]] = []
    print(f"build_lag_bench: {args.tags:,} tags, {args.rounds} rounds (ms the loop waited)")
    for n in range(args.rounds):
        builds.append(one_build(args.tags))
        times.append({})
        singles.append(calls(args.tags, times[-1]))
        b, s = builds[-1], singles[-1]
        print(
            f"  round {n + 1}: build {b['build_s']:.2f} s besides the embedding; longest wait"
            f" before the embedding {b['before_max']:.2f} (p99 {b['before_p99']:.2f}), after it"
            f" {b['after_max']:.2f} (p99 {b['after_p99']:.2f}); single calls: "
            + ", ".join(f"{k} {v:.2f}" for k, v in s.items())
        )
    print("medians:")
    for key in builds[0]:
        print(f"  build {key}: {statistics.median(b[key] for b in builds):.2f}")
    for key in singles[0]:
        wait = statistics.median(s[key] for s in singles)
        took = statistics.median(t[key] for t in times)
        print(f"  {key}: longest wait {wait:.2f} ms, the call {took:.1f} ms")


if __name__ == "__main__":
    main()
