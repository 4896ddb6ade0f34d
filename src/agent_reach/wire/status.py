"""The one table from the error tree to HTTP: a status and the headers, per contract code.

Used by every speaker of ours that carries an HTTP status: the gateway's HTTP edge, its NATS
edge (the status travels as the ``Reach-Status`` header), and the agent SDK's delivery
listeners (which answer the gateway over HTTP or NATS). Pure: no aiohttp, no I/O. A code not
in the table (an error class added without a row) is a 500, and the test suite checks that
every class of :mod:`agent_reach.errors` has its row.
"""

from __future__ import annotations

import math

from agent_reach.errors import AgentReachError, InvalidRequest, Overloaded, RateLimited

__all__ = ["STATUS", "STATUS_HEADER", "headers_for", "reach_status", "status_for"]

# the NATS header that carries the HTTP status of an answer (absent: 200)
STATUS_HEADER = "Reach-Status"

STATUS: dict[str, int] = {
    "invalid_request": 422,  # 400 when the body is not JSON at all (InvalidRequest.malformed)
    "payload_too_large": 413,
    "endpoint_not_registered": 404,
    "trace_not_found": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "unauthorized": 401,
    "forbidden": 403,
    "rate_limited": 429,
    "registry_full": 503,
    "unknown_intent": 422,  # a strict dictionary, at registration
    "overloaded": 503,  # with Retry-After
    "config_error": 422,  # a file handed to POST /v1/reload that cannot be used
    "backend_unavailable": 503,
    "internal_error": 500,
    "gateway_unavailable": 503,  # client side only; never sent by a gateway
    "no_capable_agent": 404,
    "recipient_not_found": 404,
    "recipient_incapable": 422,
    "no_available_agent": 503,
    "agent_error": 502,
    "all_attempts_failed": 502,
    "deadline_exceeded": 504,
    "loop_detected": 508,  # a forwarded request asked to be forwarded again
}


def status_for(exc: AgentReachError) -> int:
    """The HTTP status of ``exc``'s answer."""
    if isinstance(exc, InvalidRequest) and exc.malformed:
        return 400
    return STATUS.get(exc.code, 500)


def headers_for(exc: AgentReachError) -> dict[str, str]:
    """Headers the answer to ``exc`` carries besides its content type (``Retry-After``)."""
    if isinstance(exc, RateLimited | Overloaded):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s or 1)))}
    return {}


def reach_status(raw: str | None) -> int | None:
    """The HTTP status of a ``Reach-Status`` header value: absent is 200; None when it is not
    an HTTP status (three digits, 100-599)."""
    if raw is None:
        return 200
    raw = raw.strip()
    if len(raw) != 3 or not raw.isdigit() or not 100 <= int(raw) <= 599:
        return None
    return int(raw)
