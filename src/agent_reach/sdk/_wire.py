"""The client SDK's side of the wire: the bodies it sends and the answers it reads.

Every body is built as the struct the gateway decodes it with (:mod:`agent_reach.wire.bodies`),
every answer parsed into the struct of :mod:`agent_reach.wire.answers`: one definition of each,
shared by the gateway, the service and both SDKs. The client does not validate what the gateway
validates (patterns, lengths: the gateway's 422 names the field), with one exception: a
registration whose ``endpoint_url`` :class:`~agent_reach.wire.bodies.RegisterBody` itself
refuses (a URL no HTTP client could dial) is refused here, as the gateway would refuse it, before
anything is sent.

An error answer becomes the typed error of its contract code (:func:`error_of`); an answer that
is not the contract's becomes :class:`~agent_reach.errors.GatewayUnavailable` with the answer's
``http_status`` (:func:`parse`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

import msgspec

from agent_reach.errors import AgentReachError, InvalidRequest, error_from_answer
from agent_reach.observability.tracecontext import TRACEPARENT
from agent_reach.sdk._failover import unusable
from agent_reach.wire.bodies import RegisterBody, SendBody, TokenRequest

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "EMPTY",
    "NETWORK_ALLOWANCE_S",
    "Priority",
    "error_of",
    "parse",
    "register_body",
    "send_body",
    "token_request",
    "traceparent_header",
]

Priority = Literal["low", "normal", "high"]
T = TypeVar("T")

DEFAULT_TIMEOUT_MS = 8000
# what a send may take beyond the caller's deadline: the gateway's answer on the wire
NETWORK_ALLOWANCE_S = 1.0
EMPTY: Any = msgspec.UNSET  # "no payload given": sent as {} (an explicit None is sent as null)


def send_body(
    intent: str | None,
    payload: Any,
    *,
    intent_text: str | None = None,
    fallback: bool = True,
    msg_id: str,
    trace_id: str,
    sender: str | None,
    recipient_hint: str | None,
    priority: Priority,
    timeout_ms: int,
) -> SendBody:
    """The ``POST /v1/send`` body; ``payload`` is any JSON (:data:`EMPTY`: ``{}``).
    InvalidRequest, naming the field, when neither ``intent`` nor ``intent_text`` is given,
    for blank words or words with control characters (as the gateway would answer), and for a
    payload that is not JSON-encodable."""
    try:
        raw = msgspec.Raw(b"{}" if payload is EMPTY else msgspec.json.encode(payload))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"payload is not JSON: {exc}", field="payload") from None
    if intent is None and intent_text is None:
        raise InvalidRequest("give intent, intent_text or both", field="intent")
    try:
        return SendBody(
            intent=intent,
            intent_text=intent_text,
            fallback=fallback,
            msg_id=msg_id,
            trace_id=trace_id,
            sender=sender,
            recipient_hint=recipient_hint,
            payload=raw,
            priority=priority,
            timeout_ms=timeout_ms,
        )
    except ValueError as exc:  # the words' check (wire/bodies.check_intent_text)
        detail = str(exc).split(" - at ")[0]
        raise InvalidRequest(detail, field="intent_text") from None


def register_body(
    endpoint_id: str, capabilities: Sequence[str], endpoint_url: str, description: str = ""
) -> RegisterBody:
    """The ``POST /v1/register`` body. InvalidRequest (naming the field) for an
    ``endpoint_url`` the wire type refuses, as the gateway would."""
    try:
        return RegisterBody(
            endpoint_id=endpoint_id,
            capabilities=list(capabilities),
            endpoint_url=endpoint_url,
            description=description,
        )
    except ValueError as exc:
        text = str(exc)
        named = text.rsplit(" - at `$.", 1)[1].rstrip("`") if " - at `$." in text else None
        raise InvalidRequest(text, field=named or "endpoint_url") from None


def token_request(
    kind: Literal["enroll", "client"],
    *,
    subject: str | None,
    endpoints: Sequence[str],
    intents: Sequence[str],
    ttl_s: float | None,
) -> TokenRequest:
    """The ``POST /v1/tokens`` body."""
    return TokenRequest(
        kind=kind, subject=subject, endpoints=list(endpoints), intents=list(intents), ttl_s=ttl_s
    )


def parse(answer: Any, kind: type[T], status: int, what: str) -> T:
    """``answer`` (the JSON of a 200) as ``kind``; :func:`~._failover.unusable` when it is not
    the contract's. ``what`` names the call in the error (``the answer of ... to POST ...``)."""
    if isinstance(answer, dict) and answer.get("ok", True) is not True:
        # a success answer says ok: true (or, from older gateways, nothing)
        raise unusable(f"{what} is a {status} that says ok: {answer.get('ok')!r}", status)
    try:
        return msgspec.convert(answer, kind)
    except msgspec.ValidationError as exc:
        raise unusable(f"{what} is not the contract's: {exc}", status) from exc


MAX_RETRY_AFTER_S = 3600.0  # the most of a gateway's Retry-After taken as said


def error_of(status: int, answer: Any, headers: Mapping[str, str]) -> AgentReachError:
    """The typed error of an error answer, with ``retry_after_s`` from ``Retry-After``."""
    err = error_from_answer(status, answer)
    seconds = retry_after_s(headers.get("Retry-After", ""))
    given = err.fields.get("retry_after_s")  # the body's, when it has one: taken first
    if isinstance(given, int | float) and not isinstance(given, bool) and given >= 0:
        # compared before float(): an integer of 400 digits does not fit one
        seconds = float(min(given, MAX_RETRY_AFTER_S))
    if seconds is None:
        err.fields.pop("retry_after_s", None)  # not a number of seconds: not passed on
    else:
        err.fields["retry_after_s"] = seconds
    return err


def retry_after_s(value: str) -> float | None:
    """A ``Retry-After`` of delta-seconds (ASCII digits, a fraction allowed) in seconds, at most
    :data:`MAX_RETRY_AFTER_S` (a caller sleeps on it); None for anything else (an HTTP date,
    ``"²"``, which ``str.isdigit`` takes for a digit)."""
    if not value.isascii() or not value.replace(".", "", 1).isdigit():
        return None
    return min(float(value), MAX_RETRY_AFTER_S)


def traceparent_header(given: str | None) -> dict[str, str]:
    """The ``traceparent`` header of a send: ``given``, else the one of the traced request this
    send is made in (an agent's handler), if any."""
    value = given or TRACEPARENT.get()
    return {"traceparent": value} if value else {}
