"""Reading a live gateway into a :class:`~agent_reach.doctor.snapshot.Snapshot`.

:func:`gather` is the doctor's only I/O, and it does none itself: it calls two injected async
getters (the command line passes the client SDK's, tests pass urllib or dictionaries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from agent_reach.doctor.snapshot import (
    ATTEMPTS,
    REQUESTS,
    Diagnostics,
    Snapshot,
    parse_metrics,
)
from agent_reach.errors import AgentReachError, GatewayUnavailable

__all__ = ["ROUTE_LIMIT", "GetJson", "GetText", "gather"]

ROUTE_LIMIT = 256
"""Intents :func:`gather` explains at most (callers' intents first, then tags with traffic)."""

GetJson = Callable[[str], Awaitable[Any]]
GetText = Callable[[str], Awaitable[str]]


async def gather(
    get_json: GetJson,
    get_text: GetText,
    *,
    now: float,
    heartbeat_interval: float | None = None,
    intents: Iterable[str] = (),
    timeout_ms: int | None = None,
    route_limit: int = ROUTE_LIMIT,
) -> Snapshot:
    """Read ``/v1/agents``, ``/v1/diagnostics``, ``/metrics`` and ``/v1/route`` for each intent
    into a snapshot.

    ``get_json(path)`` answers the parsed JSON body of ``GET path`` (path with query, from the
    gateway's root). An error answer may come back either as its body or as the typed error the
    client SDK raises; :class:`GatewayUnavailable` and any other exception propagate.
    ``get_text(path)`` answers the text body. ``now`` is unix seconds, read by the caller.

    ``/v1/diagnostics`` (an extension beyond contract v1) gives the gateway's heartbeat interval,
    thresholds and overhead reserve, and the intents it refused as ``no_capable_agent``; a
    gateway without it (404 ``not_found``) leaves ``Snapshot.diagnostics`` None, and the checks
    assume the defaults. The intents callers use are ``intents`` (the operator's), then the
    gateway's refused ones, most recent first; they are explained first, then the declared
    tags with traffic, then the others, up to ``route_limit`` in all. ``heartbeat_interval``
    (the operator's) counts only when the gateway does not say its own.
    """
    listing = await get_json("/v1/agents")
    if not isinstance(listing, dict) or not isinstance(listing.get("agents"), list):
        raise GatewayUnavailable("the answer of /v1/agents is not the contract's")
    agents = tuple(a for a in listing["agents"] if isinstance(a, dict))
    diagnostics = await _diagnostics(get_json)
    metrics = parse_metrics(await get_text("/metrics"))
    refused = diagnostics.unrouted_intents if diagnostics is not None else ()
    asked = tuple(dict.fromkeys([*intents, *(u.intent for u in refused)]))
    declared = sorted({t for a in agents for t in a.get("capabilities", ())})
    busy = {s.labels.get("intent") for s in metrics if s.name in (REQUESTS, ATTEMPTS) and s.value}
    order = list(dict.fromkeys([*asked, *(t for t in declared if t in busy), *declared]))
    routes: dict[str, Mapping[str, Any]] = {}
    refused_now = {u.intent for u in refused} - set(declared)
    for intent in order[:route_limit]:
        # an intent callers were refused, and nobody declares: explained as an exact tag (the
        # callers may have forbidden matching; the matcher's nearest tags come with the answer)
        exact = intent in refused_now
        routes[intent] = await _explain(get_json, intent, timeout_ms, exact=exact)
    skipped = len(set(declared) - routes.keys())
    if diagnostics is not None:
        heartbeat_interval = diagnostics.heartbeat_interval_s
    return Snapshot(
        agents,
        routes,
        metrics,
        now,
        heartbeat_interval,
        asked,
        timeout_ms,
        routes_skipped=skipped,
        diagnostics=diagnostics,
    )


async def _diagnostics(get_json: GetJson) -> Diagnostics | None:
    """The gateway's ``/v1/diagnostics``, or None when it has no such path (an older gateway)."""
    try:
        answer = await get_json("/v1/diagnostics")
    except AgentReachError as exc:
        # the client SDK raises error answers as typed errors; a 404 without the contract's body
        # (a proxy in front of an older gateway) comes as GatewayUnavailable with its status
        if exc.code == "not_found" or exc.fields.get("http_status") == 404:
            return None
        raise
    if isinstance(answer, dict) and answer.get("ok") is False:
        if answer.get("error") == "not_found":
            return None
        raise GatewayUnavailable(
            f"/v1/diagnostics answered {answer.get('error')}: {answer.get('detail')}"
        )
    try:
        return Diagnostics.from_answer(answer)
    except ValueError as exc:
        raise GatewayUnavailable(
            f"the answer of /v1/diagnostics is not the gateway's: {exc}"
        ) from None


async def _explain(
    get_json: GetJson, intent: str, timeout_ms: int | None, *, exact: bool = False
) -> Mapping[str, Any]:
    query = {"intent": intent} | ({"timeout_ms": str(timeout_ms)} if timeout_ms else {})
    if exact:
        query["fallback"] = "false"
    try:
        answer = await get_json(f"/v1/route?{urlencode(query)}")
    except GatewayUnavailable:
        raise
    except AgentReachError as exc:  # the client SDK raises error answers as typed errors
        return exc.to_body()
    if not isinstance(answer, dict):
        raise GatewayUnavailable(f"the answer of /v1/route for {intent!r} is not an object")
    return answer
