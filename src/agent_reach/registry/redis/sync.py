"""Keeping one gateway's view equal to Redis: notifications, heartbeat reads, reconciles.

Invariants:

- **No old record comes back.** A change read from Redis (a notification, a fetched record,
  a snapshot) is applied only when its version is newer than what the view knows of the id
  (:mod:`~agent_reach.registry.redis.versions`), and never over a write still buffered here.
- **Heartbeats only move forward.** A last-seen time read back replaces the view's only when
  it is more than :data:`RESYNC_EPS_S` newer (the view already has the heartbeats it took).
- **What the view misses, a reconcile repairs.** :meth:`ViewSync.sync` reads the heartbeats
  newer than its cursor (and fetches ids it does not know); :meth:`ViewSync.reconcile` reads
  the whole registry (what is registered now: Redis keeps nothing of removed ids) and makes
  the view equal to it, but for buffered writes and changes newer than the snapshot.
- **A request for a reconcile is never lost.** A reconcile takes the request
  (:attr:`Link.reconcile_due <agent_reach.registry.redis.link.Link.reconcile_due>`) just
  before its snapshot, so that a request made after the snapshot (a resubscription: what was
  announced before it came through no channel) stands for the next iteration; a reconcile
  that fails puts the request back.
- **Redis emptied** (restarted without persistence): the epoch token is gone; the view is
  re-published (last-seen times never newer than Redis's) and versions start again. A
  re-publication only fills in what Redis has nothing of: a record written since (by any
  gateway), or an id removed since, wins over it (see
  :mod:`~agent_reach.registry.redis.scripts`), and the reconcile that follows makes the view
  equal to Redis. **Redis gone back to older data** (a restore from a snapshot, a failover to
  a replica that missed writes): its version counter is below what the view knew, or the
  counter has moved past that meanwhile but an id's version in Redis is below the one the
  view knows (a change the copy lacks; seen at the next reconcile); versions start again and
  every record is read again (records registered since the copy leave the views).
"""

from __future__ import annotations

import json
import logging

from agent_reach.observability.logs import log
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.registry.redis.buffer import WriteBuffer
from agent_reach.registry.redis.link import Link
from agent_reach.registry.redis.store import Fetched, RedisStore
from agent_reach.registry.redis.versions import Versions

__all__ = ["CURSOR_OVERLAP_S", "RESYNC_EPS_S", "ViewSync"]

RESYNC_EPS_S = 0.1  # a heartbeat read back less than this newer than the view is not applied
CURSOR_OVERLAP_S = 0.1  # re-read this much before the cursor (a stepped Redis clock, races)


class ViewSync:
    """Applies Redis's changes to the view; called by the background loops (and start)."""

    def __init__(
        self,
        store: RedisStore,
        view: MemoryRegistry,
        versions: Versions,
        buffer: WriteBuffer,
        link: Link,
    ) -> None:
        self._store, self._view, self._versions = store, view, versions
        self._buffer, self._link = buffer, link
        self.cursor = 0.0  # Redis time up to which heartbeats were read

    async def _apply(self, fetched: Fetched) -> None:
        endpoint_id = fetched.record.endpoint_id
        if self._buffer.holds(endpoint_id):
            return  # overtaken by a write buffered here, or on its way
        if not self._versions.newer(endpoint_id, fetched.version):
            return  # the view has this version, or a later change, already
        self._versions.registered(endpoint_id, fetched.version)
        await self._view.upsert(fetched.record)

    async def refresh(self, endpoint_ids: list[str]) -> None:
        """Read the ids' records from Redis into the view (a write refused there: what Redis
        holds is newer than the view)."""
        for fetched in await self._store.fetch(endpoint_ids):
            if fetched is not None:
                await self._apply(fetched)

    def _touch(self, endpoint_id: str, ts: float) -> None:
        record = self._view.get(endpoint_id)
        assert self._store.offset is not None
        local = ts - self._store.offset
        if record is not None and local > record.last_seen + RESYNC_EPS_S:
            self._view.touch(endpoint_id, local, ts)

    async def _check_epoch(self, epoch: str | None) -> bool:
        """Whether Redis lost its data since the last look (then this view was re-published)."""
        if epoch is not None and (self._store.epoch is None or epoch == self._store.epoch):
            self._store.epoch = epoch
            return False
        # the token is gone (or replaced): Redis lost its data; put back what this view knows
        log(
            logging.WARNING,
            "registry.redis_reset",
            note="registry data lost in Redis; re-publishing this gateway's view",
            records=len(self._view),
        )
        self._store.epoch = await self._store.renew_epoch()
        # versions restart in an emptied Redis: the ones remembered from before would make
        # every notification of the new era look stale
        self._versions.clear()
        self._link.reconcile_due = True  # what was announced while it was away is unknown here
        # re-publications, not registrations: each only fills in what Redis has nothing of
        # (a write buffered here stays as it is, written as made)
        for record in list(self._view.records()):
            self._buffer.republish(record)
        await self._buffer.flush(self._store, self._versions, self._store.now)
        return True

    def _check_counter(self, seq: int, top: int, versions: dict[str, int] | None = None) -> bool:
        """Whether Redis went back to an older copy of its data: its version counter is below
        what was known before the read, or (given the ``versions`` of a snapshot taken at
        counter ``seq``) an id's version is below one the view knew by then (the counter has
        moved on since the copy). Then versions start again, and every id is to be read again
        (by the caller's reconcile)."""
        lost = None if versions is None else self._versions.missing_in(versions, seq)
        if seq >= top and lost is None:
            return False
        log(
            logging.WARNING,
            "registry.redis_rollback",
            note="Redis went back to older data (a restore, a failover); reading it all again",
            counter=seq,
            known=top,
            endpoint_id=lost,  # None: the counter alone showed it
        )
        self._versions.clear()
        return True

    async def sync(self) -> None:
        """Read the heartbeats written since the cursor into the view."""
        self._versions.prune(self._store.now())  # between two reads: none in flight
        since = max(0.0, self.cursor - CURSOR_OVERLAP_S)
        top = self._versions.top
        beats = await self._store.heartbeats(since)
        if await self._check_epoch(beats.epoch):
            return  # the next iteration reconciles
        if self._check_counter(beats.seq, top):
            self._link.reconcile_due = True  # the next iteration reads every id
            return
        self.cursor = beats.redis_now
        unknown = []
        for endpoint_id, ts in beats.fresh:
            if self._view.get(endpoint_id) is not None:
                self._touch(endpoint_id, ts)
            elif not self._buffer.holds(endpoint_id):
                unknown.append(endpoint_id)  # registered elsewhere, notification not yet seen
        for fetched in await self._store.fetch(unknown):
            if fetched is not None:
                await self._apply(fetched)
        self._link.healthy(self._store.now())

    async def reconcile(self) -> None:
        """Make the view equal to Redis (but for writes still buffered here, and changes that
        came after the snapshot)."""
        try:
            await self._reconcile()
        except BaseException:
            self._link.reconcile_due = True  # not done: the next iteration tries again
            raise

    async def _reconcile(self) -> None:
        self._versions.prune(self._store.now())
        for _ in range(2):
            top = self._versions.top
            # taken before each snapshot, never after: a request made once it is taken (the
            # listener's, after a resubscription) stands, for the next reconcile
            self._link.reconcile_due = False
            snap = await self._store.snapshot()
            if self._store.epoch is None:
                self._store.epoch = snap.epoch
                break
            if not await self._check_epoch(snap.epoch):
                break
            # Redis had lost its data and this view was just re-published: compare the view
            # with what Redis holds now, not with the empty set read before (which would
            # remove every record from the view)
        self._check_counter(snap.seq, top, snap.versions)  # then every id is read again, below
        self.cursor = snap.redis_now
        holds, live = self._buffer.holds, self._versions.live
        for record in list(self._view.records()):
            endpoint_id = record.endpoint_id
            if endpoint_id in snap.seen or holds(endpoint_id):
                continue
            if live.get(endpoint_id, 0) > snap.seq:
                continue  # registered after the snapshot was taken
            await self._view.remove(endpoint_id)
            self._versions.forget(endpoint_id)
        for endpoint_id in [i for i in live if self._view.get(i) is None and not holds(i)]:
            self._versions.forget(endpoint_id)  # left the view by a path that kept its version
        stale = [
            endpoint_id
            for endpoint_id in snap.seen
            if not holds(endpoint_id)
            and self._versions.newer(endpoint_id, snap.versions.get(endpoint_id, 0))
        ]
        for fetched in await self._store.fetch(stale):
            if fetched is not None:
                await self._apply(fetched)
        for endpoint_id, ts in snap.seen.items():
            self._touch(endpoint_id, ts)
        self._link.reconciled(self._store.now())
        self._link.healthy(self._store.now())

    async def on_event(self, data: str) -> None:
        """A registration or removal announced by any gateway (this one included)."""
        try:
            event = json.loads(data)
            kind, endpoint_id = str(event[0]), str(event[1])
            if kind == "r":
                version = int(event[2])
            elif kind == "u":
                version = int(event[6])
                fields = {"caps": event[2], "url": event[3], "desc": event[4]}
                if len(event) > 7:
                    fields["owner"] = event[7]
                ts = float(event[5])
            else:
                raise ValueError(kind)
        except (ValueError, IndexError, KeyError, TypeError):
            log(logging.WARNING, "registry.bad_event", data=data[:200])
            return
        self._versions.on_channel(version)
        if kind == "r":
            if self._versions.live.get(endpoint_id, 0) > version:
                return  # registered again since
            self._versions.removed(endpoint_id, version, self._store.now())
            if endpoint_id not in self._buffer.writes:
                await self._view.remove(endpoint_id)
            return
        if self._store.offset is None:
            return
        if endpoint_id in self._buffer.writes or not self._versions.newer(endpoint_id, version):
            return  # older than what the view has, or overtaken by a write buffered here
        try:
            record = self._store.record(endpoint_id, fields, ts)
        except (ValueError, TypeError):
            log(logging.WARNING, "registry.bad_event", data=data[:200])
            return
        self._versions.registered(endpoint_id, version)
        current = self._view.get(endpoint_id)
        if current is not None and current[:4] == record[:4] and current.owner == record.owner:
            # the same registration (this gateway's own write, seen back): only a newer time
            if record.last_seen > current.last_seen + RESYNC_EPS_S:
                self._view.touch(endpoint_id, record.last_seen, record.last_seen_at)
            return
        await self._view.upsert(record)
