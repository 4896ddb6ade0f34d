"""A domain's summary from its own tiers: counts only (CONTRACT.md v1.1, "Federation").

Pure: the caller hands in the tags, a way to read each tag's tiers and the endpoints' stats.
Per tag: the healthy and degraded endpoints now, the lowest p95 among them (the healthy tier's
first: where most traffic goes), and the attempts in flight across them. A tag whose endpoints
are all suspect or down is left out: another domain could not be served by it anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from agent_reach.core.health import EndpointStats
from agent_reach.core.routing import Tiers
from agent_reach.wire.federation import DomainSummary, IntentSummary

__all__ = ["build_summary"]


def build_summary(
    domain: str,
    gateway_url: str,
    at: float,
    tags: Iterable[str],
    tiers_of: Callable[[str], Tiers],
    stats: Mapping[str, EndpointStats],
) -> DomainSummary:
    """The summary of ``domain`` made at ``at`` (unix seconds)."""
    intents: dict[str, IntentSummary] = {}
    for tag in tags:
        tiers = tiers_of(tag)
        if not tiers.healthy and not tiers.degraded:
            continue
        p95: float | None = None
        inflight = 0
        for tier in (tiers.healthy, tiers.degraded):
            for endpoint_id in tier:
                s = stats.get(endpoint_id)
                if s is None:
                    continue
                inflight += max(0, s.inflight)
                value = s.p95_ms()
                if value is not None and (p95 is None or value < p95):
                    p95 = value
            if p95 is not None and tier is tiers.healthy:
                # the healthy tier's best is the figure; degraded ones still add their load
                for endpoint_id in tiers.degraded:
                    s = stats.get(endpoint_id)
                    inflight += max(0, s.inflight) if s is not None else 0
                break
        intents[tag] = IntentSummary(
            len(tiers.healthy),
            len(tiers.degraded),
            None if p95 is None else round(p95, 3),
            inflight,
        )
    return DomainSummary(domain, gateway_url, round(at, 3), intents)
