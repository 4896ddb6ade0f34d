"""Explaining a route without delivering (``GET /v1/route``) and the diagnostics answer.

Read-only over a :class:`~agent_reach.gateway.router.Router`: the same plan and choice a send
would make now, with every candidate's status and why it is (not) eligible. The diagnostics
answer names, for each intent refused as ``no_capable_agent``, the nearest known tags
(:func:`with_suggestions`, awaited: the matcher runs off the event loop).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from agent_reach.core.model import ROUTABLE, Status
from agent_reach.errors import Overloaded
from agent_reach.gateway.listing import Routable, sorted_in_turns
from agent_reach.wire.answers import IntentInfo, IntentsAnswer

if TYPE_CHECKING:
    from agent_reach.gateway.matching import Match
    from agent_reach.gateway.router import RoutePlan, Router, RouteScope
    from agent_reach.intents.dictionary import IntentDictionary

__all__ = ["candidates", "diagnostics", "explain_route", "with_suggestions"]


def explain_route(
    router: Router,
    match: Match,
    hint: str | None,
    timeout_ms: int | None,
    scope: RouteScope | None = None,
) -> dict[str, Any]:
    """The ``/v1/route`` answer: the route a send would take now, delivering nothing."""
    plan = router.plan(match, hint, scope=scope)
    # the choice of a send that is not one of the probe share's (2 %: a recovering or slow
    # endpoint's probes; the candidates say which are due one), so that the answer is steady
    chosen = router.choose(plan, probes=False)
    per_try = router.per_try_ms(chosen) if chosen else None
    timeout = timeout_ms or router.settings.default_timeout_ms
    return {
        "ok": True,
        "intent": plan.intent,
        "match": match.info(),
        # beyond the contract: the other tags the matcher ranked (agent-reach intents match)
        "runners_up": [{"tag": tag, "confidence": round(c, 4)} for tag, c in match.runners_up],
        "chosen": chosen,
        "per_try_timeout_ms": per_try,
        "max_retries": router.max_retries(timeout, per_try) if per_try else 0,
        "candidates": candidates(router, plan, chosen),
    }


def candidates(router: Router, plan: RoutePlan, chosen: str | None) -> list[dict[str, Any]]:
    """Every candidate of ``plan`` with its status, its match and why it is (not) eligible."""
    now = router.now()
    if plan.hint is not None:
        ids: Collection[str] = (plan.hint,)
    elif plan.ids:
        ids = plan.ids
    else:
        ids = router.registry.by_intent(plan.intent)
    match = plan.match
    info = match.info()
    out = []
    for endpoint_id in ids:
        record = router.registry.get(endpoint_id)
        if record is None:
            continue
        h = router.health(record, now)
        stats = router.stats.get(endpoint_id)
        avg, p95 = stats.latency_stats() if stats else (None, None)
        if plan.hint is not None:
            eligible = h.status is not Status.DOWN
            reason = f"named by recipient_hint; {h.reason}" if eligible else f"down: {h.reason}"
        else:
            eligible = h.status in ROUTABLE
            reason = h.reason if eligible else f"{h.status.value}: {h.reason}"
            if h.status is Status.SUSPECT:
                reason += " (reachable only through recipient_hint)"
        if match.method not in ("exact", "hint"):
            reason += f"; {match.method} match on {match.tag!r}"
        out.append(
            {
                "endpoint_id": endpoint_id,
                "status": h.status.value,
                "confidence": info.confidence,
                "avg_latency_ms": None if avg is None else round(avg, 3),
                "p95_latency_ms": None if p95 is None else round(p95, 3),
                "eligible": eligible,
                "reason": reason,
                "chosen": endpoint_id == chosen,
                "match": info,
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


async def with_suggestions(router: Router, answer: dict[str, Any]) -> dict[str, Any]:
    """The diagnostics ``answer`` with, on each unrouted intent, ``suggestions``: the nearest
    known tags (``{"tag", "confidence"}``, at most 3, best first; :meth:`Router.suggest`). The
    lookups run one after the other; when the matcher is overloaded the rest go without."""
    for item in answer.get("unrouted_intents", ()):
        try:
            item["suggestions"] = await router.suggest(item["intent"], None)
        except Overloaded:
            break
    return answer


async def intents_listing(router: Router, dictionary: IntentDictionary, mode: str) -> IntentsAnswer:
    """The ``GET /v1/intents`` answer: the registration mode, every dictionary entry (file
    order) and every registered tag outside it (sorted), each with the endpoints declaring it
    and those routable (healthy or degraded) now. Made :data:`JUDGE_CHUNK` endpoints at a time
    (:class:`Routable`), the loop serving others between (at 50,000 tags it held the loop
    ~180 ms in one go; a chunk of tags ~30 ms with ten endpoints a tag)."""
    routable = Routable(router)
    out = []
    for entry in dictionary:
        served, n = await routable.count(entry.tag)
        out.append(
            IntentInfo(
                entry.tag,
                entry.description,
                list(entry.aliases),
                list(entry.examples),
                entry.deprecated,
                entry.replaced_by,
                known=True,
                served_by=served,
                routable=n,
            )
        )
    tags = await sorted_in_turns(t for t in router.registry.intents() if t not in dictionary)
    for tag in tags:
        served, n = await routable.count(tag)
        out.append(IntentInfo(tag, served_by=served, routable=n))
    return IntentsAnswer(mode, out)
