"""A2A transport: a delivery to an ``a2a+http(s)://`` endpoint is an A2A 1.0 ``SendMessage``.

The endpoint URL is the agent's JSON-RPC interface URL with ``a2a+`` in front; the request is
POSTed to the URL without it, through the gateway's :class:`HttpTransport` (its pool, address
guard, answer-size cap and timeout). The v1 delivery body becomes (CONTRACT.md, "A2A")::

    {"jsonrpc": "2.0", "id": MSG_ID, "method": "SendMessage", "params": {"message": {
        "messageId": MSG_ID, "role": "ROLE_USER",
        "parts": [{"data": PAYLOAD, "mediaType": "application/json"}],
        "metadata": {"intent", "msg_id", "trace_id", "sender", "deadline_ms",
                     "requested_intent", "intent_text"},        # None values left out
        "contextId": ..., "taskId": ...}}}                      # only for a follow-up

with the text part ``{"text": INTENT_TEXT}`` alone instead when the payload is ``{}`` and the
caller sent words. The headers are the given ones (``X-Reach-*``, ``traceparent``) plus
``A2A-Version: 1.0``, without ``X-Reach-A2A-Context-Id`` / ``X-Reach-A2A-Task-Id``: those are
the follow-up's ``contextId`` / ``taskId``, set by the A2A edge, and go in the message.

What the answer comes to:

=====================================================  ===================================
HTTP answer (HttpTransport)                             Delivery
=====================================================  ===================================
not ok: timeout, connect_error, 4xx, 5xx, too large,    unchanged
not JSON, ...
200 + ``result`` ``{"message": {..}}`` / ``{"task":``   ``ok``; body = the result's bytes
``{..}}`` (exactly one of the two)                      exactly as received
200 + ``error`` -32603 internal, -32006 invalid agent   ``server_error`` (retryable)
response, -32000 and -32010..-32099 (implementation-
defined server errors)
200 + ``error`` -32700, -32600, -32601, -32602,          ``agent_error`` (never retried)
-32001..-32005, -32007..-32009 (A2A's task not found,
not cancelable, unsupported, version not supported,
...), or any other code (the application's own)
200 + anything else: not an object, ``jsonrpc`` not     ``agent_error``, the detail says
"2.0", no or both of result/error, another id, a        what is wrong
result that is neither a message nor a task, an error
without an integer code
=====================================================  ===================================

Why: an A2A code is taken as the HTTP status A2A gives it on its HTTP+JSON binding
(``a2a.utils.errors.A2A_ERROR_MAPPING``): 5xx (internal, invalid agent response: the agent's
own fault, another agent may well answer) is a server error as HTTP's 5xx is; the rest are the
request's fault or a refusal, and are not retried, as HTTP's 4xx are not. -32000..-32099 are
JSON-RPC's implementation-defined *server* errors. An unknown code, like an answer the gateway
cannot read, is never retried: the agent took the request, and a retry could repeat its side
effects.

Invariants:
- Every answer, good or bad, is a :class:`Delivery`: nothing an agent does raises here. Only a
  body that is not the gateway's own delivery JSON (a fault of ours) raises InternalError.
- Whatever the HTTP delivery says of reach, ejection, ``agent_ms``/``agent_note`` and
  ``resent`` is kept; a JSON-RPC error keeps the HTTP status (200) and has the JSON-RPC error
  object as its body, and its detail names the code and the (bounded) message.
- Plain dicts and msgspec on the hot path, no protobuf: the result is passed on as raw bytes,
  checked for shape only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from agent_reach.core.model import Outcome
from agent_reach.errors import InternalError
from agent_reach.transport.base import Delivery
from agent_reach.transport.http import HttpTransport
from agent_reach.wire.bodies import DeliveryBody

__all__ = ["CONTEXT_ID_HEADER", "TASK_ID_HEADER", "A2aTransport", "outcome_of_code"]

CONTEXT_ID_HEADER = "X-Reach-A2A-Context-Id"
TASK_ID_HEADER = "X-Reach-A2A-Task-Id"
_CONTEXT_KEY = CONTEXT_ID_HEADER.lower()
_TASK_KEY = TASK_ID_HEADER.lower()
_A2A_HEADERS = {"A2A-Version": "1.0", "Content-Type": "application/json"}
_OURS = frozenset(k.lower() for k in _A2A_HEADERS)  # a given one in other case is replaced
_PREFIX = "a2a+"
_DETAIL_MAX = 200  # characters of an agent's error message kept in a detail

# A2A codes (and JSON-RPC's) whose A2A HTTP status is 5xx: the agent's own fault
_SERVER_CODES = frozenset({-32603, -32006})
_A2A_CODES = range(-32009, -32000)  # -32009..-32001: A2A's own errors
_JSONRPC_SERVER_CODES = range(-32099, -31999)  # implementation-defined server errors
_NAMES = {
    -32700: "parse error",
    -32600: "invalid request",
    -32601: "method not found",
    -32602: "invalid params",
    -32603: "internal error",
    -32001: "task not found",
    -32002: "task not cancelable",
    -32003: "push notifications not supported",
    -32004: "unsupported operation",
    -32005: "content type not supported",
    -32006: "invalid agent response",
    -32007: "extended agent card not configured",
    -32008: "extension support required",
    -32009: "version not supported",
}
# codes an agent that speaks only A2A 0.3 answers a 1.0 SendMessage with
_OLD_AGENT_HINT = {-32601, -32009}


class _Envelope(msgspec.Struct):
    """A JSON-RPC response, read no deeper than needed: an empty Raw is an absent member."""

    jsonrpc: str | UnsetType = UNSET
    id: str | int | UnsetType | None = UNSET
    result: msgspec.Raw = msgspec.Raw()
    error: msgspec.Raw = msgspec.Raw()


class _Result(msgspec.Struct):
    """SendMessage's result: a oneof of ``message`` and ``task``."""

    message: dict[str, msgspec.Raw] | UnsetType = UNSET
    task: dict[str, msgspec.Raw] | UnsetType = UNSET


class _Error(msgspec.Struct):
    """A JSON-RPC error object (``data`` is passed on with it, unread)."""

    code: int
    message: str = ""


_decode_envelope = msgspec.json.Decoder(_Envelope).decode
_decode_result = msgspec.json.Decoder(_Result).decode
_decode_error = msgspec.json.Decoder(_Error).decode
_decode_delivery = msgspec.json.Decoder(DeliveryBody).decode
_encode = msgspec.json.Encoder().encode


def outcome_of_code(code: int) -> Outcome:
    """What a JSON-RPC error code in an agent's answer comes to (module docstring's table)."""
    if code in _SERVER_CODES:
        return Outcome.SERVER_ERROR
    if code in _A2A_CODES:
        return Outcome.AGENT_ERROR
    if code in _JSONRPC_SERVER_CODES:
        return Outcome.SERVER_ERROR
    return Outcome.AGENT_ERROR


def _clip(text: str) -> str:
    """An agent's text, fit for a detail: one line, at most :data:`_DETAIL_MAX` characters."""
    text = "".join(c if c.isprintable() else " " for c in text[: _DETAIL_MAX + 1])
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 3] + "..."


def _empty_object(raw: msgspec.Raw) -> bool:
    """Whether a (valid JSON) payload is ``{}``, whitespace inside allowed."""
    data = bytes(raw)
    return data[:1] == b"{" and not data[1:-1].strip()


class A2aTransport:
    """Delivers to ``a2a+http://`` and ``a2a+https://`` endpoints through ``http``.

    ``start`` and ``close`` are ``http``'s (both idempotent, so the mux may start and close
    the shared HttpTransport once for ``http`` and once for this).
    """

    def __init__(self, http: HttpTransport) -> None:
        self.http = http

    async def start(self) -> None:
        """Open ``http``'s pools; idempotent."""
        await self.http.start()

    async def close(self) -> None:
        """Close ``http``'s pools; idempotent."""
        await self.http.close()

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """SendMessage to the JSON-RPC URL in ``url``:
        :meth:`agent_reach.transport.base.Transport.deliver`, mapped as the module says."""
        target = url[len(_PREFIX) :]
        if url[: len(_PREFIX)].lower() != _PREFIX or not target[:8].lower().startswith(
            ("http://", "https://")
        ):
            return Delivery(
                Outcome.CONNECT_ERROR,
                detail=f"not delivered: not an a2a+http(s):// URL: {_clip(url)}",
                reached=False,
                eject=True,
            )
        msg_id, request, send_headers = self._request(body, headers, timeout_s)
        got = await self.http.deliver(target, request, send_headers, timeout_s)
        if got.outcome is not Outcome.OK:
            return got
        assert got.body is not None  # an ok HTTP delivery carries its JSON body
        return _answer(got, got.body, msg_id)

    async def call(
        self,
        url: str,
        method: str,
        params: Mapping[str, Any],
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Delivery:
        """Another A2A method (``GetTask``, ``CancelTask``) of the agent at ``url``: ``ok``
        with the result's bytes as the body, or the error mapped as a SendMessage's is."""
        target = url[len(_PREFIX) :] if url[: len(_PREFIX)].lower() == _PREFIX else url
        rid = f"relay-{id(params):x}"
        request = _encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        got = await self.http.deliver(target, request, {**headers, **_A2A_HEADERS}, timeout_s)
        if got.outcome is not Outcome.OK:
            return got
        assert got.body is not None
        try:
            envelope = _decode_envelope(got.body)
        except msgspec.DecodeError as exc:
            return got._replace(
                outcome=Outcome.AGENT_ERROR, body=None, detail=f"agent answered {_clip(str(exc))}"
            )
        if len(envelope.result) > 0 and envelope.id == rid:
            return got._replace(body=bytes(envelope.result))
        if len(envelope.error) > 0:
            try:
                error = _decode_error(bytes(envelope.error))
            except msgspec.DecodeError:
                error = None
            if error is not None:
                detail = f"agent answered JSON-RPC error {error.code}: {_clip(error.message)}"
                return got._replace(
                    outcome=outcome_of_code(error.code), body=bytes(envelope.error), detail=detail
                )
        return got._replace(
            outcome=Outcome.AGENT_ERROR, body=None, detail="agent answered no JSON-RPC response"
        )

    @staticmethod
    def _request(
        body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> tuple[str, bytes, dict[str, str]]:
        """The JSON-RPC request's id, body and headers, from the v1 delivery body and headers;
        ``metadata.deadline_ms`` is what this attempt has (``X-Reach-Deadline-Ms``), not the
        request's whole timeout: an agent on the A2A SDK rarely sees our headers."""
        try:
            d = _decode_delivery(body)
        except msgspec.DecodeError as exc:
            raise InternalError(f"A2A delivery of a body that is not a delivery: {exc}") from exc
        send_headers: dict[str, str] = {}
        context_id = task_id = None
        for key, value in headers.items():
            lowered = key.lower()
            if lowered == _CONTEXT_KEY:
                context_id = value
            elif lowered == _TASK_KEY:
                task_id = value
            elif lowered not in _OURS:
                send_headers[key] = value
        send_headers.update(_A2A_HEADERS)
        metadata: dict[str, Any] = {
            "intent": d.intent,
            "msg_id": d.msg_id,
            "trace_id": d.trace_id,
            "deadline_ms": min(d.timeout_ms, int(timeout_s * 1000)),
        }
        if d.sender is not None:
            metadata["sender"] = d.sender
        if d.requested_intent is not None:
            metadata["requested_intent"] = d.requested_intent
        if d.intent_text is not None:
            metadata["intent_text"] = d.intent_text
        if d.intent_text is not None and _empty_object(d.payload):
            parts: list[dict[str, Any]] = [{"text": d.intent_text}]
        else:
            parts = [{"data": d.payload, "mediaType": "application/json"}]
        message: dict[str, Any] = {
            "messageId": d.msg_id,
            "role": "ROLE_USER",
            "parts": parts,
            "metadata": metadata,
        }
        if context_id is not None:
            message["contextId"] = context_id
        if task_id is not None:
            message["taskId"] = task_id
        request = {
            "jsonrpc": "2.0",
            "id": d.msg_id,
            "method": "SendMessage",
            "params": {"message": message},
        }
        return d.msg_id, _encode(request), send_headers


def _answer(got: Delivery, data: bytes, msg_id: str) -> Delivery:
    """An ok HTTP delivery's JSON-RPC answer as a Delivery (module docstring's table)."""

    def unusable(why: str) -> Delivery:
        return got._replace(outcome=Outcome.AGENT_ERROR, body=None, detail=f"agent answered {why}")

    try:
        envelope = _decode_envelope(data)
    except msgspec.DecodeError as exc:
        return unusable(f"JSON that is not a JSON-RPC response: {_clip(str(exc))}")
    if envelope.jsonrpc != "2.0":
        return unusable('a JSON-RPC response without "jsonrpc": "2.0"')
    has_result, has_error = len(envelope.result) > 0, len(envelope.error) > 0
    if has_result == has_error:
        which = "both" if has_result else "neither"
        return unusable(f"a JSON-RPC response with {which} result and error")
    if has_result:
        if envelope.id != msg_id:
            return unusable(
                f"a JSON-RPC response to another request (id {_clip(repr(envelope.id))})"
            )
        raw = bytes(envelope.result)
        try:
            result = _decode_result(raw)
        except msgspec.DecodeError as exc:
            return unusable(f"a SendMessage result that is not an object: {_clip(str(exc))}")
        if (result.message is UNSET) == (result.task is UNSET):
            return unusable("a SendMessage result with neither or both of message and task")
        return got._replace(body=raw)
    # an error may come with a null id: the agent could not read the request's (JSON-RPC 5.1)
    if envelope.id is not None and envelope.id != msg_id:
        return unusable(f"a JSON-RPC error to another request (id {_clip(repr(envelope.id))})")
    raw = bytes(envelope.error)
    try:
        error = _decode_error(raw)
    except msgspec.DecodeError as exc:
        return unusable(f"a JSON-RPC error that is not one: {_clip(str(exc))}")
    name = _NAMES.get(error.code)
    detail = f"agent answered JSON-RPC error {error.code}"
    if name is not None:
        detail += f" ({name})"
    if error.message:
        detail += f": {_clip(error.message)}"
    if error.code in _OLD_AGENT_HINT:
        detail += " - does the agent speak A2A 1.0?"
    return got._replace(outcome=outcome_of_code(error.code), body=raw, detail=detail)
