"""How long a fallback index build holds the event loop while it reads the known tags' texts.

``python benchmarks/snapshot_bench.py [--tags 50000] [--rounds 5]``

A build reads the known tags and their texts on the loop (the registry's views are not for
threads: intents/matcher.py), then embeds them in a thread. Here: the real ``Router`` on the
in-memory registry, ``--tags`` tags registered as scenario 15 does (250 to an endpoint, no
descriptions), and the real ``MatchIndexHolder`` with a matcher whose build returns at once (the
embedding is not what is measured). A task that yields at every turn of the loop records how
long each turn was held. Reported per round: the read of the known tags (one step), the
longest hold during the build's snapshot, what it held of the loop in all and the wall time it
took (its slices are paced: F16 of docs/reliability.md), and, for comparison, the two
holds of the snapshot before F15 of docs/reliability.md (a set of the known tags, then 2,000
tags' texts at a time in the set's order).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Collection

from agent_reach.gateway.router import Router
from agent_reach.intents.matcher import (
    SNAPSHOT_PAUSE_S,
    SNAPSHOT_SLICE_S,
    MatchIndexHolder,
    Scored,
    TagTexts,
)
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody

PER_ENDPOINT = 250


class NoIndex:
    def match(self, intent: str | None, text: str | None, k: int = 4) -> Scored:
        return []


class Instant:
    """A matcher whose build costs nothing: what is left is the holder's snapshot."""

    name = "instant"
    method = "semantic"

    def build(self, known: Collection[str], texts: TagTexts) -> NoIndex:
        return NoIndex()


async def one_round(router: Router) -> dict[str, float]:
    started = time.perf_counter()
    router._known_tags()  # what the holder reads first
    known_ms = (time.perf_counter() - started) * 1000
    # what the build read before F15: the known tags through a set, in one hold, then their
    # texts 2,000 tags at a time in the set's order
    started = time.perf_counter()
    as_set = tuple({*router.registry.intents(), *router.dictionary.tags()})
    old_known_ms = (time.perf_counter() - started) * 1000
    steps = []
    for start in range(0, len(as_set), 2000):
        started = time.perf_counter()
        for tag in as_set[start : start + 2000]:
            tuple(router._tag_texts(tag))
        steps.append((time.perf_counter() - started) * 1000)
    old_step_ms, old_total_ms = max(steps), old_known_ms + sum(steps)

    holds: list[float] = []

    async def turns() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            holds.append(now - last)
            last = now

    holder = MatchIndexHolder(Instant(), router._known_tags, router._tag_texts)
    ticker = asyncio.create_task(turns())
    await asyncio.sleep(0)
    started = time.perf_counter()
    await holder.wait(timeout_s=60)
    total_ms = (time.perf_counter() - started) * 1000
    ticker.cancel()
    holder.close()
    return {
        "known_ms": known_ms,
        "max_hold_ms": max(holds) * 1000,
        # what the snapshot held of the loop: its slices, the turns longer than half of one
        # (an empty turn of the ticker's is a few µs)
        "held_ms": sum(h for h in holds if h > SNAPSHOT_SLICE_S / 2) * 1000,
        "total_ms": total_ms,
        "turns": len(holds),
        "old_known_ms": old_known_ms,
        "old_step_ms": old_step_ms,
        "old_total_ms": old_total_ms,
    }


async def main(tags: int, rounds: int) -> None:
    clock = FakeClock(start=0.0, wall_offset=1.7e9)
    router = Router(GatewaySettings(), MemoryRegistry(), clock)
    for e in range(tags // PER_ENDPOINT):
        caps = [f"hostile.t{e}.c{c}" for c in range(PER_ENDPOINT)]
        body = RegisterBody(
            endpoint_id=f"agent://tags-{e:03d}", capabilities=caps, endpoint_url="http://h:9/"
        )
        await router.register(body)
    results = [await one_round(router) for _ in range(rounds)]
    print(
        f"snapshot_bench: {tags:,} tags, {rounds} rounds, slices of {SNAPSHOT_SLICE_S * 1000} ms"
        f" {SNAPSHOT_PAUSE_S * 1000} ms apart"
    )
    print("| figure | median | min-max |")
    print("|---|---|---|")
    for key, label in (
        ("known_ms", "the known tags, read in one hold, ms"),
        ("max_hold_ms", "the snapshot's longest hold of the loop, ms"),
        ("held_ms", "the loop held by the snapshot, ms in all"),
        ("total_ms", "the snapshot (and the instant build), ms of wall time"),
        ("turns", "turns of the loop meanwhile"),
        ("old_known_ms", "before F15: the known tags through a set, one hold, ms"),
        ("old_step_ms", "before F15: the longest of the 2,000-tag holds (a set's order), ms"),
        ("old_total_ms", "before F15: the whole read, ms in all"),
    ):
        values = [r[key] for r in results]
        print(
            f"| {label} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tags", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.tags, args.rounds))
