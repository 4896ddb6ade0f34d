"""Redis I/O of the shared registry: the key layout, the scripts, and Redis's clock.

Layout (every key under the hash tag ``{PREFIX}``, so one slot holds them all and the scripts
also run on Redis Cluster)::

    {P}:ep:ID     hash   caps (JSON list), url, desc, owner (token mode), at (Redis time the
                         registration was made)
    {P}:seen      zset   ID -> last heartbeat, in Redis server time (unix seconds)
    {P}:ver       hash   ID -> version of its current registration (live ids only)
    {P}:seq       string the last version given; registrations and removals share it
    {P}:epoch     string a token set once: if it vanishes, Redis lost its data
    {P}:reset     string set (expiring) when a gateway found the token gone: the reset window
    {P}:gone:ID   string a removal's tombstone, left only in the reset window (expiring)
    {P}:events    pub/sub channel of registrations ('u') and removals ('r'), with versions
    {P}:map:NAME  hash   a SharedMap's keys and values
    {P}:claim:NAME:KEY   string  one ClaimMap entry, with its TTL (PX) in Redis

Invariants:

- **The only module that talks to Redis.** Every redis-py exception (and ``OSError``) raised
  by a call here becomes :class:`~agent_reach.errors.BackendUnavailable` (``raise ... from``);
  a bad URL is a :class:`~agent_reach.errors.ConfigError` when the store is made.
- **Bounded by the live ids.** ``{P}:ep:*``, ``{P}:seen`` and ``{P}:ver`` hold one entry per
  registered id and nothing else (the scripts keep them in step, see
  :mod:`~agent_reach.registry.redis.scripts`); a full read (:meth:`RedisStore.snapshot`) costs
  what is registered now, not what ever was. Tombstones exist only for removals made in a reset
  window (by a gateway that has not seen Redis's current epoch token, or while the reset key
  lives) and expire :data:`RESET_WINDOW_S` after they were left.
- **One time source.** Last-seen times in Redis are Redis's ``TIME``. Every read that measures
  (:meth:`RedisStore.snapshot`, :meth:`RedisStore.heartbeats`) runs ``TIME`` in the same
  transaction, bracketed by two reads of the liveness clock, and updates :attr:`offset`
  (Redis time minus liveness time), through which every record read here is mapped.
- **A dead subscription fails, within a bound.** The channel is read on a connection of its
  own, from a client that never retries (redis-py's default retry reconnects and resubscribes
  inside a read, silently, and the notices sent in between are lost with nothing to say so),
  and a quiet connection is probed: nothing heard for ``idle_s``, a PING goes out; nothing
  heard within the socket timeout (``connect_timeout_s``, as for any call) of a PING,
  :meth:`EventStream.next` raises ``BackendUnavailable``; a stream is entered only once Redis
  confirmed the SUBSCRIBE (within that timeout too), so every notice published after that
  reaches it. A NAT or load balancer that
  drops an idle connection leaves the socket open and silent, which no read reports (and
  redis-py's ``health_check_interval`` only sends a PING on a subscription, it never waits
  for the answer); the probes also keep such a connection from ever being idle that long.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import BackendUnavailable, ConfigError, EndpointHeld
from agent_reach.registry.base import registry_full
from agent_reach.registry.redis.scripts import CLAIM, INIT, REMOVE, RENEW, TOUCH, UPSERT
from agent_reach.settings import redacted

__all__ = [
    "RESET_WINDOW_S",
    "EventStream",
    "Fetched",
    "Heartbeats",
    "RedisStore",
    "Snapshot",
    "key_prefix",
]

# How long after a gateway found Redis emptied removals leave tombstones (and the tombstones
# live), so that no gateway's re-publication brings a removed id back: longer than any gateway
# takes to notice (its next sync, or its return from a partition of up to this long).
RESET_WINDOW_S = 300.0
_RESET_WINDOW_MS = str(round(RESET_WINDOW_S * 1000))


def key_prefix(prefix: str) -> str:
    """The hash-tagged key prefix of a network; ConfigError for an unusable ``prefix``."""
    if not prefix or any(c in prefix for c in "{}\r\n \t"):
        raise ConfigError(
            f"registry prefix must be non-empty, without braces or spaces: {prefix!r}"
        )
    return "{" + prefix + "}"


class Snapshot(NamedTuple):
    """The whole registry as Redis held it at one instant (one transaction)."""

    redis_now: float
    seen: dict[str, float]  # id -> last heartbeat, Redis time
    versions: dict[str, int]  # id -> version of its registration
    epoch: str | None
    seq: int  # the last version given: every change up to it is in this snapshot


class Heartbeats(NamedTuple):
    """The heartbeats written since a time, as Redis held them at one instant."""

    redis_now: float
    fresh: list[tuple[str, float]]  # (id, last heartbeat in Redis time)
    epoch: str | None
    seq: int  # the last version given


class Fetched(NamedTuple):
    """One record read from Redis, with the version of its registration."""

    record: EndpointRecord
    version: int


class RedisSharedMap:
    """A :class:`~agent_reach.registry.base.SharedMap` as one Redis hash."""

    def __init__(self, client: Any, key: str, io: Callable[[], Any]) -> None:
        self._redis, self.key, self._io = client, key, io

    async def get(self, key: str) -> str | None:
        with self._io():
            value: str | None = await self._redis.hget(self.key, key)
        return value

    async def put(self, key: str, value: str) -> None:
        with self._io():
            await self._redis.hset(self.key, key, value)

    async def delete(self, key: str) -> None:
        with self._io():
            await self._redis.hdel(self.key, key)

    async def items(self) -> dict[str, str]:
        with self._io():
            found: dict[str, str] = await self._redis.hgetall(self.key)
        return found


class RedisClaimMap:
    """A :class:`~agent_reach.registry.base.ClaimMap` as one Redis key per entry (``PREFIX``
    then the entry's key), each with its TTL in Redis: Redis forgets an expired entry itself,
    and a claim is the :data:`~agent_reach.registry.redis.scripts.CLAIM` script (one step).
    One key per entry rather than a hash because a hash field's own TTL (HEXPIRE) needs
    Redis 7.4, and the registry runs on older servers too."""

    def __init__(self, client: Any, prefix: str, script: Any, io: Callable[[], Any]) -> None:
        self._redis, self.prefix, self._claim, self._io = client, prefix, script, io

    async def get(self, key: str) -> str | None:
        with self._io():
            value: str | None = await self._redis.get(self.prefix + key)
        return value

    async def claim(self, key: str, value: str, ttl_s: float) -> str:
        ttl_ms = max(1, round(ttl_s * 1000))
        with self._io():
            held: str = await self._claim(keys=[self.prefix + key], args=[value, ttl_ms])
        return held

    async def delete(self, key: str) -> None:
        with self._io():
            await self._redis.delete(self.prefix + key)


class RedisStore:
    """The keys of one network (``prefix``) on one Redis (``url``, a redis-py URL)."""

    def __init__(self, url: str, prefix: str, *, connect_timeout_s: float) -> None:
        p = key_prefix(prefix)
        self.url, self.prefix = url, prefix
        self.timeout_s = connect_timeout_s  # a call, or a PING on the channel, failed past it
        self.seen_key, self.ver_key, self.seq_key = f"{p}:seen", f"{p}:ver", f"{p}:seq"
        self.epoch_key, self.channel = f"{p}:epoch", f"{p}:events"
        self.reset_key = f"{p}:reset"
        self._ep, self._gone = f"{p}:ep:", f"{p}:gone:"
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": connect_timeout_s,
            "socket_connect_timeout": connect_timeout_s,
            "retry_on_timeout": False,
        }
        try:
            self._redis = aioredis.Redis.from_url(url, **options)
            # the subscription's own: a failure must end the stream, not be retried inside it
            self._subscriber = aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)
        except ValueError as exc:
            raise ConfigError(f"unusable registry URL {redacted(url)!r}: {exc}") from exc
        self._upsert = self._redis.register_script(UPSERT)
        self._remove = self._redis.register_script(REMOVE)
        self._touch = self._redis.register_script(TOUCH)
        self._init = self._redis.register_script(INIT)
        self._claim = self._redis.register_script(CLAIM)
        self._renew = self._redis.register_script(RENEW)
        self.now: Callable[[], float] = _unbound  # the liveness clock (set by the registry)
        self.offset: float | None = None  # Redis time - liveness time, from the last measure
        self.last_sync: float | None = None  # liveness time of the last measure
        # the epoch token as this gateway last saw it (kept by the view's sync): a removal
        # made by a gateway that has not seen the token Redis holds now leaves a tombstone
        self.epoch: str | None = None

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        try:
            yield
        except (RedisError, OSError) as exc:
            raise BackendUnavailable(f"redis at {redacted(self.url)}: {exc}") from exc

    def shared_map(self, name: str) -> RedisSharedMap:
        """The hash ``PREFIX:map:NAME``."""
        return RedisSharedMap(self._redis, f"{key_prefix(self.prefix)}:map:{name}", self._io)

    def claim_map(self, name: str) -> RedisClaimMap:
        """The keys ``PREFIX:claim:NAME:KEY``, one per entry."""
        prefix = f"{key_prefix(self.prefix)}:claim:{name}:"
        return RedisClaimMap(self._redis, prefix, self._claim, self._io)

    def _keys(self, endpoint_id: str) -> list[str]:
        return [
            self._ep + endpoint_id,
            self.seen_key,
            self.ver_key,
            self.channel,
            self.seq_key,
            self._gone + endpoint_id,
        ]

    # --- writes ----------------------------------------------------------------------------

    async def init(self) -> int:
        """Set the epoch token if there is none, and start the version counter (once per
        prefix: deletes the versions an older release kept of removed ids; returns how many)."""
        with self._io():
            await self._redis.set(self.epoch_key, secrets.token_hex(8), nx=True)
            keys = [self.seen_key, self.ver_key, self.seq_key]
            return int(await self._init(keys=keys, args=[]))

    async def upsert(
        self,
        record: EndpointRecord,
        *,
        fresh: bool,
        held_within_s: float | None = None,
        max_records: int | None = None,
        again: bool = False,
    ) -> int:
        """Write ``record`` with its last-seen time in Redis time (Redis's ``TIME`` before the
        offset is known); return its version. ``fresh``: a registration, which sets the time;
        else a buffered one written late, which never moves a newer time back, and is not
        written (0) when the id was registered after ``record.last_seen`` (the time the
        registration was made) through another gateway. ``again``: a
        re-publication after Redis lost its data, written only when Redis has nothing of the
        id (neither a record nor a tombstone); 0 when it was not written. ``held_within_s``:
        refuse (EndpointHeld) when another live registration holds the id. ``max_records``:
        refuse a new id (RegistryFull) when that many are registered."""
        ts = "" if self.offset is None else f"{record.last_seen + self.offset:.6f}"
        args = [
            record.endpoint_id,
            json.dumps(list(record.capabilities)),
            record.endpoint_url,
            record.description,
            ts,
            "" if fresh else "GT",
            record.owner,
            "" if held_within_s is None else f"{held_within_s:.6f}",
            "" if max_records is None else str(max_records),
            "again" if again else "",
        ]
        with self._io():
            first, second = await self._upsert(keys=self._keys(record.endpoint_id), args=args)
        if first == "skip":
            return 0
        if first == "held":
            raise EndpointHeld(record.endpoint_id)
        if first == "full":
            raise registry_full(record.endpoint_id, second, max_records or 0)
        return int(second)

    async def remove(
        self, endpoint_id: str, *, made: float | None = None, owner: str | None = None
    ) -> tuple[int, EndpointRecord | None]:
        """Delete the id; return the removal's version and the record removed, or
        ``(0, None)`` when it was not registered (then nothing was written, but a tombstone in
        the reset window). ``made``: when a removal written late (buffered) was made, on the
        liveness clock: not written when the id was registered after that. ``owner``: remove
        only a record of that owner; EndpointHeld, nothing written, when Redis holds one of
        another (a registration made since through another gateway)."""
        at = "" if made is None or self.offset is None else f"{made + self.offset:.6f}"
        keys = [*self._keys(endpoint_id), self.epoch_key, self.reset_key]
        args = [endpoint_id, _RESET_WINDOW_MS, at, self.epoch or "", owner or ""]
        with self._io():
            out = await self._remove(keys=keys, args=args)
        if not out:
            return 0, None
        if out[0] == "held":
            raise EndpointHeld(endpoint_id)
        version, seen, *flat = out
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        record = None if self.offset is None else self.record(endpoint_id, fields, float(seen))
        return int(version), record

    async def touch(self, endpoint_ids: Sequence[str]) -> None:
        """A heartbeat, now in Redis time, for each id still registered."""
        with self._io():
            await self._touch(keys=[self.seen_key], args=list(endpoint_ids))

    async def renew_epoch(self) -> str | None:
        """Set a new epoch token unless one is there, and open (or extend) the reset window;
        return the token Redis holds."""
        keys = [self.epoch_key, self.reset_key]
        with self._io():
            token = await self._renew(keys=keys, args=[secrets.token_hex(8), _RESET_WINDOW_MS])
        return None if token is None else str(token)

    # --- reads -----------------------------------------------------------------------------

    async def measure_offset(self) -> None:
        """Measure :attr:`offset` again (Redis's ``TIME`` between two reads of the liveness
        clock), and only that: no read of the registry, so :attr:`last_sync` stays."""
        t0 = self.now()
        with self._io():
            secs, micros = await self._redis.time()
        t1 = self.now()
        self.offset = secs + micros / 1e6 - (t0 + t1) / 2

    async def _measure(self, commands: Callable[[Any], object]) -> list[Any]:
        """Run ``TIME`` and ``commands`` in one transaction; update the clock offset."""
        t0 = self.now()
        with self._io():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.time()
                commands(pipe)
                results: list[Any] = await pipe.execute()
        t1 = self.now()
        secs, micros = results[0]
        redis_now = secs + micros / 1e6
        self.offset = redis_now - (t0 + t1) / 2
        self.last_sync = t1
        return [redis_now, *results[1:]]

    async def heartbeats(self, since: float) -> Heartbeats:
        """The heartbeats at or after ``since`` (Redis time), in one transaction."""
        seen, epoch, seq = self.seen_key, self.epoch_key, self.seq_key
        redis_now, fresh, token, last = await self._measure(
            lambda p: (
                p.zrangebyscore(seen, since, "+inf", withscores=True),
                p.get(epoch),
                p.get(seq),
            )
        )
        return Heartbeats(
            redis_now,
            [(str(i), float(ts)) for i, ts in fresh],
            None if token is None else str(token),
            int(last or 0),
        )

    async def snapshot(self) -> Snapshot:
        """Every registered id with its last heartbeat and version, in one transaction."""
        redis_now, seen, versions, epoch, seq = await self._measure(
            lambda p: (
                p.zrange(self.seen_key, 0, -1, withscores=True),
                p.hgetall(self.ver_key),
                p.get(self.epoch_key),
                p.get(self.seq_key),
            )
        )
        return Snapshot(
            redis_now,
            {str(i): float(ts) for i, ts in seen},
            {str(i): int(v) for i, v in versions.items()},
            None if epoch is None else str(epoch),
            int(seq or 0),
        )

    async def fetch(self, endpoint_ids: Sequence[str]) -> list[Fetched | None]:
        """The records of ``endpoint_ids`` as Redis holds them now (None: not registered)."""
        if not endpoint_ids:
            return []
        with self._io():
            async with self._redis.pipeline(transaction=True) as pipe:
                for endpoint_id in endpoint_ids:
                    pipe.hgetall(self._ep + endpoint_id)
                    pipe.zscore(self.seen_key, endpoint_id)
                    pipe.hget(self.ver_key, endpoint_id)
                results: list[Any] = await pipe.execute()
        out: list[Fetched | None] = []
        for i, endpoint_id in enumerate(endpoint_ids):
            fields, score, version = results[3 * i : 3 * i + 3]
            if not fields or score is None or self.offset is None:
                out.append(None)
            else:
                record = self.record(endpoint_id, fields, float(score))
                out.append(Fetched(record, int(version or 0)))
        return out

    def record(self, endpoint_id: str, fields: Mapping[str, Any], ts: float) -> EndpointRecord:
        """The record of the fields of ``{P}:ep:ID`` (or of an event) seen at ``ts`` (Redis
        time), on the liveness clock."""
        assert self.offset is not None
        return EndpointRecord(
            endpoint_id,
            tuple(json.loads(fields["caps"])),
            fields["url"],
            fields.get("desc", ""),
            ts - self.offset,
            ts,
            fields.get("owner", ""),
        )

    def events(self, *, idle_s: float) -> EventStream:
        """The registry's channel: ``async with store.events(idle_s=...) as events: await
        events.next(wait_s)``; probed with a PING after ``idle_s`` of quiet, and failed when
        nothing answers within :attr:`timeout_s`."""
        return EventStream(self, idle_s=idle_s, answer_s=self.timeout_s)

    async def close(self) -> None:
        """Close the connections (never raises for a Redis already gone)."""
        for client in (self._redis, self._subscriber):
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()


class EventStream:
    """A subscription to the registry's channel, for one connection's lifetime (see the
    module's invariants: it fails on a dead connection, silent or not)."""

    def __init__(self, store: RedisStore, *, idle_s: float, answer_s: float) -> None:
        self._store, self._idle_s, self._answer_s = store, idle_s, answer_s
        # the subscribe confirmation is kept: entering waits for it
        self._pubsub = store._subscriber.pubsub()
        self._heard = 0.0  # liveness time when the connection last delivered anything
        self._asked: float | None = None  # when the unanswered PING was sent

    async def __aenter__(self) -> EventStream:
        try:
            with self._store._io():
                await self._pubsub.subscribe(self._store.channel)
                # Redis answers the SUBSCRIBE before any message of the channel
                confirmed = await self._pubsub.get_message(timeout=self._answer_s)
            if confirmed is None or confirmed.get("type") != "subscribe":
                raise BackendUnavailable(
                    f"redis at {redacted(self._store.url)}: no answer to SUBSCRIBE"
                    f" within {self._answer_s} s"
                )
        except BaseException:
            await self.__aexit__()
            raise
        self._heard = self._store.now()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self._pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]

    async def next(self, wait_s: float) -> str | None:
        """The next message's data, or None when none came within ``wait_s`` seconds (or
        sooner: a probe was due). BackendUnavailable when the connection failed, or when
        nothing was heard within ``answer_s`` of a PING."""
        now = self._store.now()
        if self._asked is None and now - self._heard >= self._idle_s:
            with self._store._io():
                await self._pubsub.ping()
            self._asked = now
        if self._asked is None:
            due = self._heard + self._idle_s
        else:
            due = self._asked + self._answer_s
            if now >= due:
                raise BackendUnavailable(
                    f"redis at {redacted(self._store.url)}: the event subscription is silent"
                    f" (nothing heard for {now - self._heard:.1f} s, no answer to a PING"
                    f" within {self._answer_s} s)"
                )
        # a floor: a read given no time at all could be interrupted halfway through a message
        wait_s = max(min(wait_s, due - now), 0.01)
        with self._store._io():
            message = await self._pubsub.get_message(timeout=wait_s)
        if message is None:
            return None
        self._heard, self._asked = self._store.now(), None  # anything heard proves the link
        if message.get("type") != "message":
            return None  # a PING's answer
        return str(message["data"])


def _unbound() -> float:
    raise RuntimeError("RedisRegistry.bind(now) was not called: the gateway binds its clock")
