"""Routing choice: which endpoints may serve an intent, and which one gets this request.

Invariants:
- Only exact tag matches are candidates, unless there are none: then the fallback matcher's
  best-scoring tags at or above the confidence threshold are (a fallback never mixes with exact).
- Intent routing chooses healthy before degraded; suspect and down never (suspect only by hint).
- Among equals the choice is power of two choices over peak-EWMA x (in-flight + 1), so that
  equal endpoints share load and the single fastest one is not flooded.
- A slow (degraded only by latency) endpoint gets at most ``probe_share`` of its intent's
  requests while healthy ones exist, so that it can show it is fast again.
- :class:`Tiers` holds each member in the tier of its health at the last time it was placed;
  the owner re-places a member on every event that touches it, and :meth:`Tiers.expire`
  re-places members whose status may have changed by time alone.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from agent_reach.core.health import INF, EndpointStats, Health, derive
from agent_reach.core.model import EndpointRecord, Status, Thresholds

__all__ = ["PROBE_SHARE", "Tiers", "build_tiers", "pick"]

PROBE_SHARE = 0.02  # contract: at most 5 % of an intent's requests


def _tier_of(h: Health) -> tuple[bool, bool, bool]:
    degraded = h.status is Status.DEGRADED
    return (h.status is Status.HEALTHY, degraded, degraded and h.slow_only)


@dataclass(slots=True)
class Tiers:
    """The routable endpoints of one intent, split by health, kept up to date incrementally.

    A member is re-placed when an event touches it (:meth:`place`) or when its own next status
    change by time comes (:meth:`expire`), so neither a heartbeat nor the passing of time costs
    a rebuild of the whole intent.
    """

    healthy: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    probe: list[str] = field(default_factory=list)  # degraded only for slowness
    unavailable: int = 0  # suspect, down or ejected candidates
    placed: dict[str, Health] = field(default_factory=dict)  # member -> health when placed
    due: list[tuple[float, str]] = field(default_factory=list)  # heap of (changes_at, member)

    @property
    def valid_until(self) -> float:
        """Every member keeps its tier for ``now <= valid_until`` (conservative)."""
        return self.due[0][0] if self.due else INF

    def place(self, endpoint_id: str, h: Health | None) -> None:
        """Put ``endpoint_id`` in the tier of ``h``; None removes it."""
        old = self.placed.pop(endpoint_id, None)
        if old is not None and h is not None and _tier_of(old) == _tier_of(h):
            self.placed[endpoint_id] = h  # same tier (the common case): only its due time moves
            self._schedule(endpoint_id, h)
            return
        if old is not None:
            lists = self._lists(old)
            for members in lists:
                members.remove(endpoint_id)
            self.unavailable -= not lists
        if h is None:
            return
        self.placed[endpoint_id] = h
        lists = self._lists(h)
        for members in lists:
            members.append(endpoint_id)
        self.unavailable += not lists
        self._schedule(endpoint_id, h)

    def _lists(self, h: Health) -> tuple[list[str], ...]:
        """The tier lists a member of health ``h`` belongs in (none: unavailable)."""
        if h.status is Status.HEALTHY:
            return (self.healthy,)
        if h.status is Status.DEGRADED:
            return (self.degraded, self.probe) if h.slow_only else (self.degraded,)
        return ()

    def _schedule(self, endpoint_id: str, h: Health) -> None:
        if h.changes_at < INF:
            heapq.heappush(self.due, (h.changes_at, endpoint_id))
            if len(self.due) > 4 * len(self.placed) + 64:  # drop stale entries now and then
                self.due = [(p.changes_at, e) for e, p in self.placed.items() if p.changes_at < INF]
                heapq.heapify(self.due)

    def expire(self, now: float, rederive: Callable[[str], Health | None]) -> None:
        """Re-place every member whose status may have changed by ``now``."""
        due = self.due
        while due and due[0][0] < now:
            at, endpoint_id = heapq.heappop(due)
            h = self.placed.get(endpoint_id)
            if h is not None and h.changes_at == at:  # else a stale entry: re-placed since
                self.place(endpoint_id, rederive(endpoint_id))


def build_tiers(
    ids: Iterable[str],
    get: Callable[[str], EndpointRecord | None],
    stats: Mapping[str, EndpointStats],
    now: float,
    t: Thresholds,
) -> Tiers:
    """Split candidate ``ids`` into health tiers at ``now`` (liveness clock)."""
    tiers = Tiers()
    for endpoint_id in ids:
        record = get(endpoint_id)
        if record is not None:
            tiers.place(endpoint_id, derive(record.last_seen, stats.get(endpoint_id), now, t))
    return tiers


def _p2c(ids: list[str], stats: Mapping[str, EndpointStats], now: float, rng: random.Random) -> str:
    n = len(ids)
    if n == 1:
        return ids[0]
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1
    a, b = ids[i], ids[j]
    sa, sb = stats.get(a), stats.get(b)
    score_a = sa.score(now) if sa is not None else 1.0
    score_b = sb.score(now) if sb is not None else 1.0
    return a if score_a <= score_b else b


def pick(
    tiers: Tiers,
    stats: Mapping[str, EndpointStats],
    now: float,
    rng: random.Random,
    exclude: Collection[str] = (),
    probe_share: float = PROBE_SHARE,
) -> str | None:
    """Choose one endpoint of ``tiers`` (None when no eligible one is left).

    ``exclude`` holds endpoints already tried for this request (failover goes elsewhere).
    """
    healthy, degraded, probe = tiers.healthy, tiers.degraded, tiers.probe
    if exclude:
        healthy = [e for e in healthy if e not in exclude]
        degraded = [e for e in degraded if e not in exclude]
        probe = [e for e in probe if e not in exclude]
    if healthy:
        if probe and rng.random() < probe_share:
            return probe[rng.randrange(len(probe))]
        return _p2c(healthy, stats, now, rng)
    if degraded:
        return _p2c(degraded, stats, now, rng)
    return None
