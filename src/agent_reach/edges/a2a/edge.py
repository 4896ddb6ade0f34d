"""The gateway as an A2A agent: its own Agent Card and ``POST /a2a`` (CONTRACT.md v1.1, "A2A").

Mounted on the HTTP edge. It receives a :class:`~agent_reach.gateway.node.Node` and nothing
else; a message is routed by the service's send, as every other edge's request is.

- ``GET /.well-known/agent-card.json``: one skill per routable tag (``id`` = the tag, the
  dictionary's words or the agents' description, ``tags`` = its segments), the JSON-RPC
  interface at ``/a2a`` of the URL the card was asked at, the bearer scheme in token mode.
  ``ETag`` on its content; ``If-None-Match`` -> 304. The skills, the costly part (~0.1 s of
  CPU at 50,000 tags), are built once for every base URL a caller may name in ``Host``, a
  thousand tags per turn of the loop, by one build at a time that every request awaits, at
  most once in :data:`CARD_TTL_S` and once in :data:`CARD_COST_FACTOR` times the last build's
  duration (under a flood of card requests, at most about a tenth of the loop's time), but at
  least once in :data:`CARD_MAX_TTL_S` (a build timed on a busy loop takes longer than its
  own work).
- ``POST /a2a``: JSON-RPC 2.0, A2A 1.0 (``A2A-Version: 1.0``; none is taken as 1.0, another is
  -32009). ``SendMessage``: the intent is ``metadata.intent`` of the message or of the request
  (an exact tag), else the message's text parts are the send's ``intent_text`` (the fallback,
  same threshold); the first data part is the payload (``{}`` without one);
  ``metadata.recipient_hint``, ``timeout_ms`` and ``trace_id`` are honoured. The agent's
  answer comes back as the result: an A2A agent's Message or Task as it gave it, another
  agent's JSON as a Message with one data part. ``GetTask`` and ``CancelTask`` go to the agent
  that owns the task. ``SendStreamingMessage`` is unsupported (-32004; the card says so). A
  caller whose connection closes while its call is in hand has left: the call is cancelled
  (its send's admission place, slot and attempt freed), looked for every
  :data:`GONE_POLL_S` (aiohttp does not cancel a handler whose client left).
- Stickiness: a message whose ``taskId`` or ``contextId`` an agent owns goes to that agent
  (``recipient_hint``), never re-routed; an unknown ``taskId`` is -32001, an owner no longer
  registered is -32001 too, with the reason; an owner registered but not answering is the
  send's refusal (-32603), its message naming the owner. An agent owns every ``taskId`` and
  ``contextId`` of its answers (a Task's id and context, a Message's context and task, its
  own ids as much as those the caller named) and the context the caller named; a message
  that names none and gets none back (a v1 agent's one-off) writes nothing. Owners are held
  for the caller who opened them, in the registry's ``a2a-owners`` claim map, each
  :data:`OWNER_TTL_S` after its last message, the TTL kept by the store itself (on Redis, a
  key with its expiry, seen by every gateway); a claim is atomic and never takes over a
  live owner.

Errors: a refusal of the service is a JSON-RPC error whose ``data`` is a
``google.rpc.ErrorInfo`` (the form the a2a-sdk's client reads) with the v1 error body in its
``metadata`` (``error``, ``detail``, ``trace_id``, ``msg_id``, ``suggestions`` as JSON text):
``invalid_request`` is -32602, ``no_capable_agent``, ``recipient_incapable`` and
``recipient_not_found`` are -32004 (the gateway cannot do that), the rest (no agent available,
deadline, attempts failed, agent error, overloaded, rate limited) -32603; ``unauthorized`` and
``forbidden`` are HTTP 401 and 403 with the same JSON-RPC error body.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from agent_reach.core.names import split_domain
from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    Forbidden,
    InvalidRequest,
    MethodNotAllowed,
    ReachError,
    Unauthorized,
)
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import SendBody, encode
from agent_reach.wire.ids import new_id

__all__ = ["CARD_PATH", "OWNER_MAP", "OWNER_TTL_S", "RPC_PATH", "A2aEdge"]

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
OWNER_MAP = "a2a-owners"
OWNER_TTL_S = 3600.0  # an owner is forgotten an hour after the last message of its task
CARD_TTL_S = 1.0  # the card is built again at most this often
CARD_COST_FACTOR = 10.0  # ... and at most once in this many times its build's duration
CARD_MAX_TTL_S = 10.0  # ... and at least this often
CONTEXT_HEADER = "X-Reach-A2A-Context-Id"  # transport/a2a.py puts them in the message
TASK_HEADER = "X-Reach-A2A-Task-Id"
_JSON = {"Content-Type": "application/json"}
GONE_POLL_S = 0.25  # how often a call in hand looks whether its caller's connection closed
_T = TypeVar("_T")
_Skills = tuple[float, bytes, str]  # (until when they hold, the encoded skills, their digest)
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
_NAMES = {
    -32700: "Parse error",
    -32600: "Invalid request",
    -32601: "Method not found",
    -32602: "Invalid params",
    -32603: "Internal error",
    -32001: "Task not found",
    -32004: "Unsupported operation",
    -32009: "Version not supported",
}
_UNSUPPORTED = {"no_capable_agent", "recipient_incapable", "recipient_not_found"}
_ID = re.compile(r"[\x21-\x7e]{1,128}")  # task and context ids: they travel in headers


async def _unless_gone(request: web.BaseRequest, work: Coroutine[Any, Any, _T]) -> _T:
    """``work``'s result, or ConnectionResetError once the caller's connection has closed
    (then ``work`` is cancelled: nobody reads its answer, and a send would hold its place in
    admission, its slot and its attempt to the end for nobody)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait([task], timeout=GONE_POLL_S)
            if done:
                return task.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                task.cancel()
                await asyncio.wait([task])
                raise ConnectionResetError("the caller's connection closed")
    finally:
        if not task.done():  # this handler cancelled (the gateway stopping)
            task.cancel()


def _number(value: object) -> bool:
    """Whether ``value`` is a JSON number (not a bool, which Python counts as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class RpcError(Exception):
    """A JSON-RPC error of this edge's own (not one of the service's refusals)."""

    status = 200

    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason


class TooLarge(RpcError):
    """A body over the size limit: HTTP 413 with a JSON-RPC error."""

    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(-32600, f"body over the {limit} byte limit", "PAYLOAD_TOO_LARGE")


def _error_info(reason: str, metadata: dict[str, str]) -> list[dict[str, Any]]:
    return [{"@type": _ERROR_INFO, "reason": reason, "domain": "agent-reach", "metadata": metadata}]


def _refusal(exc: AgentReachError) -> tuple[int, dict[str, Any]]:
    """The JSON-RPC code and error object of a service refusal (module docstring)."""
    body = exc.to_body()
    if exc.code == "invalid_request":
        code = -32602
    elif exc.code in _UNSUPPORTED:
        code = -32004
    elif isinstance(exc, Unauthorized | Forbidden):
        code = -32600
    else:
        code = -32603
    metadata = {
        # msgspec, not json: ``attempts`` are Attempt structs (json.dumps raised: a 500)
        k: v if isinstance(v, str) else encode(v).decode()
        for k, v in body.items()
        if k != "ok" and v is not None
    }
    return code, {
        "code": code,
        "message": exc.detail,
        "data": _error_info(exc.code.upper(), metadata),
    }


def _rpc(rid: Any, *, result: Any = None, error: dict[str, Any] | None = None) -> bytes:
    out: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
    if error is not None:
        out["error"] = error
    else:
        out["result"] = result
    return encode(out)


class A2aEdge:
    """The gateway's card (:meth:`card`) and JSON-RPC endpoint (:meth:`rpc`) over one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.service = node.service
        self.settings = node.settings
        self.owners = node.registry.claim_map(OWNER_MAP)
        self._monotonic = node.clock.monotonic
        self._cards: dict[str, tuple[float, bytes, str]] = {}  # base URL -> (until, body, etag)
        self.cards_cleared = 0  # _cards cleared at its bound of 16 base URLs (a metric)
        # the card's skills, encoded, and their digest: the costly part of a card, shared by
        # every base URL (a caller picks the Host header: a new one must not cost a build)
        self._skills: _Skills | None = None
        self._building: asyncio.Task[_Skills] | None = None  # the build every request awaits
        self.skill_builds = 0  # times the skills were built
        self.cost_clock = time.perf_counter  # what a build's duration is measured on
        _version()  # the metadata lookup (cached) at start-up rather than in the first card
        node.metrics.watch_bound("a2a_cards", lambda: self.cards_cleared)
        if hasattr(self.owners, "evicted"):  # memory://: bounded here (Redis: by its memory)
            owners = self.owners
            node.metrics.watch_bound("a2a_owners", lambda: getattr(owners, "evicted", 0))

    # --- the card --------------------------------------------------------------------------

    async def card(self, request: web.BaseRequest) -> web.StreamResponse:
        """``GET /.well-known/agent-card.json``: the gateway's Agent Card."""
        if request.method != "GET":
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        self.service.admit(self._caller(request))
        host = request.headers.get("Host") or f"{self.settings.host}:{self.settings.port}"
        base = f"{request.scheme}://{host}"
        now = self._monotonic()
        cached = self._cards.get(base)
        if cached is None or cached[0] <= now:
            # the skills are built at most once a second (module docstring), whatever the
            # base URL: a request with a new Host costs a copy of the encoded skills
            until, skills, digest = await self._skills_at(now)
            # the skills spliced in, one allocation (encoded with the card, msgspec's buffer
            # grew through copies of them: ~8 ms at 50,000 tags)
            head = encode(self._card(base))
            body = b"".join((head[:-1], b',"skills":', skills, b"}"))
            etag = '"' + hashlib.sha256(f"{digest} {base}".encode()).hexdigest()[:32] + '"'
            if len(self._cards) >= 16:  # Host is the caller's: a few bases at most
                self._cards.clear()
                self.cards_cleared += 1
            self._cards[base] = cached = (until, body, etag)
        _, body, etag = cached
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if etag in {t.strip() for t in request.headers.get("If-None-Match", "").split(",")}:
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, headers={**_JSON, **headers})

    async def _skills_at(self, now: float) -> _Skills:
        """The skills of the card at ``now``: those held while they hold, else those of the
        build under way (one at a time, whoever asked first; a request that goes away does not
        cancel it)."""
        held = self._skills
        if held is not None and held[0] > now:
            return held
        if self._building is None:
            self._building = building = asyncio.create_task(self._build_skills())
            building.add_done_callback(self._built)
        return await asyncio.shield(self._building)

    def _built(self, task: asyncio.Task[_Skills]) -> None:
        self._building = None
        if not task.cancelled() and task.exception() is None:
            self._skills = task.result()

    async def _build_skills(self) -> _Skills:
        """The card's skills (one per routable tag), encoded, until when they hold, and their
        digest (in every base URL's ETag); made and encoded :data:`TAG_CHUNK` tags at a time,
        and put together in one allocation (encoded in one go at 50,000 tags they held the loop
        ~12 ms more; the list's brackets added by two more copies of it, ~14 ms more: fresh
        memory's page faults are dear in a VM)."""
        started = self.cost_clock()
        parts: list[bytes] = [b"["]  # "[", then each chunk's skills with its comma, then "]"
        digest = hashlib.sha256(b"[")  # of the body, taken as its parts come
        async for chunk in self.service.routable_skills():
            skills = [
                {
                    "id": tag,
                    "name": tag,
                    "description": description or f"Requests for {tag}",
                    "tags": tag.split("."),
                    **({"examples": examples} if examples else {}),
                }
                for tag, description, examples in chunk
            ]
            if skills:
                piece = encode(skills)[1:-1]
                if len(parts) > 1:
                    piece = b"," + piece
                digest.update(piece)
                parts.append(piece)
        parts.append(b"]")
        digest.update(b"]")
        body = b"".join(parts)
        took = self.cost_clock() - started
        self.skill_builds += 1
        # at most once a second, and at most a tenth of the time under a flood of requests
        hold = min(CARD_MAX_TTL_S, max(CARD_TTL_S, CARD_COST_FACTOR * took))
        until = self._monotonic() + hold
        return until, body, digest.hexdigest()

    def _card(self, base: str) -> dict[str, Any]:
        """The card for ``base``, but its skills (spliced in last by :meth:`card`)."""
        card: dict[str, Any] = {
            "name": "agent-reach",
            "description": (
                "An Agent-Reach gateway: it routes each message to a live agent that serves its"
                " intent (metadata.intent, or the message's words), and refuses rather than"
                " guess. One skill per intent it can reach now."
            ),
            "version": _version(),
            "supportedInterfaces": [
                {"url": base + RPC_PATH, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": False, "pushNotifications": False},
            "defaultInputModes": ["text/plain", "application/json"],
            "defaultOutputModes": ["application/json", "text/plain"],
        }
        if not self.node.access.open:
            card["securitySchemes"] = {
                "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "JWT"}}
            }
            card["securityRequirements"] = [{"schemes": {"bearer": {}}}]
        return card

    # --- JSON-RPC --------------------------------------------------------------------------

    @staticmethod
    def _caller(request: web.BaseRequest, received_at: float | None = None) -> Caller:
        headers = request.headers
        return Caller(
            remote=request.remote or "?",
            authorization=headers.get("Authorization"),
            host=headers.get("Host"),
            origin=headers.get("Origin"),
            traceparent=headers.get("traceparent"),
            received_at=received_at,
            # a gateway's delivery (an agent's card pointing at a gateway's /a2a): refused as
            # /v1/send refuses it, so that a request cannot go round in a loop
            delivery="X-Reach-Attempt" in headers,
        )

    async def _body(self, request: web.BaseRequest) -> bytes:
        """The whole body, refused past ``max_body_bytes`` (RpcError: the JSON-RPC answer)."""
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise TooLarge(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise TooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def rpc(self, request: web.BaseRequest) -> web.StreamResponse:
        """``POST /a2a``: one JSON-RPC request (module docstring)."""
        if request.method != "POST":
            raise MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
        caller = self._caller(request, self._monotonic())
        rid: Any = None
        try:
            raw = await self._body(request)
            version = request.headers.get("A2A-Version", "1.0").strip()
            if version.split(".")[0] != "1":
                raise RpcError(-32009, f"A2A version {version!r} is not supported: 1.0 is")
            try:
                call = msgspec.json.decode(raw)
            except (msgspec.DecodeError, RecursionError):
                raise RpcError(-32700, "the body is not JSON") from None
            if not isinstance(call, dict) or call.get("jsonrpc") != "2.0":
                raise RpcError(-32600, "a JSON-RPC 2.0 request object is needed (no batches)")
            rid = call.get("id")
            method, params = call.get("method"), call.get("params", {})
            if not isinstance(method, str) or not isinstance(params, dict):
                raise RpcError(-32600, "method (a string) and params (an object) are needed")
            if method == "SendMessage":
                result = await _unless_gone(request, self._send(caller, params))
            elif method in ("GetTask", "CancelTask"):
                result = await _unless_gone(request, self._task(caller, method, params))
            elif method in ("SendStreamingMessage", "SubscribeToTask"):
                raise RpcError(-32004, f"{method}: this gateway does not stream")
            else:
                raise RpcError(-32601, f"no method {method!r} (SendMessage, GetTask, CancelTask)")
        except RpcError as exc:
            error = {"code": exc.code, "message": exc.message}
            if exc.reason:
                error["data"] = _error_info(exc.reason, {"detail": exc.message})
            return web.Response(body=_rpc(rid, error=error), status=exc.status, headers=_JSON)
        except AgentReachError as exc:
            relayed = exc.fields.get("rpc_error")
            if isinstance(relayed, dict):  # the owner's own answer to GetTask / CancelTask
                return web.Response(body=_rpc(rid, error=relayed), headers=_JSON)
            _, error = _refusal(exc)
            status = (
                401 if isinstance(exc, Unauthorized) else 403 if isinstance(exc, Forbidden) else 200
            )
            headers = {**_JSON, "WWW-Authenticate": "Bearer"} if status == 401 else _JSON
            return web.Response(body=_rpc(rid, error=error), status=status, headers=headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            transport = request.transport
            if isinstance(exc, ConnectionError) and (transport is None or transport.is_closing()):
                # the caller's connection closed mid-request (by it, or by --read-timeout)
                log(logging.DEBUG, "a2a.client_gone", error=repr(exc))
                return web.Response(status=400)
            # any other fault (a ConnectionError too, when not the caller's connection)
            log(logging.ERROR, "a2a.unhandled", exc_info=True)
            error = {"code": -32603, "message": "unexpected error; see gateway log"}
            return web.Response(body=_rpc(rid, error=error), headers=_JSON)
        return web.Response(body=_rpc(rid, result=result), headers=_JSON)

    async def _send(self, caller: Caller, params: dict[str, Any]) -> Any:
        message = params.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
            raise RpcError(-32602, "params.message with parts is needed")
        meta: dict[str, Any] = {}
        for source in (params.get("metadata"), message.get("metadata")):  # the message's win
            if isinstance(source, dict):
                meta.update(source)
        texts, data = [], None
        for part in message["parts"]:
            if not isinstance(part, dict):
                raise RpcError(-32602, "each part must be an object")
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif "data" in part and data is None:
                data = part["data"]
        task_id, context_id = message.get("taskId"), message.get("contextId")
        for name, value in (("taskId", task_id), ("contextId", context_id)):
            if value is not None and not (isinstance(value, str) and _ID.fullmatch(value)):
                raise RpcError(-32602, f"message.{name} must be 1-128 visible ASCII characters")
        deadline: Any = meta.get("deadline_ms")  # a gateway's delivery names what is left
        asked: Any = meta.get("timeout_ms")
        if _number(deadline) and (asked is None or _number(asked)):
            # (a timeout_ms of another type is left for the send's body to refuse: -32602)
            meta["timeout_ms"] = deadline if not asked else min(asked, deadline)
        fields: dict[str, Any] = {}
        for key in ("intent", "recipient_hint", "trace_id"):
            if meta.get(key) is not None:
                fields[key] = meta[key]
        if meta.get("timeout_ms") is not None:
            timeout = meta["timeout_ms"]
            fields["timeout_ms"] = (
                int(timeout) if isinstance(timeout, float) and timeout.is_integer() else timeout
            )
        text = " ".join(t.strip() for t in texts if t.strip())
        if text:
            fields["intent_text"] = text[:2000]
        if "intent" in fields:
            # metadata.intent is an exact tag (CONTRACT.md): the words then travel to the agent,
            # they do not choose it
            fields["fallback"] = False
        who = self.service.reader(caller, "reach over A2A") or ""  # before any lookup
        owner = await self._owner(task_id, context_id, who)
        if owner is not None:  # a follow-up: to the agent that owns it, never re-routed
            fields["recipient_hint"], fields["intent"] = owner["endpoint_id"], owner["intent"]
        fields["payload"] = {} if data is None else data
        fields["msg_id"] = str(message.get("messageId") or new_id("msg"))[:128]
        try:
            body = msgspec.json.decode(encode(fields), type=SendBody)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"the message: {exc}") from None
        headers = {}
        if context_id:
            headers[CONTEXT_HEADER] = str(context_id)
        if task_id:
            headers[TASK_HEADER] = str(task_id)
        try:
            reply = await self.service.send(caller, body, headers=headers or None)
        except ReachError as exc:
            if owner is not None:  # say whose silence it is: no other agent will be tried
                exc.detail = (
                    f"the agent that owns {owner['key']}, {owner['endpoint_id']}, did not take"
                    f" the follow-up ({exc.detail}): the conversation stays with it, try later"
                )
            raise
        answer: dict[str, Any] = msgspec.json.decode(encode(reply))
        endpoint_id, intent = answer["endpoint_id"], answer["intent"]
        result = answer.get("result")
        record = self.node.registry.get(endpoint_id)
        if (
            record is not None
            and record.endpoint_url.startswith("a2a+")
            and isinstance(result, dict)
        ):
            out = result  # the A2A agent's own Message or Task
        else:
            out = {
                "message": {
                    "messageId": new_id("msg"),
                    "role": "ROLE_AGENT",
                    **({"contextId": context_id} if context_id else {}),
                    "parts": [{"data": result, "mediaType": "application/json"}],
                    "metadata": {
                        "endpoint_id": endpoint_id,
                        "intent": intent,
                        "trace_id": answer["trace_id"],
                        "msg_id": answer["msg_id"],
                        **({"match": answer["match"]} if answer.get("match") else {}),
                    },
                }
            }
        await self._own(out, context_id, endpoint_id, intent, who)
        return out

    async def _owner(self, task_id: Any, context_id: Any, who: str) -> dict[str, Any] | None:
        """The owner of a follow-up's task (or context), for the caller ``who`` (its token's
        kind and subject; "" in open mode); RpcError -32001 for a task unknown to that caller
        or an owner gone (never another agent), -32602 for a context another caller holds."""
        owner: dict[str, Any] | None = None
        for kind, key in (("task", task_id), ("ctx", context_id)):
            if not key:
                continue
            raw = await self.owners.get(f"{kind}:{key}")  # an expired owner reads as None
            found: dict[str, Any] | None = None if raw is None else json.loads(raw)
            if found is not None and found.get("caller", "") != who:
                if kind == "ctx":  # named by someone else: not to be taken over (also beside
                    # a task of the caller's own, which would carry it to the task's agent)
                    raise RpcError(-32602, f"contextId {key!r} is another caller's: name another")
                found = None  # another caller's task: as if unknown
            if found is None:
                if kind == "task":
                    raise RpcError(-32001, f"no task {key!r} is known here", "TASK_NOT_FOUND")
                continue
            if owner is not None:  # the task's owner decides; its context was only checked
                continue
            owner_id = found["endpoint_id"]
            if split_domain(owner_id)[1] is not None:
                # answered through another domain: its conversation ids stay there (a forward
                # carries no A2A context), so a follow-up cannot go on with it from here
                raise RpcError(
                    -32001,
                    f"the agent that owns {'task' if kind == 'task' else 'context'} {key!r},"
                    f" {owner_id}, is in another domain: A2A conversations are not carried"
                    " across domains; send the follow-up to that domain's gateway",
                    "OWNER_GONE",
                )
            record = self.node.registry.get(owner_id)
            if record is None or found["intent"] not in record.capabilities:
                raise RpcError(
                    -32001,
                    f"the agent that owns {'task' if kind == 'task' else 'context'} {key!r},"
                    f" {found['endpoint_id']}, is no longer registered for {found['intent']}:"
                    " the conversation cannot go on elsewhere",
                    "OWNER_GONE",
                )
            found["key"] = f"{'task' if kind == 'task' else 'context'} {key!r}"
            owner = found
        return owner

    async def _own(
        self, out: dict[str, Any], context_id: Any, endpoint_id: str, intent: str, who: str
    ) -> None:
        """Note who owns what a follow-up may name, for the caller ``who``: every ``taskId``
        and ``contextId`` of the answer (a Task's ``id`` and ``contextId``, a Message's
        ``contextId`` and ``taskId``: the agent's own as much as the caller's) and the context
        the caller named. Nothing when there is none (a v1 agent's answer to a one-off: the
        wrapped Message carries a context only when the caller named one), so that stateless
        traffic writes nothing. Each key is claimed in one atomic step: a live owner (another
        endpoint, or another caller) is never overwritten (an agent cannot claim the ids of
        another's task), the same owner's claim renews its TTL. A shared registry away when
        the claims are written (the agent has answered by then) costs the follow-ups, not the
        answer: logged ``a2a.owner_unrecorded``, and the answer goes back."""
        keys = []
        for kind, task_field in (("task", "id"), ("message", "taskId")):
            answer = out.get(kind)
            if not isinstance(answer, dict):
                continue
            for prefix, value in (
                ("task", answer.get(task_field)),
                ("ctx", answer.get("contextId")),
            ):
                if isinstance(value, str) and _ID.fullmatch(value):
                    keys.append(f"{prefix}:{value}")
        if context_id:
            keys.append(f"ctx:{context_id}")
        value = json.dumps(
            {"caller": who, "endpoint_id": endpoint_id, "intent": intent}, sort_keys=True
        )
        for key in dict.fromkeys(keys):
            try:
                claimed = await self.owners.claim(key, value, OWNER_TTL_S)
            except BackendUnavailable as exc:
                log(
                    logging.WARNING,
                    "a2a.owner_unrecorded",
                    key=key,
                    endpoint_id=endpoint_id,
                    error=exc.detail,
                )
                return
            if claimed != value:
                log(logging.WARNING, "a2a.owner_kept", key=key, claimed_by=endpoint_id)

    async def _task(self, caller: Caller, method: str, params: dict[str, Any]) -> Any:
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise RpcError(-32602, "params.id (the task's id) is needed")
        who = self.service.reader(caller, "reach over A2A") or ""  # before any lookup
        owner = await self._owner(task_id, None, who)
        assert owner is not None  # an unknown task raised -32001
        result = await self.service.relay(
            caller, owner["endpoint_id"], owner["intent"], method, params
        )
        owned = {"task": {"id": task_id}}  # polled: its owner is kept another hour
        await self._own(owned, None, owner["endpoint_id"], owner["intent"], who)
        return result


@functools.cache  # the metadata lookup scans the installed distributions: 1-9 ms a call
def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("agent-reach-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "0"
