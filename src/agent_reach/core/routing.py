"""Routing choice: which endpoints may serve an intent, and which one gets this request.

Invariants:
- Only exact tag matches are candidates, unless there are none: then the fallback matcher's
  best-scoring tags at or above the confidence threshold are (a fallback never mixes with exact).
- Intent routing chooses healthy before degraded; suspect and down never (suspect only by hint).
- Among equals the choice is power of two choices over peak-EWMA x (in-flight + 1), so that
  equal endpoints share load and the single fastest one is not flooded.
- A slow (degraded only by latency) endpoint gets at most ``probe_share`` of its intent's
  requests while healthy ones exist, so that it can show it is fast again.
- :class:`Tiers` is valid while ``now < valid_until`` and no event changed its members.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from agent_reach.core.health import INF, EndpointStats, Health, derive
from agent_reach.core.intents import FallbackMatcher
from agent_reach.core.model import EndpointRecord, Status, Thresholds

__all__ = ["PROBE_SHARE", "Tiers", "build_tiers", "fallback_tags", "pick"]

PROBE_SHARE = 0.02  # contract: at most 5 % of an intent's requests


@dataclass(slots=True)
class Tiers:
    """The routable endpoints of one intent, split by health, with when that may change."""

    healthy: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    probe: list[str] = field(default_factory=list)  # degraded only for slowness
    unavailable: int = 0  # suspect, down or ejected candidates
    valid_until: float = INF
    generation: int = 0


def build_tiers(
    ids: Iterable[str],
    get: Callable[[str], EndpointRecord | None],
    stats: Mapping[str, EndpointStats],
    now: float,
    t: Thresholds,
    generation: int = 0,
) -> Tiers:
    """Split candidate ``ids`` into health tiers at ``now`` (liveness clock)."""
    tiers = Tiers(generation=generation)
    for endpoint_id in ids:
        record = get(endpoint_id)
        if record is None:
            continue
        h: Health = derive(record.last_seen, stats.get(endpoint_id), now, t)
        tiers.valid_until = min(tiers.valid_until, h.changes_at)
        if h.status is Status.HEALTHY:
            tiers.healthy.append(endpoint_id)
        elif h.status is Status.DEGRADED:
            tiers.degraded.append(endpoint_id)
            if h.slow_only:
                tiers.probe.append(endpoint_id)
        else:
            tiers.unavailable += 1
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


def fallback_tags(
    matcher: FallbackMatcher, intent: str, known: Iterable[str], threshold: float
) -> dict[str, float]:
    """The best-scoring known tags at or above ``threshold`` (ties kept), with their scores."""
    scores = {tag: s for tag, s in matcher.scores(intent, known).items() if s >= threshold}
    if not scores:
        return {}
    best = max(scores.values())
    return {tag: s for tag, s in scores.items() if s == best}
