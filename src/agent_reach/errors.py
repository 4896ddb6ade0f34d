"""The whole exception tree of Agent-Reach.

Every error carries the wire contract's error ``code`` and its HTTP ``status``; the HTTP edge
renders any of them as ``{"ok": false, "error": code, "detail": str(exc), ...}`` from one table.

::

    AgentReachError                      (code, status, detail)
    ├── InvalidRequest                   invalid_request        400 / 422
    ├── PayloadTooLarge                  payload_too_large      413
    ├── EndpointNotRegistered            endpoint_not_registered 404
    ├── TraceNotFound                    trace_not_found        404
    ├── NotFound                         not_found              404 (no such path)
    ├── MethodNotAllowed                 method_not_allowed     405
    └── ReachError                       (+ msg_id, trace_id, attempts): answers of /v1/send
        ├── NoCapableAgent               no_capable_agent       404
        ├── RecipientNotFound            recipient_not_found    404
        ├── RecipientIncapable           recipient_incapable    422
        ├── NoAvailableAgent             no_available_agent     503
        ├── AgentError                   agent_error            502
        ├── AllAttemptsFailed            all_attempts_failed    502
        └── DeadlineExceeded             deadline_exceeded      504

Adapters (registry, transport) translate third-party exceptions into these with
``raise ... from exc``; nothing from aiohttp or redis leaks past them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentError",
    "AgentReachError",
    "AllAttemptsFailed",
    "DeadlineExceeded",
    "EndpointNotRegistered",
    "InvalidRequest",
    "MethodNotAllowed",
    "NoAvailableAgent",
    "NoCapableAgent",
    "NotFound",
    "PayloadTooLarge",
    "ReachError",
    "RecipientIncapable",
    "RecipientNotFound",
    "TraceNotFound",
]


class AgentReachError(Exception):
    """Root of every error Agent-Reach raises on purpose."""

    code: str = "internal_error"
    status: int = 500

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fields: dict[str, Any] = fields

    def to_body(self) -> dict[str, Any]:
        """The contract's error body: ``ok``, ``error``, ``detail`` and any extra fields."""
        return {"ok": False, "error": self.code, "detail": self.detail, **self.fields}


class InvalidRequest(AgentReachError):
    """The body is not JSON (400) or not of the shape asked for (422)."""

    code = "invalid_request"
    status = 422

    def __init__(self, detail: str, *, status: int = 422, field: str | None = None) -> None:
        super().__init__(detail, **({"field": field} if field else {}))
        self.status = status


class PayloadTooLarge(AgentReachError):
    """The request body is over the gateway's size limit."""

    code = "payload_too_large"
    status = 413


class EndpointNotRegistered(AgentReachError):
    """No record with that endpoint id (heartbeat, deregister, lookup)."""

    code = "endpoint_not_registered"
    status = 404


class TraceNotFound(AgentReachError):
    """No recent request carries that trace id."""

    code = "trace_not_found"
    status = 404


class NotFound(AgentReachError):
    """No such path in the HTTP API."""

    code = "not_found"
    status = 404


class MethodNotAllowed(AgentReachError):
    """The path exists, but not for this method."""

    code = "method_not_allowed"
    status = 405


class ReachError(AgentReachError):
    """An answer of ``/v1/send`` (or of the ``/v1/route`` dry run) that is not a success.

    ``msg_id``, ``trace_id`` and ``attempts`` are filled in by the delivery loop before the error
    reaches the HTTP edge, so that every error answer of ``/v1/send`` carries them.
    """

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail, **fields)


class NoCapableAgent(ReachError):
    """No endpoint declares the intent, and no fallback match reaches the threshold."""

    code = "no_capable_agent"
    status = 404


class RecipientNotFound(ReachError):
    """``recipient_hint`` names an endpoint that is not registered."""

    code = "recipient_not_found"
    status = 404


class RecipientIncapable(ReachError):
    """``recipient_hint`` names an endpoint that does not declare the intent."""

    code = "recipient_incapable"
    status = 422


class NoAvailableAgent(ReachError):
    """Capable endpoints exist but none may be routed to now (suspect, down or ejected)."""

    code = "no_available_agent"
    status = 503


class AgentError(ReachError):
    """The agent answered 4xx: not retried, passed back to the caller."""

    code = "agent_error"
    status = 502


class AllAttemptsFailed(ReachError):
    """Retries, the retry budget or the candidates ran out before the deadline."""

    code = "all_attempts_failed"
    status = 502


class DeadlineExceeded(ReachError):
    """The caller's deadline ran out (or left no room for another attempt)."""

    code = "deadline_exceeded"
    status = 504
