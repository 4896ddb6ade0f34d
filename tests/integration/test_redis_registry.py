"""Two RedisRegistry views of one real Redis (127.0.0.1:6379, a unique prefix per test):
what one gateway writes, the other sees, within the stated staleness bound; what Redis and
the views hold stays bounded by the live ids; the record cap holds across gateways; errors
are ours; the loops sleep on the injected clock."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from agent_reach.clock import SystemClock
from agent_reach.core.model import EndpointRecord
from agent_reach.errors import BackendUnavailable, ConfigError, EndpointHeld, RegistryFull
from agent_reach.registry import open_registry
from agent_reach.registry.redis import STALENESS_BOUND_S, RedisRegistry
from agent_reach.registry.redis.scripts import UPSERT
from tests.support import REDIS_URL, drop_prefix

# what a bound check allows on top of the stated bound: one Redis round trip and scheduling
SLACK_S = 0.25


@pytest.fixture
async def pair() -> AsyncIterator[Callable[..., RedisRegistry]]:
    prefix = f"test-{secrets.token_hex(6)}"
    made: list[RedisRegistry] = []

    def make(skew: float = 0.0, **kwargs: Any) -> RedisRegistry:
        registry = RedisRegistry(REDIS_URL, prefix=prefix, **kwargs)
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
    a.touch("agent://x", beat, time.time())
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


async def test_a_reconcile_asked_for_while_one_runs_is_not_lost(
    pair: Callable[..., RedisRegistry],
) -> None:
    """The listener asks for a reconcile once it has subscribed again: what was announced
    before that came through no channel. A reconcile already past its snapshot (which may
    not have it either) must leave that request standing, not take it for answered."""
    a, b = pair(sync_s=3600.0, reconcile_s=3600.0), pair()  # a's loops stay out of it
    await a.start()
    await b.start()
    await until(lambda: a._link.reconcile_due, 1.0)  # a's listener subscribed: asked once
    await b.upsert(rec("x", time.monotonic()))
    await until(lambda: a.get("agent://x") is not None, 0.2)
    # a's view forgets x, so that its reconcile reads it after the snapshot (a round trip)
    await a._view.remove("agent://x")
    a._versions.forget("agent://x")
    cursor = a._sync.cursor
    reconcile = asyncio.create_task(a._sync.reconcile())
    while a._sync.cursor == cursor:  # set from the snapshot, once it is read
        assert not reconcile.done()
        await asyncio.sleep(0)
    a._link.reconcile_due = True  # the listener, subscribed again after the snapshot
    await reconcile
    assert a.get("agent://x") is not None
    assert a._link.reconcile_due  # the next iteration of the sync loop reconciles


def keys_of(prefix: str) -> dict[str, str]:
    """Every key of the prefix in Redis now, with its type."""
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        return {k: r.type(k) for k in r.scan_iter("{" + prefix + "}:*", count=1000)}


def ids_of(registry: RedisRegistry) -> set[str]:
    return {r.endpoint_id for r in registry.records()}


async def test_redis_and_the_views_hold_only_the_live_ids(
    pair: Callable[..., RedisRegistry],
) -> None:
    """2,000 ids registered and deregistered (through either gateway) and 1,000 ids never
    registered deregistered leave nothing behind: not in Redis, not in the views' maps."""
    a, b = pair(), pair()
    await a.start()
    await b.start()
    now = time.monotonic()
    live = {f"agent://keep-{i}" for i in range(5)}
    for endpoint_id in sorted(live):
        await a.upsert(rec(endpoint_id.removeprefix("agent://"), now))
    for i in range(2000):
        await a.upsert(rec(f"churn-{i}", now))
        assert await (a if i % 2 else b).remove(f"agent://churn-{i}") is not None
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        seq = r.get("{" + a.prefix + "}:seq")
        for i in range(1000):  # answered 404 by a gateway: and nothing written
            assert await (a if i % 2 else b).remove(f"agent://unknown-{i}") is None
        assert r.get("{" + a.prefix + "}:seq") == seq
        p = "{" + a.prefix + "}"
        assert set(r.hkeys(p + ":ver")) == live
        assert set(r.zrange(p + ":seen", 0, -1)) == live
    assert set(keys_of(a.prefix)) == {
        *(f"{p}:ep:{endpoint_id}" for endpoint_id in live),
        f"{p}:seen",
        f"{p}:ver",
        f"{p}:seq",
        f"{p}:epoch",
    }
    for view in (a, b):
        await until(lambda: ids_of(view) == live, 2.0)  # noqa: B023
        # the removals are remembered only until their notices came back through the channel
        await until(lambda: view._versions.tombstones() == 0, 2.0)  # noqa: B023
        assert set(view._versions.live) == live
        assert set(view._buffer.writes) == set()
    # a newcomer loads the same; a reconcile of either changes nothing
    c = pair()
    await c.start()
    assert ids_of(c) == live and set(c._versions.live) == live
    await b._sync.reconcile()
    assert ids_of(b) == live and set(b._versions.live) == live


async def test_a_removed_id_registered_again_elsewhere_is_seen_everywhere(
    pair: Callable[..., RedisRegistry],
) -> None:
    """Versions keep growing over an id's whole history, though Redis forgets removed ids."""
    a, b = pair(), pair()
    await a.start()
    await b.start()
    for round_ in range(20):
        caps = (f"t.round{round_}",)
        writer, remover = (a, b) if round_ % 2 else (b, a)
        await writer.upsert(rec("x", time.monotonic(), caps))
        await until(lambda: remover.get("agent://x") is not None, 0.5)  # noqa: B023
        assert remover.get("agent://x").capabilities == caps  # type: ignore[union-attr]
        await remover.remove("agent://x")
        await until(lambda: writer.get("agent://x") is None, 0.5)  # noqa: B023
    await a.upsert(rec("x", time.monotonic(), ("t.last",)))
    await until(lambda: b.get("agent://x") is not None, 0.5)
    assert b.get("agent://x").capabilities == ("t.last",)  # type: ignore[union-attr]


async def test_the_cap_holds_across_gateways(pair: Callable[..., RedisRegistry]) -> None:
    """Checked in the write's own script: two gateways cannot both take the last place."""
    a, b = pair(max_records=3), pair(max_records=3)
    await a.start()
    await b.start()
    now = time.monotonic()
    await a.upsert(rec("one", now))
    await b.upsert(rec("two", now))
    for _ in range(2):  # twice: the second time every view is already full
        results = await asyncio.gather(
            a.upsert(rec("from-a", now)), b.upsert(rec("from-b", now)), return_exceptions=True
        )
        refused = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(r, RegistryFull) for r in refused), refused
        assert (
            len(refused) == 1 or ids_of(a) >= {"agent://from-a"} or ids_of(b) >= {"agent://from-b"}
        )
        with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
            assert r.zcard("{" + a.prefix + "}:seen") == 3
    for view in (a, b):
        await until(lambda: len(view) == 3, 1.0)  # noqa: B023
    assert ids_of(a) == ids_of(b)
    # a registered id registers again through either gateway
    await b.upsert(rec("one", time.monotonic(), ("t.again",)))
    await until(lambda: a.get("agent://one").capabilities == ("t.again",), 0.5)  # type: ignore[union-attr]


async def test_a_new_gateway_starts_versions_above_an_older_layout(
    pair: Callable[..., RedisRegistry],
) -> None:
    """Data written by an older release (a version per id ever seen, no counter): the first
    start drops the versions of removed ids and counts on from the highest."""
    a = pair()
    p = "{" + a.prefix + "}"
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        secs, micros = r.time()
        r.zadd(p + ":seen", {"agent://old": secs + micros / 1e6})
        r.hset(p + ":ep:agent://old", mapping={"caps": '["t.a"]', "url": "http://h:1/", "desc": ""})
        r.hset(
            p + ":ver", mapping={"agent://old": 7, **{f"agent://gone-{i}": 9 for i in range(300)}}
        )
    await a.start()
    assert ids_of(a) == {"agent://old"}
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.hkeys(p + ":ver") == ["agent://old"]
        assert int(r.get(p + ":seq") or 0) >= 9
    b = pair()
    await b.start()
    await a.upsert(rec("old", time.monotonic(), ("t.new",)))  # a version above 7 and 9
    await until(lambda: b.get("agent://old").capabilities == ("t.new",), 0.5)  # type: ignore[union-attr]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_start_on_an_unreachable_redis_raises_backend_unavailable() -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"
    registry = RedisRegistry(url, prefix="test-unreachable", connect_timeout_s=0.5)
    registry.bind(time.monotonic)
    with pytest.raises(BackendUnavailable) as raised:
        await registry.start()
    assert raised.value.code == "backend_unavailable"
    assert "cannot reach the registry at redis://***@127.0.0.1" in raised.value.detail
    assert "secret" not in str(raised.value)
    assert not isinstance(raised.value, redis.RedisError | ConnectionError)
    await registry.close()


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("http://127.0.0.1:6379/0", "ok"),  # not a registry URL
        ("redis://127.0.0.1:port/0", "ok"),  # not a port
        ("file:///tmp/x", "ok"),
        (REDIS_URL, ""),  # prefixes: empty, braces (the hash tag), spaces
        (REDIS_URL, "a{b}"),
        (REDIS_URL, "two words"),
    ],
)
def test_a_bad_registry_url_or_prefix_is_a_config_error(url: str, prefix: str) -> None:
    with pytest.raises(ConfigError):
        open_registry(url, prefix=prefix)


class RecordingClock(SystemClock):
    """The system clock, noting every sleep asked of it."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await super().sleep(seconds)


async def test_the_loops_sleep_on_the_injected_clock(pair: Callable[..., RedisRegistry]) -> None:
    clock = RecordingClock()
    a = pair(clock=clock, flush_s=0.011, sync_s=0.013)
    await a.start()
    await a.upsert(rec("x", time.monotonic()))
    a.touch("agent://x", time.monotonic(), time.time())  # wakes the flush loop
    await until(lambda: {0.011, 0.013} <= set(clock.slept), 1.0)


async def test_redis_gone_back_to_older_data_is_read_again(
    pair: Callable[..., RedisRegistry],
) -> None:
    """A restore from a snapshot (or a failover to a replica that missed writes): the epoch
    token is the same, but Redis's version counter went back. The views drop what the copy
    lacks, and changes made since are not taken for old ones."""
    a, b = pair(), pair()
    a.reconcile_s = b.reconcile_s = 3600.0  # only the detection can bring a reconcile soon
    await a.start()
    await b.start()
    await a.upsert(rec("kept", time.monotonic()))
    await a.upsert(rec("lost", time.monotonic()))
    await until(lambda: ids_of(b) == {"agent://kept", "agent://lost"}, 0.5)
    p = "{" + a.prefix + "}"
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        # the copy was taken after "kept" was registered, before "lost" was
        kept_version = r.hget(p + ":ver", "agent://kept")
        r.zrem(p + ":seen", "agent://lost")
        r.delete(p + ":ep:agent://lost")
        r.hdel(p + ":ver", "agent://lost")
        r.set(p + ":seq", kept_version)
    for view in (a, b):
        await until(lambda: ids_of(view) == {"agent://kept"}, 2.0)  # noqa: B023
    # registered again through b: a version the views once had for it, taken as new
    await b.upsert(rec("lost", time.monotonic(), ("t.again",)))
    await until(lambda: a.get("agent://lost") is not None, 0.5)
    assert a.get("agent://lost").capabilities == ("t.again",)  # type: ignore[union-attr]


def url_of(view: RedisRegistry, endpoint_id: str) -> str | None:
    record = view.get(endpoint_id)
    return None if record is None else record.endpoint_url


async def quiet_pair(pair: Callable[..., RedisRegistry]) -> tuple[RedisRegistry, RedisRegistry]:
    """Two started views whose loops stay out of the test (it calls what it needs), and x
    registered through the first, seen by the second."""
    a, b = pair(sync_s=3600.0, reconcile_s=3600.0), pair(sync_s=3600.0, reconcile_s=3600.0)
    await a.start()
    await b.start()
    await a.upsert(rec("x", time.monotonic()))
    await until(lambda: b.get("agent://x") is not None, 0.5)
    return a, b


async def beat_later(view: RedisRegistry, endpoint_id: str) -> None:
    """A heartbeat of the id taken by ``view`` 0.1 s from now (clearly after a change made
    just before, whatever either view's clock mapping errs by): a copy of its record that the
    view puts back is newer than that change by its last-seen time."""
    await asyncio.sleep(0.1)
    assert view.touch(endpoint_id, time.monotonic(), time.time()) is not None


def away(*views: RedisRegistry) -> None:
    """Each view takes Redis for away (as after a failed call): its writes are buffered."""
    for view in views:
        view._link.lost(BackendUnavailable("redis at test: away"), time.monotonic())


async def emptied(
    a: RedisRegistry, b: RedisRegistry, *, a_first: bool, newcomer: RedisRegistry | None = None
) -> None:
    """Redis restarted empty (its data dropped): a writes what it buffered (its sync loop's
    first step) and b notices the loss (it re-publishes its view), in that order or the
    other; then both read the whole registry. ``newcomer``: a gateway started before either
    noticed (it gives Redis a new epoch token)."""
    drop_prefix(a.prefix)
    if newcomer is not None:
        await newcomer.start()
    flush = a._buffer.flush(a._store, a._versions, a._store.now)
    if a_first:
        await flush
        await b._sync.reconcile()
    else:
        await b._sync.reconcile()
        await flush
    await a._sync.reconcile()
    await b._sync.reconcile()


@pytest.mark.parametrize("first", ["removal", "removal, a gateway started before", "republication"])
async def test_a_removal_made_while_redis_was_away_is_not_undone_by_a_republication(
    pair: Callable[..., RedisRegistry], first: str
) -> None:
    """x deregistered through a while Redis is away, and Redis comes back empty. b's view
    still has x, and puts it back when it notices the loss: that must not bring x back,
    whether a's buffered removal reaches Redis before b's re-publication (x is not there to
    remove: the removal leaves a tombstone, also when a gateway started on the emptied Redis
    before a noticed) or after it (it removes the re-published x)."""
    a, b = await quiet_pair(pair)
    await a.upsert(rec("y", time.monotonic()))
    await until(lambda: ids_of(b) == {"agent://x", "agent://y"}, 0.5)
    away(a, b)
    assert await a.remove("agent://x") is not None  # buffered
    await beat_later(b, "agent://x")
    c = pair() if "started" in first else None
    await emptied(a, b, a_first=first.startswith("removal"), newcomer=c)  # b re-publishes x, y
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert set(r.zrange("{" + a.prefix + "}:seen", 0, -1)) == {"agent://y"}
    assert ids_of(a) == ids_of(b) == {"agent://y"}
    if c is not None:
        await c._sync.reconcile()
        assert ids_of(c) == {"agent://y"}


@pytest.mark.parametrize("first", ["registration", "republication"])
async def test_a_registration_made_while_redis_was_away_is_not_overwritten_by_a_republication(
    pair: Callable[..., RedisRegistry], first: str
) -> None:
    """x registered again through a, at a new URL, while Redis is away; Redis comes back
    empty and b puts back the old record its view holds: the new one wins in either order."""
    a, b = await quiet_pair(pair)
    away(a, b)
    moved = rec("x", time.monotonic())._replace(endpoint_url="http://127.0.0.1:9/moved")
    await a.upsert(moved)  # buffered
    await beat_later(b, "agent://x")
    await emptied(a, b, a_first=first == "registration")
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.hget("{" + a.prefix + "}:ep:agent://x", "url") == moved.endpoint_url
    assert url_of(a, "agent://x") == url_of(b, "agent://x") == moved.endpoint_url


async def test_redis_gone_back_to_older_data_is_seen_after_its_counter_moved_on(
    pair: Callable[..., RedisRegistry],
) -> None:
    """A failover to a replica that missed x's move to a new URL, then writes elsewhere (the
    buffered ones of the failover) that take Redis's counter past what the views knew: the
    counter no longer shows the loss, x's version does. The views go back to what Redis holds,
    so that they agree with each other and with a gateway started now."""
    a, b = pair(sync_s=3600.0, reconcile_s=3600.0), pair()
    await a.start()
    await b.start()
    await b.upsert(rec("x", time.monotonic()))
    p = "{" + a.prefix + "}"
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        old_version, old_url = r.hget(p + ":ver", "agent://x"), r.hget(p + ":ep:agent://x", "url")
    moved = rec("x", time.monotonic())._replace(endpoint_url="http://127.0.0.1:9/moved")
    await b.upsert(moved)
    await until(lambda: url_of(a, "agent://x") == moved.endpoint_url, 0.5)
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:  # the replica's copy
        r.hset(p + ":ep:agent://x", "url", old_url)
        r.hset(p + ":ver", "agent://x", old_version)
        r.set(p + ":seq", old_version)
    for name in ("y", "z", "w"):  # the counter passes what the views knew
        await b.upsert(rec(name, time.monotonic()))
    await until(lambda: ids_of(a) == {"agent://x", "agent://y", "agent://z", "agent://w"}, 0.5)
    await a._sync.reconcile()
    assert url_of(a, "agent://x") == old_url
    c = pair()
    await c.start()
    assert url_of(c, "agent://x") == old_url


@pytest.mark.parametrize("later", ["elsewhere", "buffered"])
async def test_a_registration_buffered_while_cut_off_loses_to_a_later_one_elsewhere(
    pair: Callable[..., RedisRegistry], later: str
) -> None:
    """a is cut off from Redis (b is not); x registers at a new URL through each of them. When
    a writes what it buffered, the registration made later stands, whichever gateway took it,
    and both views come to show it."""
    a, b = await quiet_pair(pair)
    away(a)
    via_a, via_b = "http://127.0.0.1:9/via-a", "http://127.0.0.1:9/via-b"
    # the two registrations are made 0.1 s apart: far more than the error of either view's
    # mapping of its clock to Redis's (half a round trip)
    if later == "buffered":
        await b.upsert(rec("x", time.monotonic())._replace(endpoint_url=via_b))
        await asyncio.sleep(0.1)
        await a.upsert(rec("x", time.monotonic())._replace(endpoint_url=via_a))  # buffered
    else:
        await a.upsert(rec("x", time.monotonic())._replace(endpoint_url=via_a))  # buffered
        await asyncio.sleep(0.1)
        await b.upsert(rec("x", time.monotonic())._replace(endpoint_url=via_b))
    winner = via_a if later == "buffered" else via_b
    await a._buffer.flush(a._store, a._versions, a._store.now)
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.hget("{" + a.prefix + "}:ep:agent://x", "url") == winner
    await a._sync.reconcile()
    await until(lambda: url_of(b, "agent://x") == winner, 0.5)
    assert url_of(a, "agent://x") == winner


async def test_a_removal_buffered_while_cut_off_does_not_remove_a_later_registration(
    pair: Callable[..., RedisRegistry],
) -> None:
    """x deregistered through a while a is cut off, then registered again through b: a's
    late removal is not written, and a's view takes x back."""
    a, b = await quiet_pair(pair)
    away(a)
    assert await a.remove("agent://x") is not None  # buffered
    await asyncio.sleep(0.1)  # as above: the registration is made clearly later
    await b.upsert(rec("x", time.monotonic(), ("t.again",)))
    await a._buffer.flush(a._store, a._versions, a._store.now)
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.zscore("{" + a.prefix + "}:seen", "agent://x") is not None
    await a._sync.reconcile()
    for view in (a, b):
        assert view.get("agent://x").capabilities == ("t.again",)  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["direct", "buffered"])
async def test_an_owners_removal_spares_a_registration_made_since_elsewhere(
    pair: Callable[..., RedisRegistry], path: str
) -> None:
    """Token mode: x, registered through a by gen-1, is registered again by gen-2 through
    another gateway, whose notice has not reached a (here it never does). gen-1's removal
    through a, written at once or buffered while a is cut off, is refused in Redis: gen-2's
    registration stands, and a's view takes it. Without the owner in the script, x was gone."""
    a = pair(sync_s=3600.0, reconcile_s=3600.0)
    await a.start()
    await a.upsert(rec("x", time.monotonic())._replace(owner="gen-1"))
    keys = a._store._keys("agent://x")
    keys[3] += ":elsewhere"  # the other gateway's notice: on a channel a does not hear
    args = ["agent://x", '["t.a"]', "http://127.0.0.1:9/gen-2", "", "", "", "gen-2", "", "", ""]
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        r.eval(UPSERT, len(keys), *keys, *args)
    assert a.get("agent://x").owner == "gen-1"  # type: ignore[union-attr]
    if path == "direct":
        with pytest.raises(EndpointHeld):
            await a.remove("agent://x", owner="gen-1")
    else:
        away(a)
        assert await a.remove("agent://x", owner="gen-1") is not None  # buffered
        await a._buffer.flush(a._store, a._versions, a._store.now)
        assert not a._buffer.writes and not a._buffer.removed_by
        await a._sync.reconcile()
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert r.hget(keys[0], "owner") == "gen-2"
        assert r.zscore(keys[1], "agent://x") is not None
    kept = a.get("agent://x")
    assert kept is not None and (kept.owner, kept.endpoint_url) == ("gen-2", args[2])
    # a view that held the other owner refuses at once; the owner's own removal goes
    with pytest.raises(EndpointHeld):
        await a.remove("agent://x", owner="gen-1")
    assert await a.remove("agent://x", owner="gen-2") is not None
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        assert not r.exists(keys[0]) and r.zscore(keys[1], "agent://x") is None
