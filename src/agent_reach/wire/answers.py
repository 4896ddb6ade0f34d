"""The answers of the gateway's HTTP API as the client SDK returns them (parsed from the
contract's JSON by msgspec). Public through :mod:`agent_reach.sdk.client`.

Fields a later gateway adds are ignored when parsing; fields with defaults may be absent."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AgentInfo",
    "AgentList",
    "Attempt",
    "Candidate",
    "HeartbeatAnswer",
    "IntentInfo",
    "IntentsAnswer",
    "IssuedToken",
    "MatchInfo",
    "Ok",
    "Registration",
    "Reply",
    "RouteExplanation",
    "Suggestion",
    "Trace",
]


class Attempt(msgspec.Struct, frozen=True, omit_defaults=True):
    """One delivery attempt of a send: to which endpoint, how it ended, how long it took.
    ``domain``: the domain it was forwarded to (federation; absent for a local attempt).
    ``hedge``: a hedged attempt, sent while an earlier one had not answered (absent when false);
    the attempt that lost the race has the outcome ``timeout`` (its trace event says
    ``cancelled: true``)."""

    endpoint_id: str
    outcome: str
    latency_ms: float
    domain: str | None = None
    hedge: bool = False


class MatchInfo(msgspec.Struct, frozen=True):
    """How the request's tag was found: ``method`` is exact, alias, semantic, lexical or
    hint; ``tag`` the tag routed on; ``confidence`` in [0, 1] (1.0 for exact, alias, hint)."""

    method: str
    tag: str
    confidence: float


class Suggestion(msgspec.Struct, frozen=True):
    """A tag near what a refused request asked for, with its confidence (below the
    threshold)."""

    tag: str
    confidence: float


class Reply(msgspec.Struct, frozen=True):
    """A successful send: the agent's ``result`` and how it was reached."""

    msg_id: str
    trace_id: str
    intent: str
    endpoint_id: str
    result: Any
    attempts: list[Attempt]
    latency_ms: float
    match: MatchInfo | None = None  # None only from gateways older than contract v1.1
    ok: bool = True  # the gateway's success answers say so; last, so it may be left out


class AgentInfo(msgspec.Struct, frozen=True):
    """One registered endpoint as ``GET /v1/agents`` lists it."""

    endpoint_id: str
    capabilities: list[str]
    endpoint_url: str
    status: str
    last_seen_at: float
    description: str = ""
    avg_latency_ms: float | None = None
    p95_latency_ms: float | None = None


class AgentList(msgspec.Struct, frozen=True):
    """``GET /v1/agents``: every registered endpoint."""

    agents: list[AgentInfo]


class Candidate(msgspec.Struct, frozen=True):
    """One candidate of a route explanation, and why it is (not) eligible."""

    endpoint_id: str
    status: str
    confidence: float
    eligible: bool
    reason: str
    avg_latency_ms: float | None = None
    p95_latency_ms: float | None = None
    chosen: bool = False
    match: MatchInfo | None = None


class RouteExplanation(msgspec.Struct, frozen=True):
    """The dry run of ``GET /v1/route``: the route a send would take now."""

    intent: str
    chosen: str | None
    candidates: list[Candidate]
    per_try_timeout_ms: float | None = None
    max_retries: int = 0
    match: MatchInfo | None = None
    runners_up: list[Suggestion] = msgspec.field(default_factory=list)


class Trace(msgspec.Struct, frozen=True):
    """The recorded hops of one request (``GET /v1/traces/TRACE_ID``)."""

    trace_id: str
    events: list[dict[str, Any]]


class Registration(msgspec.Struct, frozen=True):
    """The gateway's answer to a registration: the heartbeat interval to keep and, in token
    mode, the endpoint token that heartbeats, deregisters and sends as this id."""

    endpoint_id: str
    heartbeat_interval_s: float
    token: str | None = None
    token_expires_at: float | None = None
    ok: bool = True


class HeartbeatAnswer(msgspec.Struct, frozen=True):
    """The gateway's answer to a heartbeat: the endpoint's status now and, in token mode once
    half the endpoint token's life is gone, a renewed endpoint token that replaces it."""

    endpoint_id: str
    status: str
    token: str | None = None
    token_expires_at: float | None = None
    ok: bool = True


class Ok(msgspec.Struct, frozen=True):
    """``{"ok": true}``: the answer of ``POST /v1/deregister`` and of ``GET /healthz``."""

    ok: bool = True


class IssuedToken(msgspec.Struct, frozen=True):
    """A token made by ``POST /v1/tokens`` (operator)."""

    kind: str
    subject: str
    token: str
    expires_at: float


class IntentInfo(msgspec.Struct, frozen=True):
    """One tag of ``GET /v1/intents``: a dictionary entry (``known``) or a tag some agent
    registered outside the dictionary (``known`` false, no texts). ``served_by`` counts the
    registered endpoints declaring it, ``routable`` those healthy or degraded now; a deprecated
    entry says what replaces it (``replaced_by``)."""

    tag: str
    description: str = ""
    aliases: list[str] = []
    examples: list[str] = []
    deprecated: bool = False
    replaced_by: str | None = None
    known: bool = False
    served_by: int = 0
    routable: int = 0


class IntentsAnswer(msgspec.Struct, frozen=True):
    """``GET /v1/intents``: the registration mode (open, warn, strict) and every dictionary
    entry (file order), then every registered tag outside the dictionary (sorted)."""

    mode: str
    intents: list[IntentInfo]
