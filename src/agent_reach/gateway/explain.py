"""Explaining a route without delivering (``GET /v1/route``) and the diagnostics answer.

Read-only over a :class:`~agent_reach.gateway.router.Router`: the same plan and choice a send
would make now, with every candidate's status and why it is (not) eligible.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from agent_reach.core.model import Status

if TYPE_CHECKING:
    from agent_reach.gateway.router import RoutePlan, Router, RouteScope

__all__ = ["candidates", "diagnostics", "explain_route"]


def explain_route(
    router: Router,
    intent: str,
    hint: str | None,
    timeout_ms: int | None,
    scope: RouteScope | None = None,
) -> dict[str, Any]:
    """The ``/v1/route`` answer: the route a send would take now, delivering nothing."""
    plan = router.plan(intent, hint, dry_run=True, scope=scope)
    chosen = router.choose(plan)
    per_try = router.per_try_ms(chosen) if chosen else None
    timeout = timeout_ms or router.settings.default_timeout_ms
    return {
        "ok": True,
        "intent": intent,
        "chosen": chosen,
        "per_try_timeout_ms": per_try,
        "max_retries": router.max_retries(timeout, per_try) if per_try else 0,
        "candidates": candidates(router, plan, chosen),
    }


def candidates(router: Router, plan: RoutePlan, chosen: str | None) -> list[dict[str, Any]]:
    """Every candidate of ``plan`` with its status and why it is (not) eligible."""
    now = router.now()
    if plan.hint is not None:
        ids: Collection[str] = (plan.hint,)
    elif plan.fallback_ids:
        ids = plan.fallback_ids
    else:
        ids = router.registry.by_intent(plan.intent)
    out = []
    for endpoint_id in ids:
        record = router.registry.get(endpoint_id)
        if record is None:
            continue
        h = router.health(record, now)
        stats = router.stats.get(endpoint_id)
        avg, p95 = stats.latency_stats() if stats else (None, None)
        tag = next((t for t in plan.confidence if t in record.capabilities), plan.intent)
        if plan.hint is not None:
            eligible = h.status is not Status.DOWN
            reason = f"named by recipient_hint; {h.reason}" if eligible else f"down: {h.reason}"
        else:
            eligible = h.status in (Status.HEALTHY, Status.DEGRADED)
            reason = h.reason if eligible else f"{h.status.value}: {h.reason}"
            if h.status is Status.SUSPECT:
                reason += " (reachable only through recipient_hint)"
        if tag != plan.intent:
            reason += f"; fallback match on {tag!r}"
        out.append(
            {
                "endpoint_id": endpoint_id,
                "status": h.status.value,
                "confidence": plan.confidence.get(tag, 1.0),
                "avg_latency_ms": None if avg is None else round(avg, 3),
                "p95_latency_ms": None if p95 is None else round(p95, 3),
                "eligible": eligible,
                "reason": reason,
                "chosen": endpoint_id == chosen,
            }
        )
    return out


def diagnostics(router: Router) -> dict[str, Any]:
    """The ``/v1/diagnostics`` answer: the settings that decide health and retries, and the
    intents callers asked that no agent declares (most recently refused first)."""
    t = router.thresholds
    s = router.settings
    return {
        "ok": True,
        "heartbeat_interval_s": float(s.heartbeat_interval),
        "degraded_after_s": float(t.degraded_after),
        "suspect_after_s": float(t.suspect_after),
        "down_after_s": float(t.down_after),
        "slow_threshold_ms": float(t.slow_threshold_ms),
        "overhead_reserve_ms": float(s.overhead_reserve_ms),
        "confidence_threshold": float(s.confidence_threshold),
        "unrouted_intents": router.unrouted.to_list(),
    }
