"""A domain's summary from its own tiers: counts only (CONTRACT.md v1.1, "Federation").

Pure: the caller hands in the tags, a way to read each tag's tiers and the endpoints' stats.
Per tag: the healthy and degraded endpoints now, the lowest p95 among them (the healthy tier's
first: where most traffic goes), and the attempts in flight across them. A tag whose endpoints
are all suspect or down is left out: another domain could not be served by it anyway.
:func:`trim_summary` cuts a summary to what a directory takes (its least-served tags first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from agent_reach.core.health import EndpointStats
from agent_reach.core.routing import Tiers
from agent_reach.wire.federation import (
    ENTRY_OVERHEAD_BYTES,
    MAX_SUMMARY_INTENTS,
    TAG_OVERHEAD_BYTES,
    DomainSummary,
    IntentSummary,
    estimated_bytes,
)

__all__ = ["MAX_SUMMARY_BYTES", "build_summary", "trim_summary"]

# what a summary is cut to before it is published: under the directory's default body cap
# (--max-body-bytes, 16 MiB), which refuses the whole summary past it
MAX_SUMMARY_BYTES = 15 << 20


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


def trim_summary(
    summary: DomainSummary,
    max_intents: int = MAX_SUMMARY_INTENTS,
    max_bytes: int = MAX_SUMMARY_BYTES,
) -> tuple[DomainSummary, int]:
    """``summary`` within what a directory takes (the contract's count of tags, and about
    ``max_bytes`` of JSON), and how many tags were left out to make it so: those with the
    fewest healthy, then degraded, endpoints go first (then by name, so the cut is stable).
    A directory refuses a summary over its bounds whole, which would take the domain out of
    the federation for the sake of its least-served tags."""
    if len(summary.intents) <= max_intents and estimated_bytes(summary) <= max_bytes:
        return summary, 0
    ranked = sorted(
        summary.intents.items(), key=lambda item: (-item[1].healthy, -item[1].degraded, item[0])
    )
    kept: dict[str, IntentSummary] = {}
    size = ENTRY_OVERHEAD_BYTES + len(summary.gateway_url)
    for tag, counts in ranked:
        size += len(tag) + TAG_OVERHEAD_BYTES
        if len(kept) >= max_intents or size > max_bytes:
            break
        kept[tag] = counts
    trimmed = DomainSummary(summary.domain, summary.gateway_url, summary.at, kept)
    return trimmed, len(summary.intents) - len(kept)
