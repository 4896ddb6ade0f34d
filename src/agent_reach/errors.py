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
    ├── Unauthorized                     unauthorized           401
    ├── Forbidden                        forbidden              403
    │   └── EndpointHeld                 forbidden              403 (reason: endpoint_held)
    ├── RateLimited                      rate_limited           429 (+ retry_after_s)
    ├── GatewayUnavailable               gateway_unavailable    (client side: no usable answer)
    └── ReachError                       (+ msg_id, trace_id, attempts): answers of /v1/send
        ├── NoCapableAgent               no_capable_agent       404
        ├── RecipientNotFound            recipient_not_found    404
        ├── RecipientIncapable           recipient_incapable    422
        ├── NoAvailableAgent             no_available_agent     503
        ├── AgentError                   agent_error            502
        ├── AllAttemptsFailed            all_attempts_failed    502
        └── DeadlineExceeded             deadline_exceeded      504

The client SDK turns an error answer back into the same class with :func:`error_from_answer`,
so a caller catches ``NoCapableAgent`` whether it runs in the gateway or talks to one.

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
    "EndpointHeld",
    "EndpointNotRegistered",
    "Forbidden",
    "GatewayUnavailable",
    "InvalidRequest",
    "MethodNotAllowed",
    "NoAvailableAgent",
    "NoCapableAgent",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ReachError",
    "RecipientIncapable",
    "RecipientNotFound",
    "TraceNotFound",
    "Unauthorized",
    "error_from_answer",
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


class Unauthorized(AgentReachError):
    """No or bad credentials, where the gateway requires them."""

    code = "unauthorized"
    status = 401


class Forbidden(AgentReachError):
    """The sender may not reach that intent or endpoint."""

    code = "forbidden"
    status = 403


class EndpointHeld(Forbidden):
    """Token mode: the id is registered and alive under another registration (its endpoint
    token's generation); the answer carries ``reason: endpoint_held``."""

    def __init__(self, endpoint_id: str) -> None:
        super().__init__(
            f"{endpoint_id} is registered and alive under another registration; only its "
            "endpoint token may re-register it (or wait until it is down, or have an operator "
            "deregister it)",
            reason="endpoint_held",
        )


class RateLimited(AgentReachError):
    """Too many requests; ``retry_after_s`` (from ``Retry-After``) says when to come back."""

    code = "rate_limited"
    status = 429

    @property
    def retry_after_s(self) -> float | None:
        """Seconds to wait before trying again, when the gateway said."""
        value = self.fields.get("retry_after_s")
        return float(value) if isinstance(value, int | float) else None


class GatewayUnavailable(AgentReachError):
    """Client side: the gateway could not be reached, or its answer was not the contract's.

    Never sent by a gateway. ``status`` is 503 for scripts that map errors to HTTP.
    """

    code = "gateway_unavailable"
    status = 503


class ReachError(AgentReachError):
    """An answer of ``/v1/send`` (or of the ``/v1/route`` dry run) that is not a success.

    ``msg_id``, ``trace_id`` and ``attempts`` are filled in by the delivery loop before the error
    reaches the HTTP edge, so that every error answer of ``/v1/send`` carries them.
    """

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail, **fields)

    @property
    def msg_id(self) -> str | None:
        """The request's message id."""
        value = self.fields.get("msg_id")
        return value if isinstance(value, str) else None

    @property
    def trace_id(self) -> str | None:
        """The request's trace id: look it up with ``GET /v1/traces/TRACE_ID``."""
        value = self.fields.get("trace_id")
        return value if isinstance(value, str) else None

    @property
    def attempts(self) -> list[Any]:
        """The delivery attempts made before the error (empty when nothing was delivered)."""
        value = self.fields.get("attempts")
        return list(value) if isinstance(value, list) else []


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


def _codes() -> dict[str, type[AgentReachError]]:
    found: dict[str, type[AgentReachError]] = {}
    todo: list[type[AgentReachError]] = [AgentReachError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


_BY_CODE = _codes()


def error_from_answer(status: int, body: Any) -> AgentReachError:
    """The typed error for a gateway's error answer ``{"ok": false, "error": CODE, ...}``.

    An unknown code (a newer gateway) gives a plain :class:`AgentReachError` whose ``code`` and
    ``status`` are the answer's; a body not of the contract's shape gives ``GatewayUnavailable``.
    """
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return GatewayUnavailable(
            f"the gateway answered HTTP {status} without a contract error body", http_status=status
        )
    code: str = body["error"]
    detail = body.get("detail")
    detail = detail if isinstance(detail, str) and detail else f"{code} (HTTP {status})"
    fields = {k: v for k, v in body.items() if k not in ("ok", "error", "detail")}
    cls = _BY_CODE.get(code)
    exc = AgentReachError(detail, **fields) if cls is None else cls.__new__(cls)
    if cls is not None:
        AgentReachError.__init__(exc, detail, **fields)
    exc.code, exc.status = code, status
    return exc
