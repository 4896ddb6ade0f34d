"""The writes a RedisRegistry buffers while Redis is away, on the real Redis (127.0.0.1:6379,
a unique prefix per test) reached through a relay of the test's own that it can cut or
freeze: Redis away as a partition makes it, without stopping the server other tests share.

Shown here: a registration and removal of an id Redis never had buffer nothing (the buffer
does not grow with such churn), while a removal of an id Redis holds is still written, and
so is one of an id whose write timed out (it may land late); past its bound the buffer
refuses writes of more ids, nothing changed, and takes them again once there is room; two
flushes at once write each buffered entry once."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import BackendUnavailable
from agent_reach.registry.redis import RedisRegistry
from tests.support import REDIS_URL, drop_prefix, until

# how long a registry takes to find Redis away, or back (its sync loop retries at most 2 s
# apart; the outages here last well under a second, so its waits stay short)
NOTICE_S = 3.0


class RelayedConnection:
    """One client connection through a :class:`Relay`."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.subscribed = False  # the client sent a SUBSCRIBE on it
        self.pings = 0  # chunks the client sent with a PING in them


class Relay:
    """A TCP relay to the real Redis that can be cut (every connection through it dropped,
    new ones refused) and mended on the same port, or frozen (connections stay open, nothing
    goes through: a call times out, and what it sent goes on when thawed), all of it or only
    the subscriptions open now (a quiet connection a NAT dropped: the others, and new ones,
    go on)."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.host, self.target_port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.db = parts.path or "/0"
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections: list[RelayedConnection] = []
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}{self.db}"

    async def mend(self) -> None:
        """Listen (again), on the port of the first time."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Refuse new connections and drop those open."""
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        pipes, self._pipes = list(self._pipes), set()
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()
        for connection in self.connections:
            connection.flowing.set()

    def freeze_subscriptions(self) -> int:
        """Freeze the connections open now that subscribed to a channel; return how many."""
        frozen = [c for c in self.connections if c.subscribed]
        for connection in frozen:
            connection.flowing.clear()
        return len(frozen)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            upstream_reader, upstream = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            return
        self._writers.add(upstream)
        connection = RelayedConnection()
        self.connections.append(connection)
        for source, sink in ((reader, upstream), (upstream_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink, connection, source is reader))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        connection: RelayedConnection,
        from_client: bool,
    ) -> None:
        # a connection reset or closed by the other side ends the pipe: that is the outage
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if from_client and b"SUBSCRIBE" in data:
                    connection.subscribed = True
                if from_client and b"PING" in data:
                    connection.pings += 1
                await self._flowing.wait()
                await connection.flowing.wait()
                sink.write(data)
                await sink.drain()
        sink.close()
        self._writers.discard(sink)


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    made = Relay(REDIS_URL)
    await made.mend()
    yield made
    if made._server is not None:
        await made.cut()


@pytest.fixture
async def views(relay: Relay) -> AsyncIterator[Callable[..., RedisRegistry]]:
    """Registries on one fresh prefix: through the relay (``relayed=True``) or straight to
    Redis; closed (and the prefix dropped) afterwards."""
    prefix = f"test-{secrets.token_hex(6)}"
    made: list[RedisRegistry] = []

    def make(*, relayed: bool = True, **kwargs: Any) -> RedisRegistry:
        kwargs.setdefault("sync_s", 0.05)
        url = relay.url if relayed else REDIS_URL
        registry = RedisRegistry(url, prefix=prefix, connect_timeout_s=0.5, **kwargs)
        registry.bind(time.monotonic)
        made.append(registry)
        return registry

    yield make
    relay.thaw()  # a test that failed frozen: close() need not wait for timeouts
    for registry in made:
        await registry.close()
    drop_prefix(prefix)


def rec(name: str, caps: tuple[str, ...] = ("t.a",)) -> EndpointRecord:
    now = time.monotonic()
    return EndpointRecord(f"agent://{name}", caps, f"http://127.0.0.1:9/{name}", "", now, 0.0)


def in_redis(prefix: str) -> set[str]:
    """The ids Redis holds now (its last-seen set)."""
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        return set(r.zrange("{" + prefix + "}:seen", 0, -1))


def ids_of(registry: RedisRegistry) -> set[str]:
    return {r.endpoint_id for r in registry.records()}


async def away(relay: Relay, registry: RedisRegistry) -> None:
    """Cut the relay and wait until the registry knows Redis is away."""
    await relay.cut()
    await until(lambda: not registry.state().available, NOTICE_S, "Redis found away")


async def back(relay: Relay, registry: RedisRegistry) -> None:
    """Mend the relay and wait until the registry wrote everything it buffered."""
    await relay.mend()
    await until(
        lambda: registry.state().available and not registry._buffer.writes,
        NOTICE_S,
        "Redis found back and the buffer written",
    )


async def test_a_removal_of_an_id_redis_never_had_cancels_its_buffered_registration(
    relay: Relay, views: Callable[..., RedisRegistry]
) -> None:
    a, b = views(), views(relayed=False)
    await a.start()
    await b.start()
    await a.upsert(rec("kept"))
    await a.upsert(rec("removed-meanwhile"))
    await until(lambda: len(b) == 2, 1.0, "b sees both")
    await away(relay, a)
    for i in range(2000):  # registered and removed again while Redis is away
        await a.upsert(rec(f"churn-{i}"))
        assert await a.remove(f"agent://churn-{i}") is not None
    await a.upsert(rec("new-meanwhile"))
    assert await a.remove("agent://removed-meanwhile") is not None  # Redis holds it
    # nothing buffered for the churn: its ids were never in Redis
    assert set(a._buffer.writes) == {"agent://new-meanwhile", "agent://removed-meanwhile"}
    assert a._buffer.writes["agent://removed-meanwhile"] is None
    assert ids_of(a) == {"agent://kept", "agent://new-meanwhile"}
    await back(relay, a)
    assert in_redis(a.prefix) == {"agent://kept", "agent://new-meanwhile"}
    await until(lambda: ids_of(b) == ids_of(a), 1.0, "b follows")


async def test_a_registration_that_timed_out_is_still_removed(
    relay: Relay, views: Callable[..., RedisRegistry]
) -> None:
    """A write that went to Redis and timed out may land later: its id is not new to Redis,
    and a removal of it is buffered and written after it."""
    a = views()
    await a.start()
    relay.freeze()
    assert a.state().available  # the write below is sent, not buffered at once
    await a.upsert(rec("late"))  # times out (0.5 s): buffered
    assert not a.state().available
    assert await a.remove("agent://late") is not None
    assert a._buffer.writes == {"agent://late": None}
    relay.thaw()  # the write goes on to Redis now
    await until(lambda: "agent://late" in in_redis(a.prefix), 1.0, "the late write landed")
    await until(lambda: not a._buffer.writes, NOTICE_S, "the removal written")
    assert in_redis(a.prefix) == set()


async def test_past_its_bound_the_buffer_refuses_writes_of_more_ids(
    relay: Relay, views: Callable[..., RedisRegistry]
) -> None:
    a = views(max_buffered=3)
    await a.start()
    await a.upsert(rec("known"))
    await away(relay, a)
    for name in ("n1", "n2", "n3"):
        await a.upsert(rec(name))
    with pytest.raises(BackendUnavailable, match="the most this gateway buffers"):
        await a.upsert(rec("n4"))
    assert a.get("agent://n4") is None  # nothing changed
    with pytest.raises(BackendUnavailable):  # a removal to buffer: refused too
        await a.remove("agent://known")
    assert a.get("agent://known") is not None
    assert a.buffer_refused == 2
    await a.upsert(rec("n1", ("t.again",)))  # an id buffered already: taken
    assert await a.remove("agent://n2") is not None  # cancels n2's registration: room for one
    await a.upsert(rec("n4"))
    assert len(a._buffer.writes) == 3
    await back(relay, a)
    assert in_redis(a.prefix) == {"agent://known", "agent://n1", "agent://n3", "agent://n4"}
    await a.upsert(rec("n5"))  # Redis answers: no bound in the way
    assert a.buffer_refused == 2


async def test_two_flushes_at_once_write_each_buffered_entry_once(
    relay: Relay, views: Callable[..., RedisRegistry]
) -> None:
    """The flush loop and the sync loop both flush the buffer: one waits for the other."""
    a = views(sync_s=3600.0)  # the loops stay out of it: the test runs both flushes
    await a.start()
    await relay.cut()
    for i in range(20):
        await a.upsert(rec(f"n{i}"))
    assert len(a._buffer.writes) == 20
    await relay.mend()
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
        seq_key = "{" + a.prefix + "}:seq"
        before = int(r.get(seq_key) or 0)
        flush = a._buffer.flush
        await asyncio.gather(
            flush(a._store, a._versions, a._now), flush(a._store, a._versions, a._now)
        )
        assert int(r.get(seq_key) or 0) - before == 20  # one version each
    assert not a._buffer.writes
    assert len(in_redis(a.prefix)) == 20
