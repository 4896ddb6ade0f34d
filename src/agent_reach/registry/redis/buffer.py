"""Writes of one gateway that Redis has not taken yet.

Invariants:

- **The latest per id.** :attr:`WriteBuffer.writes` holds, per id, the last registration
  (a record) or removal (None) made while Redis could not take it; a later write of the same
  id replaces it. :attr:`WriteBuffer.beats` holds the ids that took a heartbeat since the last
  flush (a set: the time written is Redis's own when the batch is written). Both are bounded
  by the ids this gateway's view knows.
- **Never lost to a race.** :meth:`WriteBuffer.flush` drops an entry only once it is written,
  and only if no newer write of that id was buffered meanwhile.
- **Writes on their way** (:meth:`WriteBuffer.writing`) are counted, so that a read of Redis
  made before they landed does not undo them in the view; the count ends with the write.
- A buffered registration is written as it is (a re-publication): the hold of token mode and
  the record cap were checked on this gateway's view when it was taken.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from agent_reach.core.model import EndpointRecord
from agent_reach.registry.redis.store import RedisStore
from agent_reach.registry.redis.versions import Versions

__all__ = ["WriteBuffer"]

_MISSING = object()


class WriteBuffer:
    """Registrations, removals and heartbeats waiting to be written to Redis."""

    def __init__(self) -> None:
        self.writes: dict[str, EndpointRecord | None] = {}  # None: a removal
        self.beats: dict[str, None] = {}  # ordered set of ids
        self.wake = asyncio.Event()  # set when the first heartbeat of a batch is buffered
        self.inflight: dict[str, int] = {}  # id -> direct writes of it on their way to Redis

    @contextlib.contextmanager
    def writing(self, endpoint_id: str) -> Iterator[None]:
        """A direct write of the id is on its way to Redis (see :meth:`holds`)."""
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

    def beat(self, endpoint_id: str) -> None:
        """Buffer a heartbeat of the id (written with the next batch)."""
        self.beats[endpoint_id] = None
        if len(self.beats) == 1:
            self.wake.set()

    def drop(self, endpoint_id: str) -> None:
        """Forget whatever is buffered for the id (a newer write supersedes it)."""
        self.writes.pop(endpoint_id, None)
        self.beats.pop(endpoint_id, None)

    async def flush(self, store: RedisStore, versions: Versions, now: Callable[[], float]) -> None:
        """Write the buffered registrations and removals, then the batch of heartbeats.
        Raises BackendUnavailable (what is not written stays buffered)."""
        while self.writes:
            endpoint_id, record = next(iter(self.writes.items()))
            if record is None:
                version, _ = await store.remove(endpoint_id)
                if version:
                    versions.removed(endpoint_id, version, now())
            else:
                versions.registered(endpoint_id, await store.upsert(record, fresh=False))
            if self.writes.get(endpoint_id, _MISSING) is record:
                del self.writes[endpoint_id]
        if self.beats:
            ids = list(self.beats)
            await store.touch(ids)
            for endpoint_id in ids:
                self.beats.pop(endpoint_id, None)
