"""Routing choice: which endpoints may serve an intent, and which one gets this request.

Invariants:
- Only exact tag matches are candidates, unless there are none: then the fallback matcher's
  best-scoring tags at or above the confidence threshold are (a fallback never mixes with exact).
- Intent routing chooses healthy before degraded; suspect and down never (suspect only by hint).
- Among equals the choice is power of two choices over peak-EWMA x (in-flight + 1), so that
  equal endpoints share load and the single fastest one is not flooded.
- Probes: while healthy ones exist, at most ``probe_share`` of an intent's requests go to a
  probe-eligible endpoint: a slow one (degraded only by latency), so that it can show it is fast
  again, or a recovering one (ejected or penalized, past its backoff), so that an agent that is
  back is seen to be back. A recovering endpoint gets one probe at a time.
- Bounds: with ``bound``, an endpoint with ``bound`` attempts open (in flight, plus slots
  reserved for requests woken to take them) is skipped like an ineligible candidate. Drawing
  skips such endpoints by rejection, so that the choice costs O(1) unless most are at their
  bound, and consumes the same random numbers as an unbounded choice when none is.
- Waiting: requests wait for a slot in priority order, ``high`` before ``normal`` before
  ``low``, first come first served within one (:data:`PRIORITY_RANK`); the wait queue of one
  intent takes ``low`` up to 70 % of its bound, ``normal`` to 90 %, ``high`` to 100 %
  (:func:`wait_admits`, the admission's shares).
- :class:`Tiers` holds each member in the tier of its health at the last time it was placed;
  the owner re-places a member on every event that touches it, and :meth:`Tiers.expire`
  re-places members whose status may have changed by time alone.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from agent_reach.core.admission import share_of
from agent_reach.core.health import INF, EndpointStats, Health, derive
from agent_reach.core.model import EndpointRecord, Status, Thresholds

__all__ = [
    "PRIORITY_RANK",
    "PROBE_SHARE",
    "Tiers",
    "at_bound",
    "build_tiers",
    "pick",
    "rank_of",
    "wait_admits",
    "wait_limit",
]

PROBE_SHARE = 0.02  # contract: at most 5 % of an intent's requests
PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}  # who is served first when slots are scarce
_DRAWS = 4  # random draws tried before falling back to filtering out endpoints at their bound
_NO_RESERVATIONS: Mapping[str, int] = {}


def rank_of(priority: str | None) -> int:
    """The serving rank of ``priority`` (lower first; unknown or None: ``normal``)."""
    return PRIORITY_RANK.get(priority or "normal", PRIORITY_RANK["normal"])


def wait_limit(bound: int, priority: str | None) -> int:
    """How many may wait in a queue of at most ``bound`` when a request of ``priority`` comes:
    ``low`` up to 70 % of it, ``normal`` 90 %, ``high`` 100 % (at least 1)."""
    return share_of(bound, priority)


def wait_admits(waiting: int, bound: int, priority: str | None) -> bool:
    """Whether a request of ``priority`` may join a wait queue of at most ``bound`` that
    holds ``waiting`` (:func:`wait_limit`)."""
    return waiting < wait_limit(bound, priority)


def at_bound(stats: EndpointStats | None, reserved: int, bound: int) -> bool:
    """Whether an endpoint has ``bound`` attempts open: in flight plus ``reserved`` slots."""
    return (stats.inflight if stats is not None else 0) + reserved >= bound


def _routable(h: Health) -> bool:
    return h.status is Status.HEALTHY or h.status is Status.DEGRADED


def _tier_of(h: Health) -> tuple[bool, bool, bool]:
    return (h.status is Status.HEALTHY, h.status is Status.DEGRADED, h.probe)


@dataclass(slots=True)
class Tiers:
    """The routable endpoints of one intent, split by health, kept up to date incrementally.

    A member is re-placed when an event touches it (:meth:`place`) or when its own next status
    change by time comes (:meth:`expire`), so neither a heartbeat nor the passing of time costs
    a rebuild of the whole intent.
    """

    healthy: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    probe: list[str] = field(default_factory=list)  # slow only, or recovering and due a probe
    unavailable: int = 0  # suspect, down or ejected candidates (probe-eligible ones included)
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
            for members in self._lists(old):
                members.remove(endpoint_id)
            self.unavailable -= not _routable(old)
        if h is None:
            return
        self.placed[endpoint_id] = h
        for members in self._lists(h):
            members.append(endpoint_id)
        self.unavailable += not _routable(h)
        self._schedule(endpoint_id, h)

    def _lists(self, h: Health) -> tuple[list[str], ...]:
        """The tier lists a member of health ``h`` belongs in (none: unavailable, unprobed)."""
        if h.status is Status.HEALTHY:
            return (self.healthy, self.probe) if h.probe else (self.healthy,)
        if h.status is Status.DEGRADED:
            return (self.degraded, self.probe) if h.probe else (self.degraded,)
        return (self.probe,) if h.probe else ()  # ejected, due a probe

    def _schedule(self, endpoint_id: str, h: Health) -> None:
        if h.changes_at < INF:
            heapq.heappush(self.due, (h.changes_at, endpoint_id))
            if len(self.due) > 4 * len(self.placed) + 64:  # drop stale entries now and then
                self.due = [(p.changes_at, e) for e, p in self.placed.items() if p.changes_at < INF]
                heapq.heapify(self.due)

    def expire(self, now: float, rederive: Callable[[str], Health | None]) -> None:
        """Re-place every member whose status may have changed by ``now``: those due by then,
        each once (a new due time that is still before ``now`` waits for the next call: were
        it taken again here, a derivation that disagreed with its own due time by a rounding
        would loop for ever)."""
        due = self.due
        if not due or due[0][0] >= now:  # the common case: nothing due (no list made)
            return
        popped = []
        while due and due[0][0] < now:
            popped.append(heapq.heappop(due))
        for at, endpoint_id in popped:
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


def _draw(
    ids: list[str], rng: random.Random, skip: Callable[[str], bool] | None, other: int = -1
) -> int | None:
    """A uniform index into ``ids`` (not ``other``) whose endpoint ``skip`` does not refuse, by
    rejection; None when ``_DRAWS`` draws all hit refused ones (the caller filters then)."""
    n = len(ids) if other < 0 else len(ids) - 1
    for _ in range(_DRAWS):
        k = rng.randrange(n)
        if other >= 0 and k >= other:
            k += 1
        if skip is None or not skip(ids[k]):
            return k
    return None


def _p2c(
    ids: list[str],
    stats: Mapping[str, EndpointStats],
    now: float,
    rng: random.Random,
    skip: Callable[[str], bool] | None = None,
) -> str | None:
    """Power of two choices over ``ids`` less those ``skip`` refuses (None: none left)."""
    n = len(ids)
    if n == 0:
        return None
    if n == 1:
        return None if skip is not None and skip(ids[0]) else ids[0]
    i = _draw(ids, rng, skip)
    j = None if i is None else _draw(ids, rng, skip, other=i)
    if j is None:  # most are refused: choose among the others, listed
        assert skip is not None
        left = [e for e in ids if not skip(e)]
        return _p2c(left, stats, now, rng) if left else None
    assert i is not None
    a, b = ids[i], ids[j]
    sa, sb = stats.get(a), stats.get(b)
    score_a = sa.score(now) if sa is not None else 1.0
    score_b = sb.score(now) if sb is not None else 1.0
    return a if score_a <= score_b else b


def _probe(ids: list[str], rng: random.Random, skip: Callable[[str], bool]) -> str | None:
    """A uniform choice among the probe-eligible ``ids`` that ``skip`` does not refuse."""
    k = _draw(ids, rng, skip)
    if k is not None:
        return ids[k]
    left = [e for e in ids if not skip(e)]
    return left[rng.randrange(len(left))] if left else None


def pick(
    tiers: Tiers,
    stats: Mapping[str, EndpointStats],
    now: float,
    rng: random.Random,
    exclude: Collection[str] = (),
    probe_share: float = PROBE_SHARE,
    bound: int | None = None,
    reserved: Mapping[str, int] = _NO_RESERVATIONS,
) -> str | None:
    """Choose one endpoint of ``tiers`` (None when no eligible one is left).

    ``exclude`` holds endpoints already tried for this request (failover goes elsewhere).
    With ``bound``, endpoints with that many attempts open (:func:`at_bound`, counting the
    ``reserved`` slots) are skipped: healthy ones first, then degraded ones.
    """
    healthy, degraded, probe = tiers.healthy, tiers.degraded, tiers.probe
    if exclude:
        healthy = [e for e in healthy if e not in exclude]
        degraded = [e for e in degraded if e not in exclude]
        probe = [e for e in probe if e not in exclude]
    full: Callable[[str], bool] | None = None
    if bound is not None:
        limit = bound

        def full(endpoint_id: str) -> bool:
            return at_bound(stats.get(endpoint_id), reserved.get(endpoint_id, 0), limit)

    if healthy:
        if probe and rng.random() < probe_share:

            def busy(endpoint_id: str) -> bool:
                # a recovering endpoint gets one probe at a time
                s = stats.get(endpoint_id)
                if s is not None and s.recovering and s.inflight > 0:
                    return True
                return full is not None and full(endpoint_id)

            chosen = _probe(probe, rng, busy)
            if chosen is not None:
                return chosen
        chosen = _p2c(healthy, stats, now, rng, full)
        if chosen is not None or full is None:
            return chosen
    if degraded:
        return _p2c(degraded, stats, now, rng, full)
    return None
