"""Answers of the gateway's HTTP API that the client SDK does not parse into a type of its
own: the error body and ``/healthz``. With :mod:`.bodies` (requests) and
:mod:`.answers` (what the SDK returns) they describe every body of the API, and the OpenAPI
document (``GET /openapi.json``) is generated from them, so it cannot drift from the code."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agent_reach.wire.answers import Attempt

__all__ = ["ErrorAnswer", "HealthAnswer"]


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


class HealthAnswer(msgspec.Struct):
    """``GET /healthz``: the gateway serves; whether its shared registry is reachable."""

    ok: bool
    registry: dict[str, Any]
    nats: dict[str, Any] | None = None  # with --nats: the link's state
