"""Writes of one gateway that Redis has not taken yet.

Invariants:

- **The latest per id.** :attr:`WriteBuffer.writes` holds, per id, the last registration
  (a record) or removal (None) made while Redis could not take it; a later write of the same
  id replaces it. :attr:`WriteBuffer.beats` holds the ids that took a heartbeat since the last
  flush (a set: the time written is Redis's own when the batch is written).
- **Nothing buffered for what Redis never had.** A registration buffered for an id that Redis
  holds nothing of, as far as this gateway knows (the view did not hold it, no version of it
  is known, and no write of it has left this gateway since), is *new* (:attr:`WriteBuffer.new`):
  removing the id before the flush cancels it (:meth:`WriteBuffer.drop` says so) instead of
  queueing a removal. Once a write of the id leaves for Redis (a direct write, or the flush),
  it may land even when the call fails (a timeout), so it is new no more.
- **Bounded.** The registry buffers a write of an id not buffered yet only while fewer than
  :attr:`WriteBuffer.max_writes` are (:meth:`WriteBuffer.full`; past it the write is refused,
  nothing changed). Over it only by writes that were already on their way when Redis was
  found away, and by the re-publication of the view after Redis lost its data (bounded by the
  view). ``beats`` and :attr:`WriteBuffer.new` are bounded by the view and by ``writes``.
- **One flush at a time**, and **never lost to a race**: :meth:`WriteBuffer.flush` holds a
  lock (two flushes would write the same entry twice: two versions, two notices), drops an
  entry only once it is written, and only if no newer write of that id was buffered meanwhile.
- **Writes on their way** (:meth:`WriteBuffer.writing`) are counted, so that a read of Redis
  made before they landed does not undo them in the view; the count ends with the write.
- A buffered registration is written as it is: the hold of token mode and the record cap
  were checked on this gateway's view when it was taken. A buffered registration or removal
  carries the time it was made (the record's ``last_seen``, or
  :attr:`WriteBuffer.removed_at`) and is not written when the id was registered after that,
  through another gateway; a removal made with an owner (token mode's endpoint token) is not
  written where Redis holds another owner's registration. A **re-publication** (the view put
  back after Redis lost its data, :meth:`WriteBuffer.republish`; :attr:`WriteBuffer.again`
  holds its ids) is written only where Redis has nothing of the id, and never replaces a
  write buffered here; a write of the id made since replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import EndpointHeld
from agent_reach.registry.redis.store import RedisStore
from agent_reach.registry.redis.versions import Versions

__all__ = ["MAX_BUFFERED", "WriteBuffer"]

# ids whose latest write waits for Redis, at most: on recovery each is a round trip before
# the reconcile runs (about a second per 10,000 on a local network)
MAX_BUFFERED = 10_000

_MISSING = object()


class WriteBuffer:
    """Registrations, removals and heartbeats waiting to be written to Redis."""

    def __init__(self, max_writes: int = MAX_BUFFERED) -> None:
        self.max_writes = max_writes
        self.writes: dict[str, EndpointRecord | None] = {}  # None: a removal
        self.new: set[str] = set()  # ids of buffered registrations Redis has nothing of
        self.again: set[str] = set()  # ids whose buffered registration is a re-publication
        self.removed_at: dict[str, float] = {}  # id -> when its buffered removal was made
        self.removed_by: dict[str, str] = {}  # id -> the owner whose registration it removes
        self.beats: dict[str, None] = {}  # ordered set of ids
        self.wake = asyncio.Event()  # set when the first heartbeat of a batch is buffered
        self.inflight: dict[str, int] = {}  # id -> direct writes of it on their way to Redis
        self._flushing = asyncio.Lock()

    @contextlib.contextmanager
    def writing(self, endpoint_id: str) -> Iterator[None]:
        """A direct write of the id is on its way to Redis (see :meth:`holds`)."""
        self.new.discard(endpoint_id)  # it may land, whatever the call answers
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1
        try:
            yield
        finally:
            left = self.inflight.pop(endpoint_id) - 1
            if left:
                self.inflight[endpoint_id] = left

    def holds(self, endpoint_id: str) -> bool:
        """Whether a write of the id is buffered or on its way: then what a read of Redis says
        of it may be older than the view, which a reconcile or fetch leaves alone."""
        return endpoint_id in self.writes or endpoint_id in self.inflight

    def full(self, endpoint_id: str) -> bool:
        """Whether buffering a write of the id would pass the bound (one already buffered
        is replaced: that never does)."""
        return endpoint_id not in self.writes and len(self.writes) >= self.max_writes

    def register(self, record: EndpointRecord, *, known: bool) -> None:
        """Buffer a registration, in place of what was buffered of its id. ``known``: Redis
        may hold the id apart from what is buffered here (the view held it, a version of it
        is known, or this very write was sent)."""
        endpoint_id = record.endpoint_id
        if endpoint_id in self.writes:
            new = endpoint_id in self.new  # what Redis may hold came from that write alone
        else:
            new = not known and endpoint_id not in self.inflight
        self.writes[endpoint_id] = record
        self.again.discard(endpoint_id)
        self.removed_at.pop(endpoint_id, None)
        if new:
            self.new.add(endpoint_id)
        else:
            self.new.discard(endpoint_id)

    def republish(self, record: EndpointRecord) -> None:
        """Buffer the re-publication of a record of the view (Redis lost its data), unless a
        write of its id is buffered already."""
        if record.endpoint_id not in self.writes:
            self.writes[record.endpoint_id] = record
            self.again.add(record.endpoint_id)

    def deregister(self, endpoint_id: str, made: float, owner: str | None = None) -> None:
        """Buffer a removal of the id, made at ``made`` (the liveness clock; call :meth:`drop`
        first: it may make this needless); with ``owner``, written only where Redis holds that
        owner's registration."""
        self.writes[endpoint_id] = None
        self.removed_at[endpoint_id] = made
        if owner is None:
            self.removed_by.pop(endpoint_id, None)
        else:
            self.removed_by[endpoint_id] = owner
        self.new.discard(endpoint_id)
        self.again.discard(endpoint_id)

    def discard(self, endpoint_id: str) -> None:
        """Forget the buffered write of the id (a direct write of it supersedes it)."""
        self.writes.pop(endpoint_id, None)
        self.new.discard(endpoint_id)
        self.again.discard(endpoint_id)
        self.removed_at.pop(endpoint_id, None)
        self.removed_by.pop(endpoint_id, None)

    def beat(self, endpoint_id: str) -> None:
        """Buffer a heartbeat of the id (written with the next batch)."""
        self.beats[endpoint_id] = None
        if len(self.beats) == 1:
            self.wake.set()

    def drop(self, endpoint_id: str) -> bool:
        """Forget whatever is buffered for the id (a removal supersedes it). True when that
        was a new registration (no write of it on its way either): Redis has nothing of the
        id from this gateway, so nothing is to be removed there."""
        cancelled = endpoint_id in self.new and endpoint_id not in self.inflight
        self.discard(endpoint_id)
        self.beats.pop(endpoint_id, None)
        return cancelled

    async def flush(self, store: RedisStore, versions: Versions, now: Callable[[], float]) -> None:
        """Write the buffered registrations and removals (each but where a later registration
        of its id is in Redis), then the batch of heartbeats.
        Raises BackendUnavailable (what is not written stays buffered). A flush called while
        another runs waits for it, then writes what is left."""
        async with self._flushing:
            if self.writes:
                # the times of the writes are mapped to Redis's clock as it is now: after a
                # partition, or a failover to another host, it may not be the one measured
                # before (the writes are compared with records written meanwhile)
                await store.measure_offset()
            while self.writes:
                endpoint_id, record = next(iter(self.writes.items()))
                self.new.discard(endpoint_id)  # on its way: it may land even if the call fails
                again = endpoint_id in self.again
                if record is None:
                    made = self.removed_at.get(endpoint_id)
                    owner = self.removed_by.get(endpoint_id)
                    try:
                        version, _ = await store.remove(endpoint_id, made=made, owner=owner)
                    except EndpointHeld:  # registered since by another owner: it stands
                        version = 0
                    if version:
                        versions.removed(endpoint_id, version, now())
                else:
                    version = await store.upsert(record, fresh=False, again=again)
                    if version:  # 0: not written (a re-publication of an id Redis has, or a
                        # late registration of one registered since): the reconcile reads it
                        versions.registered(endpoint_id, version)
                if self.writes.get(endpoint_id, _MISSING) is record and (
                    again == (endpoint_id in self.again)
                ):
                    del self.writes[endpoint_id]
                    self.again.discard(endpoint_id)
                    self.removed_at.pop(endpoint_id, None)
                    self.removed_by.pop(endpoint_id, None)
            if self.beats:
                ids = list(self.beats)
                await store.touch(ids)
                for endpoint_id in ids:
                    self.beats.pop(endpoint_id, None)
