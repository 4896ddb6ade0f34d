"""One contract suite for every registry backend: the in-memory one and Redis (the real server
on 127.0.0.1:6379, a unique key prefix per test)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import ConfigError, EndpointHeld, RegistryFull
from agent_reach.registry import RegistryBackend, RegistryChange, open_registry
from agent_reach.testing import FakeClock
from tests.support import REDIS_URL, drop_prefix

Opener = Callable[..., Awaitable[RegistryBackend]]


@pytest.fixture(params=["memory://", REDIS_URL])
async def opener(request: pytest.FixtureRequest) -> AsyncIterator[Opener]:
    """Starts backends of the parametrized kind, all on one fresh prefix (for Redis: views of
    one shared registry), on the frozen liveness clock 100.0; closes them afterwards."""
    prefix = f"test-{secrets.token_hex(6)}"
    made: list[RegistryBackend] = []

    async def make(**kwargs: Any) -> RegistryBackend:
        backend = open_registry(request.param, prefix=prefix, **kwargs)
        backend.bind(lambda: 100.0)  # the records below are on this (frozen) liveness clock
        made.append(backend)
        await backend.start()
        return backend

    yield make
    for backend in made:
        await backend.close()
    if request.param != "memory://":
        drop_prefix(prefix)


@pytest.fixture
async def registry(opener: Opener) -> RegistryBackend:
    return await opener()


def rec(name: str, caps: tuple[str, ...] = ("t.a",), seen: float = 100.0) -> EndpointRecord:
    return EndpointRecord(f"agent://{name}", caps, f"http://127.0.0.1:9/{name}", "", seen, seen)


async def test_upsert_get_and_index(registry: RegistryBackend) -> None:
    assert await registry.upsert(rec("a", ("t.a", "t.b"))) is None
    await registry.upsert(rec("b", ("t.b",)))
    assert registry.get("agent://a") == rec("a", ("t.a", "t.b"))
    assert set(registry.by_intent("t.b")) == {"agent://a", "agent://b"}
    assert set(registry.by_intent("t.a")) == {"agent://a"}
    assert set(registry.by_intent("t.none")) == set()
    assert set(registry.intents()) == {"t.a", "t.b"}
    assert len(registry) == 2
    assert [r.endpoint_id for r in registry.records()] == ["agent://a", "agent://b"]


async def test_upsert_replaces_and_reindexes(registry: RegistryBackend) -> None:
    await registry.upsert(rec("a", ("t.old",)))
    before = await registry.upsert(rec("a", ("t.new",)))
    assert before == rec("a", ("t.old",))
    assert set(registry.by_intent("t.old")) == set()
    assert "t.old" not in registry.intents()
    assert set(registry.by_intent("t.new")) == {"agent://a"}
    assert len(registry) == 1


async def test_touch_updates_last_seen_only(registry: RegistryBackend) -> None:
    await registry.upsert(rec("a"))
    after = registry.touch("agent://a", 150.0, 1_700_000_150.0)
    assert after is not None
    assert (after.last_seen, after.last_seen_at) == (150.0, 1_700_000_150.0)
    assert after.capabilities == ("t.a",)
    assert registry.touch("agent://nobody", 1.0, 1.0) is None


async def test_remove_is_immediate(registry: RegistryBackend) -> None:
    await registry.upsert(rec("a"))
    assert (await registry.remove("agent://a")) == rec("a")
    assert registry.get("agent://a") is None
    assert set(registry.by_intent("t.a")) == set()
    assert await registry.remove("agent://a") is None


async def test_purge_deletes_only_old_records(registry: RegistryBackend) -> None:
    await registry.upsert(rec("old", seen=10.0))
    await registry.upsert(rec("new", seen=100.0))
    assert await registry.purge(50.0) == 1
    assert registry.get("agent://old") is None
    assert registry.get("agent://new") is not None


async def test_listeners_see_every_change_after_the_view(registry: RegistryBackend) -> None:
    seen: list[tuple[str, bool, bool, bool]] = []

    def listener(change: RegistryChange) -> None:
        in_view = registry.get(change.endpoint_id) is not None
        seen.append(
            (change.endpoint_id, change.before is not None, change.after is not None, in_view)
        )

    registry.subscribe(listener)
    await registry.upsert(rec("a"))
    registry.touch("agent://a", 101.0, 101.0)
    await registry.remove("agent://a")
    assert seen == [
        ("agent://a", False, True, True),
        ("agent://a", True, True, True),
        ("agent://a", True, False, False),
    ]


async def test_the_owner_of_a_registration_is_kept_and_shared(registry: RegistryBackend) -> None:
    """Token mode binds an id to its registration (``owner``): a heartbeat keeps it, a new
    registration replaces it, and another view of a shared registry sees the same."""
    await registry.upsert(rec("a")._replace(owner="gen-1"))
    after = registry.touch("agent://a", 150.0, 1_700_000_150.0)
    assert after is not None and after.owner == "gen-1"
    await registry.upsert(rec("a")._replace(owner="gen-2"))
    record = registry.get("agent://a")
    assert record is not None and record.owner == "gen-2"
    if registry.state().backend == "memory":
        return
    other = open_registry(REDIS_URL, prefix=registry.prefix)  # type: ignore[attr-defined]
    other.bind(lambda: 100.0)
    await other.start()
    try:
        seen = other.get("agent://a")
        assert seen is not None and seen.owner == "gen-2"
        await registry.upsert(rec("a")._replace(owner="gen-3"))  # a change, seen through pub/sub
        for _ in range(200):
            seen = other.get("agent://a")
            if seen is not None and seen.owner == "gen-3":
                break
            await asyncio.sleep(0.01)
        assert seen is not None and seen.owner == "gen-3"
    finally:
        await other.close()


async def test_a_live_id_held_by_another_registration_is_not_overwritten(
    registry: RegistryBackend,
) -> None:
    """Token mode's check, made where the record is written (in Redis: in the same script)."""
    await registry.upsert(rec("a")._replace(owner="gen-1"))
    with pytest.raises(EndpointHeld):
        await registry.upsert(
            rec("a")._replace(owner="gen-2", endpoint_url="http://127.0.0.1:8/x"),
            held_within_s=30.0,
        )
    kept = registry.get("agent://a")
    assert kept is not None and (kept.owner, kept.endpoint_url) == ("gen-1", rec("a").endpoint_url)
    # its own registration again, an id past the hold (down), and the unconditional write pass
    await registry.upsert(rec("a")._replace(owner="gen-1"), held_within_s=30.0)
    await registry.upsert(rec("b", seen=40.0)._replace(owner="gen-1"))
    await registry.upsert(rec("b")._replace(owner="gen-2"), held_within_s=30.0)
    b = registry.get("agent://b")
    assert b is not None and b.owner == "gen-2"
    await registry.upsert(rec("a")._replace(owner="gen-3"))
    a = registry.get("agent://a")
    assert a is not None and a.owner == "gen-3"


async def test_a_removal_with_an_owner_removes_only_that_owners_record(
    registry: RegistryBackend,
) -> None:
    """Token mode's deregistration: an endpoint token removes its own registration only."""
    changes: list[RegistryChange] = []
    await registry.upsert(rec("a")._replace(owner="gen-2"))
    registry.subscribe(changes.append)
    with pytest.raises(EndpointHeld):
        await registry.remove("agent://a", owner="gen-1")
    kept = registry.get("agent://a")
    assert kept is not None and kept.owner == "gen-2"
    assert set(registry.by_intent("t.a")) == {"agent://a"} and changes == []
    assert await registry.remove("agent://none", owner="gen-1") is None
    removed = await registry.remove("agent://a", owner="gen-2")
    assert removed is not None and removed.owner == "gen-2"
    assert registry.get("agent://a") is None and len(registry) == 0


# --- the record cap (max_records) ------------------------------------------------------------


async def test_a_new_id_past_the_cap_is_refused_and_changes_nothing(opener: Opener) -> None:
    registry = await opener(max_records=2)
    changes: list[RegistryChange] = []
    registry.subscribe(changes.append)
    await registry.upsert(rec("a", ("t.a",)))
    await registry.upsert(rec("b", ("t.b",)))
    changes.clear()
    with pytest.raises(RegistryFull) as refused:
        await registry.upsert(rec("c", ("t.c",)))
    assert refused.value.code == "registry_full"
    assert "agent://c" in refused.value.detail and "2" in refused.value.detail
    assert registry.get("agent://c") is None
    assert set(registry.by_intent("t.c")) == set()
    assert "t.c" not in registry.intents()
    assert len(registry) == 2
    assert changes == []  # no listener heard of it


async def test_a_registered_id_may_always_register_again_at_the_cap(opener: Opener) -> None:
    registry = await opener(max_records=2)
    await registry.upsert(rec("a", ("t.a",)))
    await registry.upsert(rec("b", ("t.b",)))
    before = await registry.upsert(rec("a", ("t.new",))._replace(endpoint_url="http://h:1/x"))
    assert before == rec("a", ("t.a",))
    again = registry.get("agent://a")
    assert again is not None and again.capabilities == ("t.new",)
    assert again.endpoint_url == "http://h:1/x"
    assert set(registry.by_intent("t.new")) == {"agent://a"}
    assert len(registry) == 2
    # with token mode's check too: its own registration again
    await registry.upsert(rec("b")._replace(owner="gen-1"))
    await registry.upsert(rec("b")._replace(owner="gen-1"), held_within_s=30.0)
    assert len(registry) == 2


async def test_a_removal_makes_room_and_down_records_count_until_purged(opener: Opener) -> None:
    registry = await opener(max_records=2)
    await registry.upsert(rec("old", seen=10.0))  # long down on the clock of 100.0
    await registry.upsert(rec("live"))
    with pytest.raises(RegistryFull):
        await registry.upsert(rec("new"))
    assert await registry.purge(50.0) == 1  # the down record goes: one place free
    await registry.upsert(rec("new"))
    with pytest.raises(RegistryFull):
        await registry.upsert(rec("newer"))
    await registry.remove("agent://live")
    await registry.upsert(rec("newer"))
    assert {r.endpoint_id for r in registry.records()} == {"agent://new", "agent://newer"}


async def test_no_cap_by_default(registry: RegistryBackend) -> None:
    for i in range(50):
        await registry.upsert(rec(f"n{i}"))
    assert len(registry) == 50


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
async def test_an_unusable_cap_is_a_config_error(opener: Opener, bad: object) -> None:
    with pytest.raises(ConfigError, match="max_records"):
        await opener(max_records=bad)


async def test_a_shared_map_is_seen_by_every_view_of_the_registry(opener: Opener) -> None:
    first = await opener()
    # on Redis a second view is another gateway; in memory the one registry is the process's
    second = first if _memory(first) else await opener()
    cards, other = first.shared_map("a2a-cards"), first.shared_map("other")
    assert await cards.items() == {}
    await cards.put("agent://a", '{"v": 1}')
    await cards.put("agent://b", "x")
    await cards.put("agent://a", '{"v": 2}')  # last write wins
    seen = second.shared_map("a2a-cards")
    assert await seen.get("agent://a") == '{"v": 2}'
    assert await seen.items() == {"agent://a": '{"v": 2}', "agent://b": "x"}
    assert await other.items() == {}  # maps are apart
    await seen.delete("agent://b")
    await seen.delete("agent://none")  # absent: no error
    assert await cards.items() == {"agent://a": '{"v": 2}'}
    assert await cards.get("agent://b") is None


def _memory(registry: RegistryBackend) -> bool:
    return type(registry).__name__ == "MemoryRegistry"


async def test_a_claim_map_is_seen_by_every_view_and_the_first_claim_wins(
    opener: Opener,
) -> None:
    first = await opener()
    second = first if _memory(first) else await opener()
    owners, seen = first.claim_map("a2a-owners"), second.claim_map("a2a-owners")
    assert await owners.get("task:t1") is None
    assert await owners.claim("task:t1", "agent://a", 60) == "agent://a"
    assert await seen.get("task:t1") == "agent://a"  # on Redis: another gateway
    # a second claim of a live entry, by another value: refused, the holder answered, unchanged
    assert await seen.claim("task:t1", "agent://b", 60) == "agent://a"
    assert await owners.get("task:t1") == "agent://a"
    assert await seen.claim("task:t1", "agent://a", 60) == "agent://a"  # the holder renews
    assert await first.claim_map("other").get("task:t1") is None  # maps are apart
    assert await first.shared_map("a2a-owners").items() == {}  # and apart from shared maps
    await seen.delete("task:t1")
    await seen.delete("task:none")  # absent: no error
    assert await owners.get("task:t1") is None
    assert await owners.claim("task:t1", "agent://b", 60) == "agent://b"  # free again


async def test_claims_at_once_have_one_winner(opener: Opener) -> None:
    first = await opener()
    second = first if _memory(first) else await opener()
    maps = [first.claim_map("a2a-owners"), second.claim_map("a2a-owners")]
    claims = [maps[i % 2].claim("ctx:c1", f"agent://n{i}", 60) for i in range(20)]
    held = await asyncio.gather(*claims)
    assert len(set(held)) == 1, held  # every claimant is told the one winner
    (winner,) = set(held)
    assert await maps[0].get("ctx:c1") == await maps[1].get("ctx:c1") == winner


async def test_a_claim_expires_after_its_ttl_on_the_memory_clock(opener: Opener) -> None:
    registry = await opener()
    if not _memory(registry):
        pytest.skip("Redis keeps its own time: the test below waits on it")
    clock = FakeClock(start=100.0)
    registry.bind(clock.monotonic)
    owners = registry.claim_map("a2a-owners")
    assert await owners.claim("task:t1", "agent://a", 30) == "agent://a"
    clock.advance(29.9)
    assert await owners.get("task:t1") == "agent://a"
    assert await owners.claim("task:t1", "agent://b", 30) == "agent://a"  # still live
    assert await owners.claim("task:t1", "agent://a", 30) == "agent://a"  # renewed: 30 more
    clock.advance(29.9)
    assert await owners.get("task:t1") == "agent://a"
    clock.advance(0.2)
    assert await owners.get("task:t1") is None  # gone for every reader
    assert await owners.claim("task:t1", "agent://b", 30) == "agent://b"  # and free to claim
    # expired entries nobody reads again do not pile up
    for i in range(5000):
        await owners.claim(f"ctx:{i}", "agent://a", 1)
        clock.advance(0.01)
    assert len(owners._values) < 2100, len(owners._values)  # type: ignore[attr-defined]


async def test_a_claim_expires_in_redis_after_its_ttl(opener: Opener) -> None:
    registry = await opener()
    if _memory(registry):
        pytest.skip("the memory map's expiry is tested on the fake clock")
    other = await opener()  # another gateway: it sees the expiry without a write of its own
    owners = registry.claim_map("a2a-owners")
    assert await owners.claim("task:t1", "agent://a", 0.3) == "agent://a"
    assert await other.claim_map("a2a-owners").claim("task:t1", "agent://b", 60) == "agent://a"
    deadline = time.monotonic() + 5.0
    while await other.claim_map("a2a-owners").get("task:t1") is not None:
        assert time.monotonic() < deadline, "the entry outlived its TTL by 5 s"
        await asyncio.sleep(0.02)
    assert await other.claim_map("a2a-owners").claim("task:t1", "agent://b", 60) == "agent://b"
    assert await owners.get("task:t1") == "agent://b"
