"""The agent SDK's dedup by msg_id: the recent-results cache on an injected clock, and one run
per key on a plain event loop (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from agent_reach.sdk._dedup import Conflict, RecentResults, RunOnce
from agent_reach.testing import FakeClock


@dataclass(frozen=True)
class R:
    name: str
    size: int = 10
    final: bool = True


def test_a_result_is_kept_until_its_ttl_runs_out() -> None:
    clock = FakeClock()
    cache: RecentResults[R] = RecentResults(max_entries=8, ttl_s=30.0)
    assert cache.get("m1", clock.monotonic()) is None
    cache.put("m1", R("a"), clock.monotonic())
    clock.advance(29.9)
    assert cache.get("m1", clock.monotonic()) == R("a")
    clock.advance(0.1)
    assert cache.get("m1", clock.monotonic()) is None
    assert len(cache) == 0 and cache.bytes == 0  # an expired entry found is dropped


def test_the_least_recently_used_entry_goes_first() -> None:
    cache: RecentResults[R] = RecentResults(max_entries=2, ttl_s=60.0)
    cache.put("m1", R("a"), 0.0)
    cache.put("m2", R("b"), 0.0)
    assert cache.get("m1", 1.0) == R("a")  # m1 is now the most recently used
    cache.put("m3", R("c"), 1.0)
    assert cache.get("m2", 1.0) is None
    assert cache.get("m1", 1.0) == R("a")
    assert cache.get("m3", 1.0) == R("c")
    assert len(cache) == 2


def test_the_byte_bound_evicts_and_an_oversized_result_is_not_kept() -> None:
    cache: RecentResults[R] = RecentResults(max_entries=100, ttl_s=60.0, max_bytes=100)
    for i in range(5):
        cache.put(f"m{i}", R(str(i), size=30), 0.0)
    assert [k for k in ("m0", "m1", "m2", "m3", "m4") if cache.get(k, 0.0)] == ["m2", "m3", "m4"]
    assert cache.bytes == 90
    cache.put("huge", R("h", size=101), 0.0)
    assert cache.get("huge", 0.0) is None
    assert cache.bytes == 90  # nothing was evicted for it either


def test_putting_a_key_again_replaces_it_and_its_bytes() -> None:
    cache: RecentResults[R] = RecentResults(max_entries=4, ttl_s=10.0)
    cache.put("m1", R("a", size=40), 0.0)
    cache.put("m1", R("b", size=5), 5.0)
    assert cache.get("m1", 14.0) == R("b", size=5)  # the TTL counts from the second put
    assert cache.bytes == 5 and len(cache) == 1


@pytest.mark.parametrize(("entries", "ttl"), [(0, 10.0), (4, 0.0)])
def test_a_zero_bound_keeps_nothing(entries: int, ttl: float) -> None:
    cache: RecentResults[R] = RecentResults(max_entries=entries, ttl_s=ttl)
    cache.put("m1", R("a"), 0.0)
    assert cache.get("m1", 0.0) is None


def test_negative_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        RecentResults(max_entries=-1)


def once(clock: FakeClock | None = None) -> RunOnce[R]:
    clock = clock or FakeClock()
    return RunOnce(RecentResults(max_entries=16, ttl_s=60.0), lambda r: r.final, clock.monotonic)


async def test_a_second_delivery_in_flight_joins_the_first_run() -> None:
    runner = once()
    gate = asyncio.Event()
    calls = 0

    async def work() -> R:
        nonlocal calls
        calls += 1
        await gate.wait()
        return R("done")

    first = asyncio.create_task(runner.run("m1", work))
    second = asyncio.create_task(runner.run("m1", work))
    await asyncio.sleep(0)  # both calls reach the run (a yield, not a wait for time)
    assert runner.running == 1
    gate.set()
    assert await first == (R("done"), "ran")
    assert await second == (R("done"), "joined")
    assert await runner.run("m1", work) == (R("done"), "cached")
    assert calls == 1 and runner.running == 0


async def test_a_key_with_another_fingerprint_is_a_conflict_in_flight_and_cached() -> None:
    """The same key naming other work (a msg_id reused for another payload) is refused, both
    while the first run goes and once its result is kept; the first's result is untouched."""
    runner = once()
    gate = asyncio.Event()

    async def work() -> R:
        await gate.wait()
        return R("done")

    first = asyncio.create_task(runner.run("m1", work, b"p1"))
    await asyncio.sleep(0)
    with pytest.raises(Conflict):
        runner.begin("m1", work, b"p2")
    assert runner.running == 1  # the conflict started nothing
    gate.set()
    assert await first == (R("done"), "ran")
    with pytest.raises(Conflict):
        runner.begin("m1", work, b"p2")
    assert await runner.run("m1", work, b"p1") == (R("done"), "cached")
    assert runner.running == 0


async def test_a_delivery_that_goes_away_does_not_cancel_the_run() -> None:
    runner = once()
    gate = asyncio.Event()

    async def work() -> R:
        await gate.wait()
        return R("done")

    first = asyncio.create_task(runner.run("m1", work))
    await asyncio.sleep(0)
    first.cancel()  # the gateway gave up on attempt 1 and closed the connection
    with pytest.raises(asyncio.CancelledError):
        await first
    assert runner.running == 1
    retry = asyncio.create_task(runner.run("m1", work))
    await asyncio.sleep(0)
    gate.set()
    assert await retry == (R("done"), "joined")


async def test_results_that_are_not_final_run_again() -> None:
    runner = once()
    calls = 0

    async def crash() -> R:
        nonlocal calls
        calls += 1
        return R("500", final=False)

    assert (await runner.run("m1", crash))[1] == "ran"
    assert (await runner.run("m1", crash))[1] == "ran"
    assert calls == 2


async def test_an_exception_reaches_every_waiter_and_is_not_cached() -> None:
    runner = once()
    gate = asyncio.Event()

    async def boom() -> R:
        await gate.wait()
        raise LookupError("bug")

    first = asyncio.create_task(runner.run("m1", boom))
    second = asyncio.create_task(runner.run("m1", boom))
    await asyncio.sleep(0)
    gate.set()
    for task in (first, second):
        with pytest.raises(LookupError):
            await task
    assert runner.running == 0 and len(runner.cache) == 0


async def test_the_cache_forgets_after_the_ttl_on_the_injected_clock() -> None:
    clock = FakeClock()
    runner = once(clock)
    calls = 0

    async def work() -> R:
        nonlocal calls
        calls += 1
        return R(str(calls))

    assert await runner.run("m1", work) == (R("1"), "ran")
    clock.advance(59.0)
    assert await runner.run("m1", work) == (R("1"), "cached")
    clock.advance(1.0)
    assert await runner.run("m1", work) == (R("2"), "ran")


async def test_close_cancels_runs_in_flight() -> None:
    runner = once()
    never = asyncio.Event()

    async def hang() -> R:
        await never.wait()
        return R("never")

    waiter = asyncio.create_task(runner.run("m1", hang))
    await asyncio.sleep(0)
    assert await runner.close(5.0) == []  # every run ended within the bound
    assert runner.running == 0
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_close_gives_up_on_a_run_that_swallows_its_cancellation() -> None:
    """close() awaited the cancelled runs with no bound: one such run held shutdown for good."""
    runner = once()
    release, ended = asyncio.Event(), asyncio.Event()

    async def stubborn() -> R:
        try:
            await release.wait()
        except asyncio.CancelledError:  # what this test is about: a run that will not stop
            await release.wait()
        finally:
            ended.set()
        return R("late")

    waiter = asyncio.create_task(runner.run("m1", stubborn))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(runner.close(0.01), 5.0) == ["m1"]  # left behind, named
    assert runner.running == 0 and not ended.is_set()
    release.set()  # the run left behind ends with the test
    assert await asyncio.wait_for(waiter, 5.0) == (R("late"), "ran")


def test_the_byte_bound_counts_the_keys_too() -> None:
    """Only the values were counted: large keys held memory the bound never saw."""
    cache: RecentResults[R] = RecentResults(
        max_entries=100, ttl_s=60.0, max_bytes=100, key_bytes=len
    )
    cache.put("k" * 50, R("a", size=10), 0.0)
    assert cache.bytes == 60
    cache.put("j" * 50, R("b", size=10), 0.0)  # 120 > 100: the older one goes
    assert len(cache) == 1 and cache.bytes == 60
    cache.put("x" * 95, R("c", size=10), 0.0)  # over the bound with its key alone: not kept
    assert cache.get("x" * 95, 0.0) is None and cache.bytes == 60
