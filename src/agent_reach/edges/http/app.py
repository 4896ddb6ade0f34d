"""The gateway's HTTP edge: a dispatch table over aiohttp's low-level server.

It receives a :class:`~agent_reach.gateway.node.Node` and nothing else. Handlers only parse
(the request into a :class:`~agent_reach.gateway.service.Caller` and a wire struct), call one
method of the service, and render. Errors are rendered in one place (:meth:`HttpEdge.handle`)
from the one table of :mod:`agent_reach.wire.status`; anything unexpected is a 500
``internal_error``, logged once with its traceback, and never takes the process down. The
low-level server (no ``web.Application``, router or middleware) is used because it costs about
8 µs less per request, a tenth of a heartbeat's whole cost (benchmarks/RESULTS.md).

The dashboard (``/``, ``/dashboard`` and ``/static/NAME``) is a static page shipped in the
package (``edges/http/static/``), read once at start and served from memory; it polls the JSON
API.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from aiohttp import web

from agent_reach.edges.http.front import Answer, Headers
from agent_reach.edges.http.openapi import openapi_document
from agent_reach.errors import (
    AgentReachError,
    InternalError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
)
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller, delivery_refusal, intents_pieces, with_ids
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import SendBody, decode, encode
from agent_reach.wire.status import headers_for, status_for

__all__ = ["HttpEdge"]

Handler = Callable[[web.BaseRequest, str], Awaitable[web.StreamResponse]]
_JSON = {"Content-Type": "application/json"}
_METRICS_TYPE = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_STATIC_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
# the page loads nothing but its own files and speaks only to this gateway
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
}


class _Static:
    """One shipped file, held in memory with its headers."""

    __slots__ = ("body", "etag", "headers")

    def __init__(self, name: str, body: bytes) -> None:
        suffix = name[name.rfind(".") :] if "." in name else ""
        self.body = body
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        self.headers = {
            "Content-Type": _STATIC_TYPES.get(suffix, "application/octet-stream"),
            "Cache-Control": "no-cache",  # revalidated (ETag): a new version shows at once
            "ETag": self.etag,
            "X-Content-Type-Options": "nosniff",
        }
        if suffix == ".html":
            self.headers.update(_PAGE_HEADERS)


def _load_static() -> dict[str, _Static]:
    """The dashboard's files shipped in ``agent_reach/edges/http/static/``, by name."""
    folder = resources.files("agent_reach.edges.http").joinpath("static")
    return {
        entry.name: _Static(entry.name, entry.read_bytes())
        for entry in folder.iterdir()
        if entry.is_file() and _STATIC_NAME.match(entry.name)
    }


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, headers=_JSON)


def _gone(request: web.BaseRequest) -> bool:
    """Whether ``request``'s connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


class HttpEdge:
    """The gateway's HTTP API over one node: serve :meth:`handle` with ``web.Server``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.service = node.service
        self.settings = node.settings
        self._monotonic = node.clock.monotonic
        self._static = _load_static()
        # (method, path) -> handler; a path ending in "/" (other than "/" itself) takes the rest
        # of the path as its argument
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/register"): self.register,
            ("POST", "/v1/heartbeat"): self.heartbeat,
            ("POST", "/v1/deregister"): self.deregister,
            ("GET", "/v1/agents"): self.agents,
            ("GET", "/v1/agents/"): self.agent,
            ("GET", "/v1/intents"): self.intents,
            ("POST", "/v1/send"): self.send,
            ("GET", "/v1/route"): self.route,
            ("GET", "/v1/traces/"): self.trace,
            # extensions beyond contract v1
            ("GET", "/v1/traces"): self.recent_traces,
            ("GET", "/v1/inflight"): self.inflight,
            ("GET", "/v1/federation"): self.federation,
            ("GET", "/v1/diagnostics"): self.diagnostics,
            ("GET", "/v1/keys"): self.keys,
            ("POST", "/v1/tokens"): self.issue_token,
            ("POST", "/v1/reload"): self.reload,
            ("GET", "/openapi.json"): self.openapi,
            ("GET", "/"): self.dashboard,
            ("GET", "/dashboard"): self.dashboard,
            ("GET", "/static/"): self.static,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/metrics"): self.render_metrics,
        }
        self._exact = {path for _, path in self._routes if path == "/" or not path.endswith("/")}
        self._prefixes = tuple({path for _, path in self._routes if path not in self._exact})
        self._openapi: bytes | None = None

    def mount(
        self, path: str, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
    ) -> None:
        """Serve GET, POST and DELETE on ``path`` with another edge's ``handler`` (``/mcp``),
        inside this edge's dispatch: its errors get the same table."""

        async def mounted(request: web.BaseRequest, _: str) -> web.StreamResponse:
            return await handler(request)

        for method in ("GET", "POST", "DELETE"):
            self._routes[(method, path)] = mounted
        self._exact.add(path)

    # --- dispatch and the one error table --------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Dispatch ``request``; every error becomes the contract's error body."""
        path = request.path
        arg = ""
        handler = self._routes.get((request.method, path))
        try:
            if handler is None:
                self.service.admit(self._caller(request))  # open mode's guard comes first
                handler, arg = self._resolve(request.method, path)
            return await handler(request, arg)
        except AgentReachError as exc:
            answer = _json(exc.to_body(), status_for(exc))
            answer.headers.update(headers_for(exc))
            return answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, ConnectionError) and _gone(request):
                # the caller's connection closed mid-request (by it, or by --read-timeout):
                # nobody to answer, nothing to log above DEBUG
                log(logging.DEBUG, "http.client_gone", path=path, error=repr(exc))
                return web.Response(status=400)
            # any other fault (a ConnectionError too, when not the caller's connection: an
            # `except ConnectionError` that re-raised it skipped this clause, a bare 500)
            log(logging.ERROR, "http.unhandled", path=path, exc_info=True)
            fault = InternalError("unexpected error; see gateway log")
            return _json(fault.to_body(), status_for(fault))

    def _resolve(self, method: str, path: str) -> tuple[Handler, str]:
        """A prefixed route (the rest of the path is its argument), or 404 / 405."""
        for prefix in self._prefixes:
            if path.startswith(prefix) and len(path) > len(prefix):
                handler = self._routes.get((method, prefix))
                if handler is None:
                    break
                return handler, path[len(prefix) :]
        else:
            if path not in self._exact:
                raise NotFound(f"no such path: {path}")
        raise MethodNotAllowed(f"{method} is not allowed on {path}")

    async def _body(self, request: web.BaseRequest) -> bytes:
        """The request body, refused past ``max_body_bytes`` without reading it all (one that
        does not arrive within ``--read-timeout`` closes the connection: edges/http/server.py)."""
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None:
            if length > limit:
                raise PayloadTooLarge(f"body over the {limit} byte limit")
            return await request.content.read()  # ends at Content-Length
        chunks: list[bytes] = []  # chunked: count while reading
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body over the {limit} byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _caller(self, request: web.BaseRequest, received_at: float | None = None) -> Caller:
        """Who calls, as this request says (checked by the service); with ``received_at`` (a
        send), also the headers only a send reads."""
        return _caller_of(request.headers, request.remote or "?", received_at)

    # --- the hot routes, as the front read them (edges/http/front.py) ----------------------

    @property
    def max_body_bytes(self) -> int:
        """The largest request body taken (``--max-body-bytes``)."""
        return self.settings.max_body_bytes

    def answer(
        self, path: str, headers: Headers, remote: str, read_at: float, body: bytes
    ) -> Answer | Awaitable[Answer]:
        """``POST /v1/send`` or ``POST /v1/heartbeat`` read by the front: the answer's status,
        JSON body and extra headers, what :meth:`handle` gives for the same request. A
        heartbeat is answered at once (nothing to wait for: no task, no coroutine); a send,
        and a token-mode heartbeat that evicts, give what to await for their answer."""
        if path == "/v1/send":
            return self._answer_send(headers, remote, read_at, body)
        try:
            result = self.service.heartbeat_now(_caller_of(headers, remote), body)
            if not isinstance(result, dict):
                return self._answer_later(path, result)
            return 200, encode(result), {}
        except Exception as exc:
            return _fault(path, exc)

    async def _answer_send(
        self, headers: Headers, remote: str, read_at: float, body: bytes
    ) -> Answer:
        # one coroutine from the front's task to the service (each level of await costs a
        # frame's resumption on every wake-up of the request)
        try:
            caller = _caller_of(headers, remote, min(self._monotonic(), read_at))
            return 200, encode(await self.service.send(caller, _send_body(caller, body))), {}
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _fault("/v1/send", exc)

    async def _answer_later(self, path: str, work: Awaitable[Any]) -> Answer:
        try:
            return 200, encode(await work), {}
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _fault(path, exc)

    def too_large(self, path: str, headers: Headers) -> tuple[int, bytes, dict[str, str]]:
        """The answer to a body over ``max_body_bytes`` (as :meth:`send` and :meth:`heartbeat`
        give it)."""
        exc: AgentReachError = PayloadTooLarge(
            f"body over the {self.settings.max_body_bytes} byte limit"
        )
        if path == "/v1/send":
            exc = with_ids(delivery_refusal() if "x-reach-attempt" in headers else exc)
        return status_for(exc), encode(exc.to_body()), headers_for(exc)

    async def _send(self, caller: Caller, raw: bytes) -> Any:
        return await self.service.send(caller, _send_body(caller, raw))

    # --- handlers: parse, call the service, render -----------------------------------------

    async def register(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request)
        return _json(await self.service.register(caller, await self._body(request)))

    async def heartbeat(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request)
        return _json(await self.service.heartbeat(caller, await self._body(request)))

    async def deregister(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request)
        return _json(await self.service.deregister(caller, await self._body(request)))

    async def agents(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        # the answer comes in pieces, each a chunk of records built while the event loop
        # waits (gateway/listing.py); a small one goes out whole, a big one as it is built
        # (chunked), so that neither the loop nor the memory holds a 14 MB answer at once
        listing = self.service.agents(self._caller(request), request.query)
        return await self._stream(request, aiter(listing))

    async def _stream(
        self, request: web.BaseRequest, pieces: AsyncGenerator[bytes, None]
    ) -> web.StreamResponse:
        """A JSON answer made of ``pieces``: whole when small, else sent as they come."""
        head: list[bytes] = []
        size = 0
        async for piece in pieces:  # what is refused is refused before the first piece
            head.append(piece)
            size += len(piece)
            if size >= 256 * 1024:
                break
        else:
            return web.Response(body=b"".join(head), headers=_JSON)
        answer = web.StreamResponse(headers=_JSON)
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        try:
            await answer.write(b"".join(head))
            async for piece in pieces:
                await answer.write(piece)
            await answer.write_eof()
        except ConnectionError:  # the caller went away: nothing more to say to it
            pass
        except Exception:
            # the status line is out: no error answer can follow; the connection is cut, so
            # that the caller sees a broken answer rather than a short list that looks whole
            log(logging.ERROR, "http.listing_broken", path=request.path, exc_info=True)
            if request.transport is not None:
                request.transport.abort()
        finally:
            await pieces.aclose()
        return answer

    async def intents(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        # 8 MB at 50,000 tags: encoded a chunk at a time and sent as it comes, as /v1/agents
        answer = await self.service.intents(self._caller(request))
        return await self._stream(request, intents_pieces(answer))

    async def agent(self, request: web.BaseRequest, name: str) -> web.Response:
        return _json(self.service.agent(self._caller(request), name))

    async def send(self, request: web.BaseRequest, _: str) -> web.Response:
        # the deadline counts from when the request was read (the service moves that back to
        # the start of a stall of the loop it was read at the end of)
        now = self._monotonic()
        read_at = getattr(request.protocol, "read_at", None)
        caller = self._caller(request, now if read_at is None else min(now, read_at))
        try:
            raw = await self._body(request)
        except AgentReachError as exc:
            raise with_ids(delivery_refusal() if caller.delivery else exc) from None
        return _json(await self._send(caller, raw))

    async def route(self, request: web.BaseRequest, _: str) -> web.Response:
        return _json(await self.service.explain(self._caller(request), dict(request.query)))

    async def trace(self, request: web.BaseRequest, trace_id: str) -> web.Response:
        sender = request.query.get("sender")  # a peer reading for a sender of its own
        return _json(await self.service.trace(self._caller(request), trace_id, sender))

    async def federation(self, request: web.BaseRequest, _: str) -> web.Response:
        return _json(self.service.federation(self._caller(request)))

    async def recent_traces(self, request: web.BaseRequest, _: str) -> web.Response:
        # an empty value (``?intent=``) means no filter, as a form with a blank field sends it
        query = {k: v for k, v in request.query.items() if v}
        return _json(self.service.recent_traces(self._caller(request), query))

    async def inflight(self, request: web.BaseRequest, _: str) -> web.Response:
        return _json(self.service.inflight(self._caller(request)))

    async def diagnostics(self, request: web.BaseRequest, _: str) -> web.Response:
        return _json(await self.service.diagnostics(self._caller(request)))

    async def keys(self, request: web.BaseRequest, _: str) -> web.Response:
        # public keys to anyone (empty in open mode); an agent's delivery keys to its own
        # endpoint token: what it verifies its deliveries with
        caller = self._caller(request)
        self.service.admit(caller)
        answer = _json(self.service.keys(caller))
        if caller.authorization:  # it may hold a secret key: no cache may keep it
            answer.headers["Cache-Control"] = "no-store"
        return answer

    async def issue_token(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request)
        return _json(self.service.issue_token(caller, await self._body(request)))

    async def reload(self, request: web.BaseRequest, _: str) -> web.Response:
        return _json(await self.service.reload(self._caller(request)))

    async def openapi(self, request: web.BaseRequest, _: str) -> web.Response:
        self.service.admit(self._caller(request))
        if self._openapi is None:  # built once, from the wire structs (edges/http/openapi.py)
            self._openapi = encode(openapi_document())
        return web.Response(body=self._openapi, headers=_JSON)

    async def dashboard(self, request: web.BaseRequest, _: str) -> web.Response:
        return self._send_static(request, "index.html")

    async def static(self, request: web.BaseRequest, name: str) -> web.Response:
        return self._send_static(request, name)

    def _send_static(self, request: web.BaseRequest, name: str) -> web.Response:
        self.service.admit(self._caller(request))
        item = self._static.get(name)
        if item is None:
            raise NotFound(f"no such path: {request.path}")
        if request.headers.get("If-None-Match") == item.etag:
            return web.Response(status=304, headers=item.headers)
        return web.Response(body=item.body, headers=item.headers)

    async def healthz(self, request: web.BaseRequest, _: str) -> web.Response:
        # no browser check: probes may name the host otherwise
        return _json(self.service.health())

    async def render_metrics(self, request: web.BaseRequest, _: str) -> web.Response:
        self.service.admit(self._caller(request))
        # generated off the event loop: a big scrape does not hold up requests
        return web.Response(body=await self.node.metrics.scrape(), headers=_METRICS_TYPE)


def _send_body(caller: Caller, raw: bytes) -> SendBody:
    """A send's body, decoded first (bounded, cheap): a refusal then names the caller's own
    msg_id and trace_id, and so does its audit line."""
    try:
        return decode(raw, SendBody)
    except AgentReachError as exc:
        # a delivery's body (a gateway's own fields) need not decode as a send: the loop is
        # what to say
        raise with_ids(delivery_refusal() if caller.delivery else exc) from None


def _fault(path: str, exc: Exception) -> Answer:
    """The answer to ``exc``, raised serving a hot route: the contract's error, or a 500 (and
    an ERROR line) for anything unexpected."""
    if isinstance(exc, AgentReachError):
        return status_for(exc), encode(exc.to_body()), headers_for(exc)
    log(logging.ERROR, "http.unhandled", path=path, exc_info=exc)
    fault = InternalError("unexpected error; see gateway log")
    return status_for(fault), encode(fault.to_body()), {}


def _caller_of(headers: Mapping[str, str], remote: str, received_at: float | None = None) -> Caller:
    """The caller a request's headers name; with ``received_at`` (a send), also the headers
        only a send reads. ``headers``: aiohttp's (case-insensitive), or the front's (lower-case
    names)."""
    get = headers.get  # by lower-case names: the front's are, aiohttp's take any case
    if received_at is None:
        return Caller(remote, get("authorization"), get("host"), get("origin"))
    return Caller(
        remote,
        get("authorization"),
        get("host"),
        get("origin"),
        get("traceparent"),
        received_at,
        "x-reach-attempt" in headers,
        get("x-reach-hops"),
        get("x-reach-origin"),
    )
