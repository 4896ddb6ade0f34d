"""The shared registry on Redis (``redis://HOST:PORT/DB``): many gateways, one address book.

Layout (every key under the hash tag ``{PREFIX}``, so one slot holds them all and the scripts
also run on Redis Cluster)::

    {P}:ep:ID     hash   caps (JSON list), url, desc, owner (token mode: the registration)
    {P}:seen      zset   ID -> last heartbeat, in Redis server time (unix seconds)
    {P}:ver       hash   ID -> version, bumped by every registration and removal
    {P}:epoch     string a token set once: if it vanishes, Redis lost its data
    {P}:events    pub/sub channel of registrations and removals

Invariants:

- **One time source.** Every last-seen time written to Redis is Redis's own ``TIME``, taken
  inside the script that writes it, so no gateway's clock is ever compared with another's. Each
  gateway maps Redis time to its own liveness clock with an offset measured at every sync
  (``TIME`` bracketed by two local reads), so skewed or stepped gateway clocks cannot make an
  agent look dead or alive. Statuses are then derived locally, the same way everywhere.
- **No Redis round trip on a route decision.** Routing reads the local view (a
  :class:`~agent_reach.registry.memory.MemoryRegistry`). Registrations and removals reach other
  gateways by pub/sub (milliseconds); heartbeats are written in pipelined batches every
  ``flush_s`` and read by every gateway every ``sync_s`` (only those newer than its cursor); a
  full reconcile every ``reconcile_s`` (and after any reconnect) repairs whatever pub/sub
  missed. A view is stale by at most ``flush_s + sync_s`` for a heartbeat and ``reconcile_s``
  for a lost notification (:data:`STALENESS_BOUND_S` with the defaults).
- **Redis away.** Writes go to the local view first, so routing goes on; what could not be
  written is buffered (latest registration or removal per id, heartbeats as a set of ids) and
  written when Redis answers again, then a full reconcile runs. Once Redis is known to be away,
  writes are buffered without trying it (no caller waits for a timeout). :meth:`state` says
  whether Redis is reachable (for ``/healthz`` and a metric) and a log line marks each
  transition. No purge runs from a view that may miss heartbeats: while Redis is away, for
  ``PURGE_GRACE_S`` after it returns (the others write what they buffered), and never for
  records seen within the purge time before the view's last sync.
- **Shutdown.** :meth:`close` ends the loops even when a cancellation is lost inside redis-py
  (Python 3.11's ``asyncio.wait_for`` drops one that coincides with the awaited result).
- **Redis emptied** (restarted without persistence): the epoch token is gone; every gateway
  re-publishes the records it knows, with their last-seen times (never newer), and agents that
  heartbeat into the gap get ``endpoint_not_registered`` nowhere because the gateway's own view
  still knows them.
- Delivery latency statistics stay local to each gateway (each sees its own deliveries).

Every redis-py exception is caught here: nothing from redis leaks past this adapter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import EndpointHeld
from agent_reach.observability.logs import log
from agent_reach.registry._redis_scripts import REMOVE, TOUCH, UPSERT
from agent_reach.registry.base import RegistryListener, RegistryState
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import redacted

__all__ = ["STALENESS_BOUND_S", "RedisRegistry"]

FLUSH_S = 0.05  # heartbeats are written in one pipelined batch at most this often
SYNC_S = 0.2  # every gateway reads newer heartbeats this often
RECONCILE_S = 30.0  # full comparison of view and Redis (repairs lost notifications)
STALENESS_BOUND_S = FLUSH_S + SYNC_S  # a heartbeat seen elsewhere after at most this (+ RTT)
RESYNC_EPS_S = 0.1  # a heartbeat read back less than this newer than the view is not applied
CURSOR_OVERLAP_S = 0.1  # re-read this much before the cursor (a stepped Redis clock, races)
RETRY_MAX_S = 2.0  # longest wait between attempts to reach Redis again
CLOSE_WAIT_S = 2.0  # how long close() waits for a background loop to end, per attempt
# no purge for this long after Redis returns: the other gateways write the heartbeats they
# buffered meanwhile (they retry at most RETRY_MAX_S apart)
PURGE_GRACE_S = 10.0


def _key_prefix(prefix: str) -> str:
    if not prefix or any(c in prefix for c in "{}\r\n "):
        raise ValueError(f"registry prefix must be non-empty, without braces or spaces: {prefix!r}")
    return "{" + prefix + "}"


class RedisRegistry:
    """A :class:`~agent_reach.registry.base.RegistryBackend` shared through Redis.

    ``url`` is a redis-py URL (``redis://``, ``rediss://``, ``unix://``); ``prefix`` keeps
    several agent networks apart on one Redis. ``now`` (set by :meth:`bind`) is the gateway's
    liveness clock: every record's ``last_seen`` in the view is on it.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "agent-reach",
        flush_s: float = FLUSH_S,
        sync_s: float = SYNC_S,
        reconcile_s: float = RECONCILE_S,
        connect_timeout_s: float = 2.0,
    ) -> None:
        p = _key_prefix(prefix)
        self.url, self.prefix = url, prefix
        self._keys = (f"{p}:seen", f"{p}:ver", f"{p}:events", f"{p}:epoch")
        self._ep = f"{p}:ep:"
        self.flush_s, self.sync_s, self.reconcile_s = flush_s, sync_s, reconcile_s
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=connect_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry_on_timeout=False,
        )
        self._upsert_script = self._redis.register_script(UPSERT)
        self._remove_script = self._redis.register_script(REMOVE)
        self._touch_script = self._redis.register_script(TOUCH)
        self._view = MemoryRegistry()
        self._versions: dict[str, int] = {}
        self._now: Callable[[], float] = _unbound
        self._offset: float | None = None  # Redis time - liveness time
        self._cursor = 0.0  # Redis time up to which heartbeats were read
        self._epoch: str | None = None
        self._pending_writes: dict[str, EndpointRecord | None] = {}  # None: a removal
        self._pending_beats: dict[str, None] = {}
        self._wake_flush = asyncio.Event()
        self._reconcile_due = True
        self._available = True
        self._view_stale = False  # Redis was away and no reconcile has run since
        self._no_purge_until = 0.0  # liveness time: PURGE_GRACE_S after Redis returned
        self._down_since: float | None = None
        self._last_sync: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # --- lifecycle -------------------------------------------------------------------------

    def bind(self, now: Callable[[], float]) -> None:
        self._now = now
        self._view.bind(now)  # the view's last_seen are on it: it checks held_within_s itself

    async def start(self) -> None:
        """Connect, load the whole registry into the view, and start the background loops.

        Raises ``ConnectionError`` (the builtin, with the URL) when Redis cannot be reached: a
        gateway does not start on a registry it has never seen.
        """
        if self._tasks:
            return
        try:
            await self._redis.set(self._keys[3], secrets.token_hex(8), nx=True)
            await self._reconcile()
        except RedisError as exc:
            await self._redis.aclose()
            raise ConnectionError(f"cannot reach the registry at {self.url}: {exc}") from exc
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="registry-flush"),
            asyncio.create_task(self._sync_loop(), name="registry-sync"),
            asyncio.create_task(self._listen_loop(), name="registry-listen"),
        ]
        log(
            logging.INFO,
            "registry.started",
            url=redacted(self.url),
            prefix=self.prefix,
            records=len(self),
        )

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        self._closing = True  # a loop whose cancellation got lost in a client library ends too
        pending = set(tasks)
        for _ in range(3):
            for task in pending:
                task.cancel()
            if not pending:
                break
            _, pending = await asyncio.wait(pending, timeout=CLOSE_WAIT_S)
        if pending:
            log(
                logging.ERROR, "registry.close_timeout", tasks=sorted(t.get_name() for t in pending)
            )
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log(
                    logging.ERROR,
                    "registry.loop_failed",
                    task=task.get_name(),
                    error=repr(task.exception()),
                )
        if tasks and self._available:
            with contextlib.suppress(RedisError, OSError):
                await self._flush()  # the last heartbeats, best effort
        await self._redis.aclose()

    def state(self) -> RegistryState:
        now = self._now() if self._now is not _unbound else None
        age = None if now is None or self._last_sync is None else max(0.0, now - self._last_sync)
        detail = (
            "redis reachable" if self._available else "redis unreachable: routing on the last view"
        )
        return RegistryState("redis", self._available, detail, age)

    # --- the view (no I/O) -----------------------------------------------------------------

    def subscribe(self, listener: RegistryListener) -> None:
        self._view.subscribe(listener)

    def get(self, endpoint_id: str) -> EndpointRecord | None:
        return self._view.get(endpoint_id)

    def by_intent(self, intent: str) -> Collection[str]:
        return self._view.by_intent(intent)

    def intents(self) -> Collection[str]:
        return self._view.intents()

    def records(self) -> Iterable[EndpointRecord]:
        return self._view.records()

    def __len__(self) -> int:
        return len(self._view)

    # --- writes ----------------------------------------------------------------------------

    async def upsert(
        self, record: EndpointRecord, *, held_within_s: float | None = None
    ) -> EndpointRecord | None:
        if held_within_s is not None and self._available:
            # checked and written in Redis in one step, before the view changes: a refusal
            # leaves everything as it was
            try:
                await self._write_upsert(record, fresh=True, held_within_s=held_within_s)
            except RedisError as exc:
                self._lost(exc)  # checked on the view below, and written when Redis is back
            else:
                before = await self._view.upsert(record)
                self._pending_writes.pop(record.endpoint_id, None)
                return before
            # Redis away: this gateway's view decides (what it cannot see is not checked)
        before = await self._view.upsert(record, held_within_s=held_within_s)
        self._pending_writes.pop(record.endpoint_id, None)
        if not self._available:
            # known to be away: buffer at once rather than make the caller wait for a
            # connection or a timeout (up to connect_timeout_s on a partition); the background
            # loops write it when Redis answers again
            self._pending_writes[record.endpoint_id] = record
            return before
        try:
            await self._write_upsert(record, fresh=True)
        except RedisError as exc:
            self._pending_writes[record.endpoint_id] = record
            self._lost(exc)
        return before

    async def touch(
        self, endpoint_id: str, last_seen: float, last_seen_at: float
    ) -> EndpointRecord | None:
        after = await self._view.touch(endpoint_id, last_seen, last_seen_at)
        if after is not None:
            self._pending_beats[endpoint_id] = None
            if len(self._pending_beats) == 1:
                self._wake_flush.set()
        return after

    async def remove(self, endpoint_id: str) -> EndpointRecord | None:
        before = await self._view.remove(endpoint_id)
        self._pending_beats.pop(endpoint_id, None)
        self._pending_writes.pop(endpoint_id, None)
        if not self._available:  # as in upsert: buffered, written when Redis is back
            if before is not None:
                self._pending_writes[endpoint_id] = None
            return before
        try:
            if before is None:
                # known to Redis but perhaps not yet to this view (a registration on its way)
                before = await self._fetch_one(endpoint_id)
            ver = await self._remove_script(keys=self._keys_of(endpoint_id), args=[endpoint_id])
            # a tombstone: notifications of the registrations it removed are now stale
            self._versions[endpoint_id] = max(int(ver), self._versions.get(endpoint_id, 0))
        except RedisError as exc:
            if before is not None:
                self._pending_writes[endpoint_id] = None
            self._lost(exc)
        return before

    async def purge(self, seen_before: float) -> int:
        if self._view_stale or self._last_sync is None or self._now() < self._no_purge_until:
            # while Redis is away, and until the others have written what they buffered
            # meanwhile, this view misses the heartbeats other gateways take: an age read from
            # it is no reason to delete a record that they keep alive (and the removal would be
            # written when Redis is back)
            return 0
        # Nor while Redis is silent but not yet known to be away (a partition: up to the
        # socket timeout): the view has every heartbeat taken up to STALENESS_BOUND_S before
        # its last sync, so only records with no heartbeat for the whole purge time before
        # that are certainly dead.
        seen_before -= max(0.0, self._now() - self._last_sync) + STALENESS_BOUND_S
        purged = 0
        for record in list(self._view.records()):
            if record.last_seen < seen_before and await self.remove(record.endpoint_id):
                purged += 1
        return purged

    # --- Redis I/O -------------------------------------------------------------------------

    def _keys_of(self, endpoint_id: str) -> list[str]:
        seen, ver, events, _ = self._keys
        return [self._ep + endpoint_id, seen, ver, events]

    async def _write_upsert(
        self, record: EndpointRecord, *, fresh: bool, held_within_s: float | None = None
    ) -> None:
        """Write ``record`` with its last-seen time in Redis time (Redis's ``TIME`` before the
        offset is known). ``fresh``: a registration, which sets the time; else a re-published
        record, which never moves a newer time back. ``held_within_s``: refuse (EndpointHeld)
        when another live registration holds the id."""
        ts = "" if self._offset is None else f"{record.last_seen + self._offset:.6f}"
        caps = json.dumps(list(record.capabilities))
        mode = "" if fresh else "GT"
        args = [
            record.endpoint_id,
            caps,
            record.endpoint_url,
            record.description,
            ts,
            mode,
            record.owner,
            "" if held_within_s is None else f"{held_within_s:.6f}",
        ]
        first, ver = await self._upsert_script(keys=self._keys_of(record.endpoint_id), args=args)
        if first in ("held", b"held"):
            raise EndpointHeld(record.endpoint_id)
        self._versions[record.endpoint_id] = int(ver)
        self._healthy()

    async def _flush(self) -> None:
        """Write buffered registrations/removals, then the heartbeats of the last batch."""
        while self._pending_writes:
            endpoint_id, record = next(iter(self._pending_writes.items()))
            if record is None:
                await self._remove_script(keys=self._keys_of(endpoint_id), args=[endpoint_id])
            else:
                await self._write_upsert(record, fresh=False)
            self._pending_writes.pop(endpoint_id, None)
        if self._pending_beats:
            ids = list(self._pending_beats)
            await self._touch_script(keys=[self._keys[0]], args=ids)
            for endpoint_id in ids:
                self._pending_beats.pop(endpoint_id, None)
        self._healthy()

    async def _fetch_one(self, endpoint_id: str) -> EndpointRecord | None:
        fields = await self._redis.hgetall(self._ep + endpoint_id)
        score = await self._redis.zscore(self._keys[0], endpoint_id)
        if not fields or score is None or self._offset is None:
            return None
        return self._record(endpoint_id, fields, float(score))

    def _record(self, endpoint_id: str, fields: Mapping[Any, Any], ts: float) -> EndpointRecord:
        assert self._offset is not None
        return EndpointRecord(
            endpoint_id,
            tuple(json.loads(fields["caps"])),
            fields["url"],
            fields.get("desc", ""),
            ts - self._offset,
            ts,
            fields.get("owner", ""),
        )

    async def _measure(self, pipe_commands: Callable[[Any], object]) -> list[Any]:
        """Run ``TIME`` + the given commands atomically; update the clock offset."""
        t0 = self._now()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.time()
            pipe_commands(pipe)
            results: list[Any] = await pipe.execute()
        t1 = self._now()
        secs, micros = results[0]
        redis_now = secs + micros / 1e6
        self._offset = redis_now - (t0 + t1) / 2
        self._last_sync = t1
        return [redis_now, *results[1:]]

    async def _check_epoch(self, epoch: str | None) -> bool:
        """Whether Redis lost its data since the last look (then this view was re-published)."""
        if epoch is not None and (self._epoch is None or epoch == self._epoch):
            self._epoch = epoch
            return False
        # the token is gone (or replaced): Redis lost its data; put back what this view knows
        log(
            logging.WARNING,
            "registry.redis_reset",
            note="registry data lost in Redis; re-publishing this gateway's view",
            records=len(self._view),
        )
        await self._redis.set(self._keys[3], secrets.token_hex(8), nx=True)
        token = await self._redis.get(self._keys[3])
        self._epoch = None if token is None else str(token)
        # versions restart from 0 in an emptied Redis: the ones remembered from before would
        # make every notification of the new era look stale
        self._versions.clear()
        self._reconcile_due = True  # what was announced while it was away is unknown here
        for record in list(self._view.records()):
            self._pending_writes.setdefault(record.endpoint_id, record)
        await self._flush()
        return True

    async def _sync(self) -> None:
        """Read the heartbeats written since the cursor into the view."""
        seen = self._keys[0]
        cursor = max(0.0, self._cursor - CURSOR_OVERLAP_S)
        redis_now, fresh, epoch = await self._measure(
            lambda p: (p.zrangebyscore(seen, cursor, "+inf", withscores=True), p.get(self._keys[3]))
        )
        await self._check_epoch(epoch)
        self._cursor = redis_now
        assert self._offset is not None
        unknown = []
        for endpoint_id, ts in fresh:
            record = self._view.get(endpoint_id)
            if record is None:
                if endpoint_id not in self._pending_writes:
                    unknown.append(endpoint_id)
                continue
            local = ts - self._offset
            if local > record.last_seen + RESYNC_EPS_S:
                await self._view.touch(endpoint_id, local, ts)
        for endpoint_id in unknown:  # registered elsewhere, notification not (yet) seen
            record = await self._fetch_one(endpoint_id)
            if record is not None and self._view.get(endpoint_id) is None:
                await self._view.upsert(record)

    async def _reconcile(self) -> None:
        """Make the view equal to Redis (but for writes still buffered here)."""
        seen, ver = self._keys[0], self._keys[1]
        for _ in range(2):
            redis_now, scores, versions, epoch = await self._measure(
                lambda p: (
                    p.zrange(seen, 0, -1, withscores=True),
                    p.hgetall(ver),
                    p.get(self._keys[3]),
                )
            )
            if self._epoch is None:
                self._epoch = epoch
                break
            if not await self._check_epoch(epoch):
                break
            # Redis had lost its data and this view was just re-published: compare the view
            # with what Redis holds now, not with the empty set read before (which would
            # remove every record from the view)
        self._cursor = redis_now
        assert self._offset is not None
        in_redis = dict(scores)
        for record in list(self._view.records()):
            if (
                record.endpoint_id not in in_redis
                and record.endpoint_id not in self._pending_writes
            ):
                await self._view.remove(record.endpoint_id)
                self._versions.pop(record.endpoint_id, None)
        stale = [
            endpoint_id
            for endpoint_id in in_redis
            if endpoint_id not in self._pending_writes
            and (
                self._view.get(endpoint_id) is None
                or self._versions.get(endpoint_id) != int(versions.get(endpoint_id, 0))
            )
        ]
        if stale:
            async with self._redis.pipeline(transaction=False) as pipe:
                for endpoint_id in stale:
                    pipe.hgetall(self._ep + endpoint_id)
                hashes = await pipe.execute()
            for endpoint_id, fields in zip(stale, hashes, strict=True):
                if fields:
                    await self._view.upsert(
                        self._record(endpoint_id, fields, in_redis[endpoint_id])
                    )
                    self._versions[endpoint_id] = int(versions.get(endpoint_id, 0))
        for endpoint_id, ts in in_redis.items():
            current = self._view.get(endpoint_id)
            local = ts - self._offset
            if current is not None and local > current.last_seen + RESYNC_EPS_S:
                await self._view.touch(endpoint_id, local, ts)
        self._reconcile_due = False
        if self._view_stale:
            self._no_purge_until = self._now() + PURGE_GRACE_S
            self._view_stale = False
        self._healthy()

    async def _on_event(self, data: str) -> None:
        """A registration or removal announced by any gateway (this one included)."""
        try:
            event = json.loads(data)
            kind, endpoint_id = event[0], event[1]
        except (ValueError, IndexError, TypeError):
            log(logging.WARNING, "registry.bad_event", data=data[:200])
            return
        if kind == "r":
            version = int(event[2]) if len(event) > 2 else 0
            if self._versions.get(endpoint_id, 0) > version:
                return  # registered again since
            self._versions[endpoint_id] = version
            if endpoint_id not in self._pending_writes:
                await self._view.remove(endpoint_id)
            return
        if kind != "u" or self._offset is None:
            return
        version = int(event[6])
        if self._versions.get(endpoint_id, 0) >= version or endpoint_id in self._pending_writes:
            return  # older than what the view has, or overtaken by a write buffered here
        self._versions[endpoint_id] = version
        fields = {"caps": event[2], "url": event[3], "desc": event[4]}
        if len(event) > 7:
            fields["owner"] = event[7]
        record = self._record(endpoint_id, fields, float(event[5]))
        current = self._view.get(endpoint_id)
        if current is not None and current[:4] == record[:4] and current.owner == record.owner:
            # the same registration (this gateway's own write, seen back): only a newer time
            if record.last_seen > current.last_seen + RESYNC_EPS_S:
                await self._view.touch(endpoint_id, record.last_seen, record.last_seen_at)
            return
        await self._view.upsert(record)

    # --- background loops ------------------------------------------------------------------

    def _lost(self, exc: BaseException) -> None:
        self._view_stale = True
        if self._available:
            self._available = False
            self._down_since = self._now()
            log(
                logging.WARNING,
                "registry.unavailable",
                url=redacted(self.url),
                error=str(exc),
                note="routing on the last view; writes are buffered",
            )
        self._reconcile_due = True

    def _healthy(self) -> None:
        if not self._available:
            self._available = True
            down_for = None if self._down_since is None else self._now() - self._down_since
            log(
                logging.WARNING,
                "registry.recovered",
                url=redacted(self.url),
                unavailable_s=None if down_for is None else round(down_for, 3),
            )

    async def _flush_loop(self) -> None:
        while not self._closing:
            await self._wake_flush.wait()
            await asyncio.sleep(self.flush_s)  # gather a batch
            self._wake_flush.clear()
            try:
                await self._flush()
            except asyncio.CancelledError:
                raise
            except RedisError as exc:
                self._lost(exc)
                await asyncio.sleep(min(RETRY_MAX_S, self.sync_s * 4))
                self._wake_flush.set()
            if self._pending_beats:
                self._wake_flush.set()

    async def _sync_loop(self) -> None:
        since_reconcile = 0.0
        wait = self.sync_s
        while not self._closing:
            await asyncio.sleep(wait)
            since_reconcile += wait
            try:
                if self._pending_writes:
                    await self._flush()
                if self._reconcile_due or since_reconcile >= self.reconcile_s:
                    await self._reconcile()
                    since_reconcile = 0.0
                else:
                    await self._sync()
                wait = self.sync_s
            except asyncio.CancelledError:
                raise
            except RedisError as exc:
                self._lost(exc)
                wait = min(RETRY_MAX_S, wait * 2)
            except Exception:  # a bug must not stop the view from being kept up to date
                log(logging.ERROR, "registry.sync_failed", exc_info=True)
                wait = min(RETRY_MAX_S, wait * 2)

    async def _listen_loop(self) -> None:
        channel = self._keys[2]
        wait = self.sync_s
        while not self._closing:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                self._reconcile_due = True  # whatever was announced before now: reconcile
                wait = self.sync_s
                while not self._closing:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        await self._on_event(str(message["data"]))
            except asyncio.CancelledError:
                raise
            except RedisError as exc:
                self._lost(exc)
            except Exception:
                log(logging.ERROR, "registry.listen_failed", exc_info=True)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(wait)
            wait = min(RETRY_MAX_S, wait * 2)


def _unbound() -> float:
    raise RuntimeError("RedisRegistry.bind(now) was not called: the gateway binds its clock")
