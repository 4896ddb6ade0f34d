"""The :class:`RedisRegistry`: a registry backend shared by many gateways through Redis.

Invariants:

- **No Redis round trip on a route decision.** Reads (``get``, ``by_intent``, ``intents``,
  ``records``) answer from the local view, a :class:`~agent_reach.registry.memory.MemoryRegistry`
  kept equal to Redis by :mod:`~agent_reach.registry.redis.sync`.
- **Checked writes go to Redis first.** A write that Redis may refuse (token mode's hold, the
  record cap) is checked and written there in one step before the view changes, so a refusal
  leaves everything as it was; other writes change the view first and Redis next.
- **Redis away.** Writes go to the view, and what could not be written is buffered
  (:mod:`~agent_reach.registry.redis.buffer`) and written when Redis answers again; once
  Redis is known to be away, writes are buffered without trying it. Checks are then made on
  this gateway's view only (what it cannot see is not checked). A removal of an id whose
  registration is buffered and new to Redis cancels it: nothing is written for either.
- **A bounded buffer.** While Redis is known to be away, a write that would buffer one id
  more than ``max_buffered`` is refused with
  :class:`~agent_reach.errors.BackendUnavailable`, nothing changed (the view neither), and
  counted in :attr:`RedisRegistry.buffer_refused`; a write of an id already buffered is
  always taken (it replaces the buffered one).
- **Bounded state.** Redis and the view hold the live ids and nothing of removed ones (but
  recent removals, remembered in the view for at most :data:`TOMBSTONE_TTL_S`, and in Redis
  only in the reset window after it lost its data); a removal of an id that is not registered
  writes nothing (but such a tombstone).
- **Nothing from redis-py leaks**: the store turns its errors into
  :class:`~agent_reach.errors.BackendUnavailable`; a bad URL or prefix is a
  :class:`~agent_reach.errors.ConfigError` when the registry is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Iterable

from agent_reach.clock import Clock, SystemClock
from agent_reach.core.model import EndpointRecord
from agent_reach.errors import BackendUnavailable, EndpointHeld
from agent_reach.observability.logs import Throttle, log
from agent_reach.registry.base import (
    ClaimMap,
    RegistryListener,
    RegistryState,
    SharedMap,
    check_max_records,
    registry_full,
)
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.registry.redis.buffer import MAX_BUFFERED, WriteBuffer
from agent_reach.registry.redis.link import Link
from agent_reach.registry.redis.loops import (
    FLUSH_S,
    RECONCILE_S,
    STALENESS_BOUND_S,
    SYNC_S,
    Loops,
)
from agent_reach.registry.redis.store import RedisStore
from agent_reach.registry.redis.sync import ViewSync
from agent_reach.registry.redis.versions import Versions
from agent_reach.settings import redacted

__all__ = ["TOMBSTONE_TTL_S", "RedisRegistry"]

# A removal is remembered until the channel has passed it, or this long at most (a notice
# lost with a dropped subscription): longer than any read in flight (the socket timeout).
TOMBSTONE_TTL_S = 10.0


class RedisRegistry:
    """A :class:`~agent_reach.registry.base.RegistryBackend` shared through Redis.

    ``url`` is a redis-py URL (``redis://``, ``rediss://``, ``unix://``); ``prefix`` keeps
    several agent networks apart on one Redis (ConfigError for an unusable one). ``now`` (set
    by :meth:`bind`) is the gateway's liveness clock: every record's ``last_seen`` in the view
    is on it; ``clock`` (default: the system clock) is what the background loops sleep on.

    ``max_records`` caps the records of the whole network (every gateway on the prefix):
    a registration of a new id when Redis holds that many is refused with
    :class:`~agent_reach.errors.RegistryFull`, checked in the same step as the write (so two
    gateways cannot both take the last place); a known id may always register again. Down
    records count until they are purged. While Redis is away the cap is checked on this
    gateway's view, and a registration buffered then is written as it is when Redis returns.

    ``max_buffered`` bounds the ids whose writes wait for Redis while it is away (see the
    module's invariants): past it, a write of another id is refused with
    :class:`~agent_reach.errors.BackendUnavailable`.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "agent-reach",
        max_records: int | None = None,
        clock: Clock | None = None,
        flush_s: float = FLUSH_S,
        sync_s: float = SYNC_S,
        reconcile_s: float = RECONCILE_S,
        connect_timeout_s: float = 2.0,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self.max_records = check_max_records(max_records)
        self._store = RedisStore(url, prefix, connect_timeout_s=connect_timeout_s)
        self.url, self.prefix = url, prefix
        self.clock = clock or SystemClock()
        self.flush_s, self.sync_s, self.reconcile_s = flush_s, sync_s, reconcile_s
        self._view = MemoryRegistry()
        self._versions = Versions(TOMBSTONE_TTL_S)
        self._buffer = WriteBuffer(max_buffered)
        self.buffer_refused = 0  # writes refused at the buffer's bound (only grows: a metric)
        self._refusals = Throttle(monotonic=self._now)  # a line a second: callers repeat
        self._link = Link(url)
        self._sync = ViewSync(self._store, self._view, self._versions, self._buffer, self._link)
        self._loops: Loops | None = None

    def _now(self) -> float:
        return self._store.now()

    # --- lifecycle -------------------------------------------------------------------------

    def shared_map(self, name: str) -> SharedMap:
        """The map ``name``: a Redis hash under this registry's prefix, seen by every gateway."""
        return self._store.shared_map(name)

    def claim_map(self, name: str) -> ClaimMap:
        """The claim map ``name``: one Redis key per entry, expiring in Redis, under this
        registry's prefix, seen by every gateway."""
        return self._store.claim_map(name)

    def bind(self, now: Callable[[], float]) -> None:
        self._store.now = now
        self._view.bind(now)  # the view's last_seen are on it: it checks held_within_s itself

    async def start(self) -> None:
        """Connect, load the whole registry into the view, and start the background loops;
        returns once Redis confirmed the channel's subscription (at most twice the socket
        timeout: past it the reconcile the listener asks for repairs what it missed).

        Raises :class:`~agent_reach.errors.BackendUnavailable` (with the URL, password
        hidden) when Redis cannot be reached: a gateway does not start on a registry it has
        never seen.
        """
        if self._loops is not None:
            return
        try:
            dropped = await self._store.init()
            await self._sync.reconcile()
        except BackendUnavailable as exc:
            await self._store.close()
            cause = exc.__cause__ or exc
            raise BackendUnavailable(
                f"cannot reach the registry at {redacted(self.url)}: {cause}"
            ) from exc
        self._loops = Loops(
            clock=self.clock,
            store=self._store,
            versions=self._versions,
            buffer=self._buffer,
            link=self._link,
            view_sync=self._sync,
            flush_s=self.flush_s,
            sync_s=self.sync_s,
            reconcile_s=self.reconcile_s,
        )
        self._loops.start()
        # every notice published once start returns reaches this view (Redis confirmed the
        # subscription); bounded, since the reconcile the listener asks for repairs the rest
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._loops.subscribed.wait(), 2 * self._store.timeout_s)
        log(
            logging.INFO,
            "registry.started",
            url=redacted(self.url),
            prefix=self.prefix,
            records=len(self),
        )
        if dropped:
            log(
                logging.INFO,
                "registry.versions_dropped",
                count=dropped,
                note="versions of removed ids, kept by an older release",
            )

    async def close(self) -> None:
        loops, self._loops = self._loops, None
        if loops is not None:
            await loops.close()
            if self._link.available:
                with contextlib.suppress(BackendUnavailable):  # the last heartbeats, best effort
                    await self._buffer.flush(self._store, self._versions, self._now)
        await self._store.close()

    def state(self) -> RegistryState:
        last = self._store.last_sync  # set by a measure, which read the bound clock
        return self._link.state(None if last is None else max(0.0, self._now() - last))

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
        endpoint_id = record.endpoint_id
        checked = held_within_s is not None or self.max_records is not None
        sent = False  # this write went to Redis and failed: it may have landed all the same
        if checked and self._link.available:
            before = self._view.get(endpoint_id)
            try:  # EndpointHeld, RegistryFull: refused in Redis, nothing changed anywhere
                with self._buffer.writing(endpoint_id):
                    version = await self._store.upsert(
                        record,
                        fresh=True,
                        held_within_s=held_within_s,
                        max_records=self.max_records,
                    )
            except BackendUnavailable as exc:
                sent = True
                self._link.lost(exc, self._now())  # checked on the view below, written later
            else:
                self._buffer.discard(endpoint_id)
                await self._landed(record, version)
                return before
        if (
            self.max_records is not None
            and self._view.get(endpoint_id) is None
            and len(self._view) >= self.max_records
        ):
            raise registry_full(endpoint_id, len(self._view), self.max_records)
        self._check_room(endpoint_id)
        before = await self._view.upsert(record, held_within_s=held_within_s)
        if not self._link.available:
            # known to be away: buffer at once rather than make the caller wait for a
            # connection or a timeout (up to connect_timeout_s on a partition); the background
            # loops write it when Redis answers again
            known = sent or before is not None or endpoint_id in self._versions.live
            self._buffer.register(record, known=known)
            return before
        self._buffer.discard(endpoint_id)  # the write below supersedes it
        try:
            with self._buffer.writing(endpoint_id):
                version = await self._store.upsert(record, fresh=True)
        except BackendUnavailable as exc:
            self._buffer.register(record, known=True)  # sent: it may have landed
            self._link.lost(exc, self._now())
        else:
            await self._landed(record, version)
        return before

    def _check_room(self, endpoint_id: str) -> None:
        """Refuse (BackendUnavailable) a write that would buffer the id past the bound while
        Redis is known to be away; the caller changes nothing before this."""
        if self._link.available or not self._buffer.full(endpoint_id):
            return
        self.buffer_refused += 1
        waiting = len(self._buffer.writes)
        self._refusals.log(
            logging.WARNING,
            "registry.buffer_full",
            url=redacted(self.url),
            buffered=waiting,
            refused=self.buffer_refused,
            note="writes of ids not buffered yet are refused until Redis answers",
        )
        raise BackendUnavailable(
            f"the registry at {redacted(self.url)} is unreachable and the writes of {waiting} "
            f"ids wait for it, the most this gateway buffers: {endpoint_id} is not changed; "
            "try again when it answers"
        )

    async def _landed(self, record: EndpointRecord, version: int) -> None:
        """``record`` is in Redis as ``version``: the view shows it, unless a newer change of
        the id is known or a later write of it is buffered here."""
        self._link.healthy(self._now())
        endpoint_id = record.endpoint_id
        if endpoint_id in self._buffer.writes or self._versions.of(endpoint_id) > version:
            return  # overtaken meanwhile
        self._versions.registered(endpoint_id, version)
        current = self._view.get(endpoint_id)
        if current is None or current[:4] != record[:4] or current.owner != record.owner:
            # an older notice applied while this write was on its way
            await self._view.upsert(record)

    def touch(
        self, endpoint_id: str, last_seen: float, last_seen_at: float
    ) -> EndpointRecord | None:
        after = self._view.touch(endpoint_id, last_seen, last_seen_at)
        if after is not None:
            self._buffer.beat(endpoint_id)
        return after

    async def remove(self, endpoint_id: str, *, owner: str | None = None) -> EndpointRecord | None:
        buffer, made = self._buffer, self._now()
        current = self._view.get(endpoint_id)
        if current is not None:
            if owner is not None and current.owner != owner:
                raise EndpointHeld(endpoint_id)
            self._check_room(endpoint_id)  # a removal may have to be buffered
        before = await self._view.remove(endpoint_id)
        # a new registration never written: Redis has nothing of it from here to remove
        cancelled = buffer.drop(endpoint_id)
        if not self._link.available:  # as in upsert: buffered, written when Redis is back
            if before is not None and not cancelled:
                buffer.deregister(endpoint_id, made, owner)
            return before
        try:
            # also what Redis has but this view not yet (a registration on its way): the
            # removal returns it. An id not registered anywhere leaves no trace in Redis.
            with buffer.writing(endpoint_id):
                version, removed = await self._store.remove(endpoint_id, owner=owner)
        except EndpointHeld:
            # registered since by another owner (through another gateway, its notice still
            # on its way): that registration stands, and the view shows it now
            self._link.healthy(self._now())
            with contextlib.suppress(BackendUnavailable):  # else its notice, or a reconcile
                await self._sync.refresh([endpoint_id])
            raise
        except BackendUnavailable as exc:
            if before is not None and not cancelled:
                buffer.deregister(endpoint_id, made, owner)
            self._link.lost(exc, self._now())
            return before
        self._link.healthy(self._now())
        if version:
            # remembered until its own notice comes back: notices of the registrations it
            # removed, still on their way, are stale
            self._versions.removed(endpoint_id, version, self._now())
            if endpoint_id not in self._versions.live and endpoint_id not in self._buffer.writes:
                await self._view.remove(endpoint_id)  # an older notice applied meanwhile
        return before if before is not None else removed

    async def purge(self, seen_before: float) -> int:
        last_sync = self._store.last_sync
        if last_sync is None or not self._link.may_purge(self._now()):
            # while Redis is away, and until the others have written what they buffered
            # meanwhile, this view misses the heartbeats other gateways take: an age read from
            # it is no reason to delete a record that they keep alive (and the removal would be
            # written when Redis is back)
            return 0
        # Nor while Redis is silent but not yet known to be away (a partition: up to the
        # socket timeout): the view has every heartbeat taken up to STALENESS_BOUND_S before
        # its last sync, so only records with no heartbeat for the whole purge time before
        # that are certainly dead.
        seen_before -= max(0.0, self._now() - last_sync) + STALENESS_BOUND_S
        purged = 0
        for record in list(self._view.records()):
            if record.last_seen < seen_before and await self.remove(record.endpoint_id):
                purged += 1
        return purged
