"""The whole exception tree of Agent-Reach.

Protocol-neutral: every error carries the wire contract's error ``code``, a ``detail`` for a
person and its ``fields``; nothing here knows HTTP. Each edge renders them from one table of its
own (:mod:`agent_reach.wire.status` for HTTP: status and headers; a JSON-RPC or NATS edge
brings its own), as ``{"ok": false, "error": code, "detail": str(exc), ...}``.

::

    AgentReachError                      (code, detail, fields)
    ├── InvalidRequest                   invalid_request        (malformed: not JSON at all)
    ├── PayloadTooLarge                  payload_too_large
    ├── EndpointNotRegistered            endpoint_not_registered
    ├── TraceNotFound                    trace_not_found
    ├── NotFound                         not_found              (no such path or method)
    ├── MethodNotAllowed                 method_not_allowed
    ├── Unauthorized                     unauthorized
    ├── Forbidden                        forbidden
    │   └── EndpointHeld                 forbidden              (reason: endpoint_held)
    ├── RateLimited                      rate_limited           (+ retry_after_s)
    ├── RegistryFull                     registry_full          (--max-endpoints reached)
    ├── UnknownIntent                    unknown_intent         (+ intents, suggestions: a
    │                                                            strict dictionary)
    ├── Overloaded                       overloaded             (+ retry_after_s)
    ├── ConfigError                      config_error           (+ source, line): settings,
    │   ├── PolicyFileError                                      policy file, key directory,
    │   ├── KeyDirectoryError                                    intent dictionary
    │   └── DictionaryError                                     (source "intents", + path)
    ├── BackendUnavailable               backend_unavailable    (a registry store, a bus)
    ├── InternalError                    internal_error         (a fault of ours, logged)
    ├── GatewayUnavailable               gateway_unavailable    (client side: no usable answer)
    └── ReachError                       (+ msg_id, trace_id, attempts): answers of /v1/send
        ├── NoCapableAgent               no_capable_agent
        ├── RecipientNotFound            recipient_not_found
        ├── RecipientIncapable           recipient_incapable
        ├── NoAvailableAgent             no_available_agent
        ├── AgentError                   agent_error
        ├── AllAttemptsFailed            all_attempts_failed
        ├── DeadlineExceeded             deadline_exceeded
        └── LoopDetected                 loop_detected          (a forwarded request would
                                                                 cross a second domain)

An error the client SDK rebuilt from an answer (:func:`error_from_answer`) also has the
answer's ``http_status``; an error raised in the gateway has ``http_status`` None.

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
    "BackendUnavailable",
    "ConfigError",
    "DeadlineExceeded",
    "DictionaryError",
    "EndpointHeld",
    "EndpointNotRegistered",
    "Forbidden",
    "GatewayUnavailable",
    "InternalError",
    "InvalidRequest",
    "KeyDirectoryError",
    "LoopDetected",
    "MethodNotAllowed",
    "NoAvailableAgent",
    "NoCapableAgent",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "PolicyFileError",
    "RateLimited",
    "ReachError",
    "RecipientIncapable",
    "RecipientNotFound",
    "RegistryFull",
    "TraceNotFound",
    "Unauthorized",
    "UnknownIntent",
    "error_from_answer",
]


class AgentReachError(Exception):
    """Root of every error Agent-Reach raises on purpose."""

    code: str = "internal_error"
    #: the HTTP status of the answer this error was rebuilt from (client side), else None
    http_status: int | None = None

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fields: dict[str, Any] = fields

    def to_body(self) -> dict[str, Any]:
        """The contract's error body: ``ok``, ``error``, ``detail`` and any extra fields."""
        return {"ok": False, "error": self.code, "detail": self.detail, **self.fields}


class InvalidRequest(AgentReachError):
    """The body is not JSON at all (``malformed``: HTTP 400) or not of the shape asked for
    (HTTP 422); ``field`` names the field at fault."""

    code = "invalid_request"

    def __init__(self, detail: str, *, malformed: bool = False, field: str | None = None) -> None:
        super().__init__(detail, **({"field": field} if field else {}))
        self.malformed = malformed


class PayloadTooLarge(AgentReachError):
    """The request body is over the gateway's size limit."""

    code = "payload_too_large"


class EndpointNotRegistered(AgentReachError):
    """No record with that endpoint id (heartbeat, deregister, lookup)."""

    code = "endpoint_not_registered"


class TraceNotFound(AgentReachError):
    """No recent request carries that trace id."""

    code = "trace_not_found"


class NotFound(AgentReachError):
    """No such path in the HTTP API."""

    code = "not_found"


class MethodNotAllowed(AgentReachError):
    """The path exists, but not for this method."""

    code = "method_not_allowed"


class Unauthorized(AgentReachError):
    """No or bad credentials, where the gateway requires them."""

    code = "unauthorized"


class Forbidden(AgentReachError):
    """The sender may not reach that intent or endpoint."""

    code = "forbidden"


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

    @property
    def retry_after_s(self) -> float | None:
        """Seconds to wait before trying again, when the gateway said."""
        value = self.fields.get("retry_after_s")
        return float(value) if isinstance(value, int | float) else None


class RegistryFull(AgentReachError):
    """The registry holds ``--max-endpoints`` records: a new id is refused (a known one may
    still re-register)."""

    code = "registry_full"


class UnknownIntent(AgentReachError):
    """A strict dictionary refused a registration: ``intents`` are the tags outside it,
    ``suggestions`` the nearest known tags (``{"tag", "confidence"}``, best first, at most 3)."""

    code = "unknown_intent"


class Overloaded(AgentReachError):
    """The gateway refuses work it cannot take now; ``retry_after_s`` says when to come back
    (``Retry-After``). Nothing was delivered."""

    code = "overloaded"

    @property
    def retry_after_s(self) -> float | None:
        value = self.fields.get("retry_after_s")
        return float(value) if isinstance(value, int | float) else None


class ConfigError(AgentReachError):
    """A setting, the policy file, the key directory or the intent dictionary cannot be used.

    ``source`` names the file or flag, ``line`` the line at fault where there is one. The CLI
    maps it to exit code 2 (:mod:`agent_reach.cli.common`); at reload the old configuration stays.
    """

    code = "config_error"

    def __init__(
        self, detail: str, *, source: str | None = None, line: int | None = None, **fields: Any
    ) -> None:
        if source is not None:
            fields["source"] = source
        if line is not None:
            fields["line"] = line
        super().__init__(detail, **fields)

    @property
    def source(self) -> str | None:
        """The file or setting at fault."""
        value = self.fields.get("source")
        return value if isinstance(value, str) else None

    @property
    def line(self) -> int | None:
        """The line at fault (1-based), when the error is in a file."""
        value = self.fields.get("line")
        return value if isinstance(value, int) else None


class PolicyFileError(ConfigError):
    """The access policy file does not parse or breaks a rule (:mod:`agent_reach.core.policy`).

    ``str(exc)`` reads ``"<source> line <N>: <detail>"`` (``"<source>: <detail>"`` without a
    line); ``detail`` holds the message alone.
    """

    def __init__(self, detail: str, *, source: str, line: int | None) -> None:
        super().__init__(detail, source=source, line=line)

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source} line {self.line}"
        return f"{where}: {self.detail}"


class KeyDirectoryError(ConfigError):
    """The key directory cannot be used (:mod:`agent_reach.auth.keys`)."""


class DictionaryError(ConfigError):
    """The intent dictionary file cannot be used (:mod:`agent_reach.intents.dictionary`).

    ``source`` is ``"intents"``, ``path`` the file, ``line`` the line at fault (None when the
    fault is the whole file: too big, unreadable). ``str(exc)`` reads
    ``"--intents <path> line <N>: <detail>"``; ``detail`` holds the message alone.
    """

    def __init__(self, detail: str, *, path: str, line: int | None) -> None:
        super().__init__(detail, source="intents", line=line, path=path)

    @property
    def path(self) -> str:
        """The dictionary file."""
        return str(self.fields.get("path", ""))

    def __str__(self) -> str:
        where = f"--intents {self.path}" + ("" if self.line is None else f" line {self.line}")
        return f"{where}: {self.detail}"


class BackendUnavailable(AgentReachError):
    """A backing service (the shared registry's store, a message bus) cannot be reached."""

    code = "backend_unavailable"


class InternalError(AgentReachError):
    """A fault of ours: rendered as the protocol's internal error, logged once with its cause."""

    code = "internal_error"


class GatewayUnavailable(AgentReachError):
    """Client side: the gateway could not be reached, or its answer was not the contract's.

    Never sent by a gateway.
    """

    code = "gateway_unavailable"


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


class RecipientNotFound(ReachError):
    """``recipient_hint`` names an endpoint that is not registered."""

    code = "recipient_not_found"


class RecipientIncapable(ReachError):
    """``recipient_hint`` names an endpoint that does not declare the intent."""

    code = "recipient_incapable"


class NoAvailableAgent(ReachError):
    """Capable endpoints exist but none may be routed to now (suspect, down or ejected)."""

    code = "no_available_agent"


class AgentError(ReachError):
    """The agent answered 4xx: not retried, passed back to the caller."""

    code = "agent_error"


class AllAttemptsFailed(ReachError):
    """Retries, the retry budget or the candidates ran out before the deadline."""

    code = "all_attempts_failed"


class DeadlineExceeded(ReachError):
    """The caller's deadline ran out (or left no room for another attempt)."""

    code = "deadline_exceeded"


class LoopDetected(ReachError):
    """A request forwarded from another domain (``X-Reach-Hops``) would have to be forwarded
    again: requests cross one domain boundary at most (CONTRACT.md v1.1, "Federation")."""

    code = "loop_detected"


def _codes() -> dict[str, type[AgentReachError]]:
    found: dict[str, type[AgentReachError]] = {}
    todo: list[type[AgentReachError]] = [AgentReachError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


_BY_CODE = _codes()
_BY_CODE["internal_error"] = InternalError


def error_from_answer(status: int, body: Any) -> AgentReachError:
    """The typed error for a gateway's error answer ``{"ok": false, "error": CODE, ...}``.

    An unknown code (a newer gateway) gives a plain :class:`AgentReachError` whose ``code`` is
    the answer's; every error made here has the answer's ``http_status``; a body not of the
    contract's shape gives ``GatewayUnavailable``.
    """
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        unusable = GatewayUnavailable(
            f"the gateway answered HTTP {status} without a contract error body", http_status=status
        )
        unusable.http_status = status
        return unusable
    code: str = body["error"]
    detail = body.get("detail")
    detail = detail if isinstance(detail, str) and detail else f"{code} (HTTP {status})"
    fields = {k: v for k, v in body.items() if k not in ("ok", "error", "detail")}
    cls = _BY_CODE.get(code, AgentReachError)
    exc = cls.__new__(cls)
    AgentReachError.__init__(exc, detail)
    exc.fields = fields  # as given, not as keywords: a field named "self" raised TypeError
    exc.code, exc.http_status = code, status
    return exc
