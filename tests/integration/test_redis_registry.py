"""Two RedisRegistry views of one real Redis (127.0.0.1:6379, a unique prefix per test):
what one gateway writes, the other sees, within the stated staleness bound."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable

import pytest

from agent_reach.core.model import EndpointRecord
from agent_reach.registry.redis import STALENESS_BOUND_S, RedisRegistry
from tests.support import REDIS_URL, drop_prefix

# what a bound check allows on top of the stated bound: one Redis round trip and scheduling
SLACK_S = 0.25


@pytest.fixture
async def pair() -> AsyncIterator[Callable[..., RedisRegistry]]:
    prefix = f"test-{secrets.token_hex(6)}"
    made: list[RedisRegistry] = []

    def make(skew: float = 0.0) -> RedisRegistry:
        registry = RedisRegistry(REDIS_URL, prefix=prefix)
        registry.bind(lambda: time.monotonic() + skew)
        made.append(registry)
        return registry

    yield make
    for registry in made:
        await registry.close()
    drop_prefix(prefix)


def rec(name: str, now: float, caps: tuple[str, ...] = ("t.a",)) -> EndpointRecord:
    return EndpointRecord(f"agent://{name}", caps, f"http://127.0.0.1:9/{name}", "", now, 0.0)


async def until(predicate: Callable[[], object], bound: float) -> float:
    """Seconds until ``predicate()`` holds; fails past ``bound``."""
    start = time.monotonic()
    while not predicate():
        elapsed = time.monotonic() - start
        assert elapsed <= bound, f"not seen within {bound} s"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


async def test_registration_removal_and_reregistration_propagate(
    pair: Callable[..., RedisRegistry],
) -> None:
    a, b = pair(), pair()
    await a.start()
    await b.start()
    await a.upsert(rec("x", time.monotonic(), ("t.a", "t.b")))
    await until(lambda: b.get("agent://x") is not None, 0.2)
    assert set(b.by_intent("t.b")) == {"agent://x"}
    await b.remove("agent://x")
    await until(lambda: a.get("agent://x") is None, 0.2)
    assert set(a.by_intent("t.a")) == set()
    await b.upsert(rec("x", time.monotonic(), ("t.c",)))
    await until(lambda: a.get("agent://x") is not None, 0.2)
    assert a.get("agent://x").capabilities == ("t.c",)  # type: ignore[union-attr]
    assert set(a.by_intent("t.a")) == set()


async def test_a_heartbeat_through_one_is_seen_by_the_other_within_the_bound(
    pair: Callable[..., RedisRegistry],
) -> None:
    a, b = pair(), pair()
    await a.start()
    await b.start()
    t0 = time.monotonic()
    await a.upsert(rec("x", t0))
    await until(lambda: b.get("agent://x") is not None, 0.2)
    await asyncio.sleep(0.3)  # let the record age, so that the next heartbeat is visibly newer
    beat = time.monotonic()
    await a.touch("agent://x", beat, time.time())
    waited = await until(
        lambda: b.get("agent://x").last_seen >= beat - 0.02,  # type: ignore[union-attr]
        STALENESS_BOUND_S + SLACK_S,
    )
    assert waited <= STALENESS_BOUND_S + SLACK_S


async def test_skewed_gateway_clocks_agree_on_the_age_of_a_heartbeat(
    pair: Callable[..., RedisRegistry],
) -> None:
    # b's liveness clock is 1000 s ahead of a's (another host, another boot): ages still agree
    a, b = pair(), pair(skew=1000.0)
    await a.start()
    await b.start()
    await a.upsert(rec("x", time.monotonic()))
    await until(lambda: b.get("agent://x") is not None, 0.2)
    seen_by_b = b.get("agent://x")
    assert seen_by_b is not None
    age_on_b = (time.monotonic() + 1000.0) - seen_by_b.last_seen
    assert -0.05 <= age_on_b <= 0.2
    # and the other way round
    await b.upsert(rec("y", time.monotonic() + 1000.0))
    await until(lambda: a.get("agent://y") is not None, 0.2)
    age_on_a = time.monotonic() - a.get("agent://y").last_seen  # type: ignore[union-attr]
    assert -0.05 <= age_on_a <= 0.2


async def test_a_new_gateway_loads_everything_and_a_restart_loses_nothing(
    pair: Callable[..., RedisRegistry],
) -> None:
    a = pair()
    await a.start()
    now = time.monotonic()
    for i in range(50):
        await a.upsert(rec(f"n{i}", now, (f"t.g{i % 5}",)))
    await a.close()
    b = pair()
    await b.start()
    assert len(b) == 50
    assert len(b.by_intent("t.g3")) == 10


async def test_a_lost_notification_is_repaired_by_the_reconcile(
    pair: Callable[..., RedisRegistry],
) -> None:
    a, b = pair(), pair()
    b.reconcile_s = 0.5
    await a.start()
    await b.start()
    # written straight into Redis, as if b had missed the notification
    await a.upsert(rec("x", time.monotonic()))
    await until(lambda: b.get("agent://x") is not None, 0.2)
    await b._view.remove("agent://x")  # b's view forgets it (the notification "lost")
    await until(lambda: b.get("agent://x") is not None, 0.5 + SYNC_SLACK)


SYNC_SLACK = 0.5
