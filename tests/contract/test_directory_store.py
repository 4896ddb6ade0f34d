"""One suite for every store of the federation directory: in memory and Redis (the real server
on 127.0.0.1:6379, a fresh key prefix per test). Expiry: in memory on a fake clock (no sleep),
in Redis with an entry received long ago written as the store writes it (Redis's own TIME is
the clock there)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
import redis.asyncio as aioredis

from agent_reach.errors import BackendUnavailable, ConfigError, RegistryFull
from agent_reach.federation.dirstore import SummaryStore, open_store
from agent_reach.testing import FakeClock
from agent_reach.wire.federation import DomainSummary, IntentSummary
from tests.support import REDIS_URL, drop_prefix, free_port

Opener = Callable[..., Awaitable[SummaryStore]]


def summary(domain: str, url: str = "http://127.0.0.1:7700", healthy: int = 1) -> DomainSummary:
    return DomainSummary(domain, url, 1.5, {"weather.get": IntentSummary(healthy, 0, 12.5, 0)})


@pytest.fixture(params=["memory://", REDIS_URL])
async def opener(request: pytest.FixtureRequest) -> AsyncIterator[Opener]:
    """Stores of the parametrized kind, all on one fresh prefix (for Redis: directory
    processes sharing one hash); closed and dropped afterwards."""
    prefix = f"test-{secrets.token_hex(6)}"
    made: list[SummaryStore] = []

    async def make(*, ttl_s: float = 60.0, max_domains: int = 100) -> SummaryStore:
        store = open_store(request.param, prefix=prefix, ttl_s=ttl_s, max_domains=max_domains)
        await store.start()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()
    if request.param != "memory://":
        drop_prefix(prefix)


async def test_publish_answers_the_others_only(opener: Opener) -> None:
    store = await opener()
    assert await store.publish(summary("beijing")) == ([], True)
    others, added = await store.publish(summary("shanghai"))
    assert added
    assert [e.domain for e in others] == ["beijing"]
    assert others[0].intents == {"weather.get": IntentSummary(1, 0, 12.5, 0)}
    assert others[0].gateway_url == "http://127.0.0.1:7700"
    assert 0 <= others[0].age_s < 5
    others, added = await store.publish(summary("beijing", healthy=3))
    assert not added  # known: replaced
    assert [e.domain for e in others] == ["shanghai"]
    fresh = await store.fresh()
    assert [e.domain for e in fresh] == ["beijing", "shanghai"]
    assert fresh[0].intents["weather.get"].healthy == 3
    assert await store.count() == 2


async def test_a_new_domain_past_the_bound_is_refused_a_known_one_is_not(opener: Opener) -> None:
    store = await opener(max_domains=2)
    await store.publish(summary("a"))
    await store.publish(summary("b"))
    with pytest.raises(RegistryFull) as refused:
        await store.publish(summary("c"))
    assert refused.value.fields["domain"] == "c"
    others, added = await store.publish(summary("a", url="http://127.0.0.1:7701"))
    assert (not added, [e.domain for e in others]) == (True, ["b"])
    assert [e.domain for e in await store.fresh()] == ["a", "b"]  # c was never written


async def test_two_redis_stores_share_one_hash() -> None:
    prefix = f"test-{secrets.token_hex(6)}"
    first, second = (
        open_store(REDIS_URL, prefix=prefix, ttl_s=60.0, max_domains=2) for _ in range(2)
    )
    try:
        await first.start()
        await second.start()
        await first.publish(summary("beijing"))
        others, _ = await second.publish(summary("shanghai"))
        assert [e.domain for e in others] == ["beijing"]
        assert [e.domain for e in await first.fresh()] == ["beijing", "shanghai"]
        with pytest.raises(RegistryFull):  # the bound is the hash's, not one process's
            await first.publish(summary("tokyo"))
    finally:
        await first.close()
        await second.close()
        drop_prefix(prefix)


async def test_memory_expiry_on_a_fake_clock() -> None:
    clock = FakeClock()
    store = open_store("memory://", prefix="x", ttl_s=60.0, max_domains=2, clock=clock)
    await store.publish(summary("beijing"))
    clock.advance(30)
    others, _ = await store.publish(summary("shanghai"))
    assert [(e.domain, e.age_s) for e in others] == [("beijing", 30.0)]
    clock.advance(30)  # beijing is 60 s old: still fresh (older than the TTL is stale)
    assert [(e.domain, e.age_s) for e in await store.fresh()] == [
        ("beijing", 60.0),
        ("shanghai", 30.0),
    ]
    clock.advance(0.5)
    assert [e.domain for e in await store.fresh()] == ["shanghai"]
    assert await store.count() == 1  # not kept either
    # the stale one made room: a new domain fits under max_domains = 2
    others, added = await store.publish(summary("tokyo"))
    assert added
    assert [e.domain for e in others] == ["shanghai"]
    clock.advance(61)
    assert await store.fresh() == []
    assert await store.count() == 0


async def test_redis_drops_stale_and_unreadable_entries() -> None:
    prefix = f"test-{secrets.token_hex(6)}"
    key = "{" + prefix + "}:directory:summaries"
    store = open_store(REDIS_URL, prefix=prefix, ttl_s=60.0, max_domains=2)
    raw = aioredis.Redis.from_url(REDIS_URL)
    try:
        await store.start()
        await store.publish(summary("beijing"))
        seconds, _ = await raw.time()
        old = {"received_ms": (seconds - 61) * 1000, "summary": msgspec.to_builtins(summary("old"))}
        await raw.hset(key, mapping={"old": msgspec.json.encode(old), "junk": b"not json"})
        assert await store.count() == 3
        # stale and unreadable ones are not handed out, and do not take room: with
        # max_domains = 2 a new domain still fits once they are dropped
        others, added = await store.publish(summary("shanghai"))
        assert added
        assert [e.domain for e in others] == ["beijing"]
        assert sorted(await raw.hkeys(key)) == [b"beijing", b"shanghai"]
        await raw.hset(key, "old", msgspec.json.encode(old))
        assert [e.domain for e in await store.fresh()] == ["beijing", "shanghai"]
        assert sorted(await raw.hkeys(key)) == [b"beijing", b"shanghai"]  # dropped by the read
        assert 0 < await raw.pttl(key) <= 61_000  # the hash goes when nobody publishes
    finally:
        await store.close()
        await raw.aclose()
        drop_prefix(prefix)


async def test_redis_away_is_backend_unavailable() -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0", prefix="x", ttl_s=60.0, max_domains=2)
    with pytest.raises(BackendUnavailable, match="cannot reach"):
        await store.start()
    with pytest.raises(BackendUnavailable):
        await store.fresh()
    with pytest.raises(BackendUnavailable):
        await store.publish(summary("beijing"))
    await store.close()


def test_bad_urls_and_prefixes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unsupported registry URL"):
        open_store("nats://127.0.0.1:4222", prefix="x", ttl_s=1.0, max_domains=1)
    with pytest.raises(ConfigError, match="prefix"):
        open_store(REDIS_URL, prefix="a b", ttl_s=1.0, max_domains=1)
