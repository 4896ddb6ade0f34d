"""What one gateway's view knows of the versions of the shared registry (no I/O, no clock).

Every registration and every removal in Redis takes the next value of one counter as its
version, and announces it on the channel in the same step
(:mod:`~agent_reach.registry.redis.scripts`). A change is applied to the view only when its
version is newer than what the view already has for that id, so a notification or a read that
is overtaken by a later change cannot bring an old record back.

Invariants:

- **Bounded by the live ids.** :attr:`Versions.live` holds an id only while it is in the view
  (the registry drops the rest at every reconcile). A tombstone (the version of a removal)
  exists only as long as something older may still arrive: it is dropped at the first
  :meth:`Versions.prune` after the channel has passed its version (the channel is ordered:
  nothing older can come through it any more; a read begun before the removal has ended,
  because prune runs between reads) or, if the channel said nothing, ``ttl_s`` after it was
  made. Unknown ids are never recorded.
- Versions only grow, per id and along the channel, and Redis's counter is never below
  :attr:`Versions.top`. After Redis lost its data (the epoch token is gone) or went back to
  an older copy (its counter is below :attr:`Versions.top`: a restore from a snapshot, a
  failover to a replica that missed writes) they start again: :meth:`Versions.clear`
  forgets the old ones, and a reconcile reads everything.
"""

from __future__ import annotations

__all__ = ["Versions"]


class Versions:
    """The version of each id in the view, and recent removals (tombstones)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.live: dict[str, int] = {}  # id in the view -> version of its record
        self._gone: dict[str, tuple[int, float]] = {}  # id -> (removal's version, made at)
        self.channel = 0  # the highest version seen on the channel
        self.top = 0  # the highest version known from anywhere (Redis's counter is at least it)

    def of(self, endpoint_id: str) -> int:
        """The newest version known for the id: its record's or its removal's (0: none)."""
        gone = self._gone.get(endpoint_id)
        live = self.live.get(endpoint_id, 0)
        return live if gone is None else max(live, gone[0])

    def newer(self, endpoint_id: str, version: int) -> bool:
        """Whether a change of the id with ``version`` is newer than anything known."""
        return version > self.of(endpoint_id)

    def registered(self, endpoint_id: str, version: int) -> None:
        """Redis holds the record of this version (never lowers what is known; ignored when
        a later removal is known)."""
        self.top = max(self.top, version)
        gone = self._gone.get(endpoint_id)
        if gone is not None:
            if gone[0] > version:
                return
            del self._gone[endpoint_id]
        if version > self.live.get(endpoint_id, 0):
            self.live[endpoint_id] = version

    def removed(self, endpoint_id: str, version: int, now: float) -> None:
        """The id was removed in Redis by the change ``version``."""
        self.top = max(self.top, version)
        if self.live.get(endpoint_id, 0) < version:
            self.live.pop(endpoint_id, None)
        gone = self._gone.get(endpoint_id)
        if gone is None or gone[0] < version:
            self._gone[endpoint_id] = (version, now)

    def forget(self, endpoint_id: str) -> None:
        """The id left the view without a known removal (a reconcile found it gone)."""
        self.live.pop(endpoint_id, None)

    def on_channel(self, version: int) -> None:
        """A change with ``version`` came through the channel."""
        self.channel = max(self.channel, version)
        self.top = max(self.top, version)

    def prune(self, now: float) -> None:
        """Drop the tombstones nothing older can overtake any more. Call it only between two
        reads of Redis (none in flight), from the task that reads."""
        cutoff = now - self.ttl_s
        stale = [
            endpoint_id
            for endpoint_id, (version, made) in self._gone.items()
            if version <= self.channel or made < cutoff
        ]
        for endpoint_id in stale:
            del self._gone[endpoint_id]

    def clear(self) -> None:
        """Redis lost its data, or went back to an older copy: versions start again."""
        self.live.clear()
        self._gone.clear()
        self.channel = self.top = 0

    def missing_in(self, versions: dict[str, int], seq: int) -> str | None:
        """An id whose change known here Redis lacks, given the ``versions`` of its ids in a
        snapshot whose counter was at ``seq``: the id's version there is below a version known
        here (of its record, or of its removal) that is at most ``seq``. Versions of an id only
        grow in Redis, and every change up to ``seq`` is in the snapshot, so only a Redis gone
        back to older data shows one. None when there is none."""
        for endpoint_id, version in self.live.items():
            there = versions.get(endpoint_id)
            if there is not None and there < version <= seq:
                return endpoint_id
        for endpoint_id, (version, _) in self._gone.items():
            there = versions.get(endpoint_id)
            if there is not None and there < version <= seq:
                return endpoint_id
        return None

    def tombstones(self) -> int:
        """How many removals are remembered now."""
        return len(self._gone)
