"""Answers of the gateway's HTTP API that the client SDK does not parse into a type of its
own: the error body, plain acknowledgements, operations. With :mod:`.bodies` (requests) and
:mod:`.answers` (what the SDK returns) they describe every body of the API, and the OpenAPI
document (``GET /openapi.json``) is generated from them, so it cannot drift from the code."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agent_reach.wire.answers import AgentInfo, Attempt

__all__ = [
    "AgentsAnswer",
    "ErrorAnswer",
    "HealthAnswer",
    "HeartbeatAnswer",
    "OkAnswer",
    "RegisterAnswer",
    "SendAnswer",
]


class ErrorAnswer(msgspec.Struct):
    """Every error answer: ``ok`` false, the contract's code, a detail for a person; answers
    of ``/v1/send`` and ``/v1/route`` add ``msg_id``, ``trace_id`` and ``attempts``, others
    may add fields of their own (``field``, ``line``, ``reason``, ``retry_after_s``)."""

    error: str
    detail: str
    ok: Literal[False] = False
    msg_id: str | None = None
    trace_id: str | None = None
    attempts: list[Attempt] | None = None
    field: str | None = None


class OkAnswer(msgspec.Struct):
    """A plain acknowledgement."""

    ok: Literal[True] = True


class RegisterAnswer(msgspec.Struct):
    """``POST /v1/register``: the heartbeat interval to keep; in token mode the endpoint
    token that heartbeats, deregisters and sends as this id."""

    endpoint_id: str
    heartbeat_interval_s: float
    ok: Literal[True] = True
    token: str | None = None
    token_expires_at: float | None = None


class HeartbeatAnswer(msgspec.Struct):
    """``POST /v1/heartbeat``: the endpoint's status now (and a renewed token, token mode)."""

    endpoint_id: str
    status: Literal["healthy", "degraded", "suspect", "down"]
    ok: Literal[True] = True
    token: str | None = None
    token_expires_at: float | None = None


class AgentsAnswer(msgspec.Struct):
    """``GET /v1/agents``."""

    agents: list[AgentInfo]


class SendAnswer(msgspec.Struct):
    """``POST /v1/send`` answered by an agent: its JSON answer is ``result``."""

    msg_id: str
    trace_id: str
    intent: str
    endpoint_id: str
    result: Any
    attempts: list[Attempt]
    latency_ms: float
    ok: Literal[True] = True


class HealthAnswer(msgspec.Struct):
    """``GET /healthz``: the gateway serves; whether its shared registry is reachable."""

    ok: bool
    registry: dict[str, Any]
