"""The gateway's HTTP edge: a dispatch table over aiohttp's low-level server.

Handlers only parse, call the service, and render. Errors are rendered in one place
(:meth:`HttpEdge.handle`) from the exception tree of :mod:`agent_reach.errors`; anything
unexpected is a 500 ``internal_error``, logged once with its traceback, and never takes the
process down. The low-level server (no ``web.Application``, router or middleware) is used because
it costs about 8 µs less per request, a tenth of a heartbeat's whole cost (benchmarks/RESULTS.md).

The dashboard (``/``, ``/dashboard`` and ``/static/NAME``) is a static page shipped in the
package (``edges/http/static/``), read once at start and served from memory; it polls the JSON API.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web

from agent_reach.auth.tokens import Kind
from agent_reach.clock import Clock, SystemClock
from agent_reach.core.names import is_endpoint_id
from agent_reach.core.netguard import AddressGuard
from agent_reach.edges.http.status import headers_for, status_for
from agent_reach.errors import (
    AgentReachError,
    EndpointHeld,
    EndpointNotRegistered,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    TraceNotFound,
)
from agent_reach.gateway.access import (
    ENDPOINTS,
    OPERATORS,
    READERS,
    REGISTRANTS,
    SENDERS,
    Access,
    Caller,
)
from agent_reach.gateway.delivery import Reacher
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.monitor import run_purger, run_ticker
from agent_reach.gateway.router import Router
from agent_reach.gateway.traces import TraceQuery, TraceStore
from agent_reach.observability.logs import log
from agent_reach.registry import RegistryBackend, open_registry
from agent_reach.settings import GatewaySettings
from agent_reach.transport import HttpTransport, Transport
from agent_reach.wire.bodies import (
    EndpointIdBody,
    RegisterBody,
    RouteQuery,
    SendBody,
    TokenRequest,
    convert,
    decode,
    encode,
)
from agent_reach.wire.ids import new_id

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


def _with_ids(exc: AgentReachError) -> AgentReachError:
    """Every error answer of /v1/send (and its dry run) carries msg_id, trace_id, attempts."""
    exc.fields.setdefault("msg_id", new_id("msg"))
    exc.fields.setdefault("trace_id", new_id("trace"))
    exc.fields.setdefault("attempts", [])
    return exc


class HttpEdge:
    """The gateway's HTTP API: serve :meth:`handle` with ``web.Server``; start, then close."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        clock: Clock | None = None,
        registry: RegistryBackend | None = None,
        transport: Transport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        settings.check()
        clock = clock or SystemClock()
        self.settings = settings
        self.registry = registry or open_registry(
            settings.registry, prefix=settings.registry_prefix
        )
        self.transport = transport or HttpTransport(
            max_response_bytes=settings.max_body_bytes,
            address_guard=AddressGuard.from_csv(settings.endpoint_networks),
        )
        self.gateway = Router(settings, self.registry, clock, rng=rng)
        self.metrics = GatewayMetrics(self.gateway.status_counts, self.registry.state)
        self.traces = TraceStore(settings.trace_capacity)
        self.metrics.watch(
            records=self.registry.records,
            now=self.gateway.now,
            heartbeat_interval_s=float(settings.heartbeat_interval),
            trace_count=self.traces.__len__,
        )
        self.access = Access(
            settings,
            wall=clock.wall,
            monotonic=clock.monotonic,
            on_denied=lambda action, status: self.metrics.denied.labels(action, status).inc(),
        )
        self.reacher = Reacher(
            self.gateway,
            self.transport,
            self.metrics,
            self.traces,
            wall=clock.wall,
            signer=self.access.tokens,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._static = _load_static()
        # (method, path) -> handler; a path ending in "/" (other than "/" itself) takes the rest
        # of the path as its argument
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/register"): self.register,
            ("POST", "/v1/heartbeat"): self.heartbeat,
            ("POST", "/v1/deregister"): self.deregister,
            ("GET", "/v1/agents"): self.agents,
            ("GET", "/v1/agents/"): self.agent,
            ("POST", "/v1/send"): self.send,
            ("GET", "/v1/route"): self.route,
            ("GET", "/v1/traces/"): self.trace,
            # extensions beyond contract v1
            ("GET", "/v1/traces"): self.recent_traces,
            ("GET", "/v1/inflight"): self.inflight,
            ("GET", "/v1/diagnostics"): self.diagnostics,
            ("GET", "/v1/keys"): self.keys,
            ("POST", "/v1/tokens"): self.issue_token,
            ("POST", "/v1/reload"): self.reload,
            ("GET", "/"): self.dashboard,
            ("GET", "/dashboard"): self.dashboard,
            ("GET", "/static/"): self.static,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/metrics"): self.render_metrics,
        }
        self._exact = {path for _, path in self._routes if path == "/" or not path.endswith("/")}
        self._prefixes = tuple({path for _, path in self._routes if path not in self._exact})

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the keys and policy (token mode; ValueError when they cannot be used), open
        the registry and transport, start the ticker, the purge and the reloader."""
        self.access.load()
        await self.registry.start()
        await self.transport.start()
        self._tasks = [
            asyncio.create_task(run_ticker(self.gateway, self.metrics), name="agent-reach-ticker"),
            asyncio.create_task(run_purger(self.gateway), name="agent-reach-purger"),
            asyncio.create_task(
                self.access.run_reloader(self._enforce_policy), name="agent-reach-reloader"
            ),
        ]

    async def _enforce_policy(self) -> list[str]:
        """A new policy applies to the ids registered already: those it no longer lets claim
        their intents are deregistered (they are refused when they register again)."""
        return await self.gateway.evict(self.access.claim_allowed)

    async def close(self) -> None:
        """Stop the background loops, close the transport and the registry."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.close()
        await self.registry.close()

    # --- dispatch and the one error table --------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Dispatch ``request``; every error becomes the contract's error body."""
        path = request.path
        arg = ""
        handler = self._routes.get((request.method, path))
        try:
            if self.access.open and path != "/healthz":  # probes may name the host otherwise
                headers = request.headers
                self.access.check_browser(headers.get("Host"), headers.get("Origin"))
            if handler is None:
                handler, arg = self._resolve(request.method, path)
            return await handler(request, arg)
        except AgentReachError as exc:
            answer = _json(exc.to_body(), status_for(exc))
            answer.headers.update(headers_for(exc))
            return answer
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "http.unhandled", path=path, exc_info=True)
            return _json(
                {
                    "ok": False,
                    "error": "internal_error",
                    "detail": "unexpected error; see gateway log",
                },
                500,
            )

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
        """The request body, refused past ``max_body_bytes`` without reading it all."""
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

    # --- handlers: parse, call the service, render -----------------------------------------

    def _caller(
        self,
        request: web.BaseRequest,
        kinds: frozenset[Kind],
        action: str,
        trace_id: str | None = None,
    ) -> Caller:
        return self.access.caller(
            request.headers.get("Authorization"), request.remote, kinds, action, trace_id=trace_id
        )

    async def register(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request, REGISTRANTS, "register")
        body = decode(await self._body(request), RegisterBody)
        grant = self.access.check_register(caller, body.endpoint_id, body.capabilities)
        await self.access.check_endpoint_url(caller, body.endpoint_id, body.endpoint_url)
        try:
            record = await self.gateway.register(body, owner=grant.owner)
        except EndpointHeld as exc:  # checked by the registry, in one step with the write
            self.access.denied(caller.who, "register", body.endpoint_id, exc.detail, None)
            raise
        self.metrics.registrations.inc()
        return _json(
            {
                "ok": True,
                "endpoint_id": record.endpoint_id,
                "heartbeat_interval_s": float(self.settings.heartbeat_interval),
                **grant.fields(),
            }
        )

    async def heartbeat(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request, ENDPOINTS, "heartbeat")
        body = decode(await self._body(request), EndpointIdBody)
        if caller.claims is not None:
            current = self.registry.get(body.endpoint_id)
            self.access.check_owner(caller, "heartbeat", body.endpoint_id, current)
            if current is not None:
                allowed, why = self.access.claim_allowed(current)
                if not allowed:  # the policy changed since it registered (a reload raced it)
                    await self.gateway.evict(lambda record: (False, why), body.endpoint_id)
                    self.access.deny(caller, "heartbeat", body.endpoint_id, why)
        try:
            health = await self.gateway.heartbeat(body.endpoint_id)
        except EndpointNotRegistered:
            self.metrics.heartbeats_unknown.inc()
            raise
        self.metrics.heartbeats_ok.inc()
        answer = {"ok": True, "endpoint_id": body.endpoint_id, "status": health.status.value}
        renewed = self.access.renewal(caller)
        if renewed is not None:
            answer.update(renewed.fields())
        return _json(answer)

    async def deregister(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request, ENDPOINTS | OPERATORS, "deregister")
        body = decode(await self._body(request), EndpointIdBody)
        self.access.check_owner(
            caller, "deregister", body.endpoint_id, self.registry.get(body.endpoint_id)
        )
        await self.gateway.deregister(body.endpoint_id)
        return _json({"ok": True})

    async def agents(self, request: web.BaseRequest, _: str) -> web.Response:
        self._caller(request, READERS, "list agents")
        gw = self.gateway
        now = gw.now()
        return _json({"agents": [gw.describe(r, now) for r in gw.registry.records()]})

    async def agent(self, request: web.BaseRequest, name: str) -> web.Response:
        self._caller(request, READERS, "read an agent")
        endpoint_id = f"agent://{name}"
        gw = self.gateway
        record = gw.registry.get(endpoint_id) if is_endpoint_id(endpoint_id) else None
        if record is None:  # a malformed name cannot be registered either
            raise EndpointNotRegistered(f"{endpoint_id!r} is not registered")
        return _json(gw.describe(record, gw.now()))

    async def send(self, request: web.BaseRequest, _: str) -> web.Response:
        received_at = self.reacher.clock.monotonic()
        access = self.access
        trace_id = None
        body: SendBody | None = None
        try:
            if "X-Reach-Attempt" in request.headers:
                raise InvalidRequest(
                    "this request is a gateway's delivery (X-Reach-Attempt): an endpoint_url "
                    "points at a gateway's /v1/send, and the gateway will not deliver to itself",
                    field="X-Reach-Attempt",
                )
            # the body first (bounded, cheap): a refusal then names the caller's own msg_id and
            # trace_id, and its audit line that trace id
            body = decode(await self._body(request), SendBody)
            if not access.open:
                body.msg_id = body.msg_id or new_id("msg")
                body.trace_id = trace_id = body.trace_id or new_id("trace")
            caller = self._caller(request, SENDERS, "send", trace_id)
            access.limit(caller, trace_id)
            body.sender, scope = access.check_send(
                caller, body.sender, body.intent, body.recipient_hint, trace_id
            )
            result = await self.reacher.send(
                body, received_at, request.headers.get("traceparent"), scope
            )
        except AgentReachError as exc:
            if body is not None:
                for key, value in (("msg_id", body.msg_id), ("trace_id", body.trace_id)):
                    if value is not None:
                        exc.fields.setdefault(key, value)
            raise _with_ids(exc) from None
        return _json(result.to_body())

    async def route(self, request: web.BaseRequest, _: str) -> web.Response:
        try:
            caller = self._caller(request, READERS, "route")
            query = convert(dict(request.query), RouteQuery)
            _sender, scope = self.access.check_send(
                caller, None, query.intent, query.recipient_hint, None, action="route"
            )
            answer = self.gateway.explain_route(
                query.intent, query.recipient_hint, query.timeout_ms, scope
            )
        except AgentReachError as exc:
            raise _with_ids(exc) from None
        return _json(answer)

    async def trace(self, request: web.BaseRequest, trace_id: str) -> web.Response:
        caller = self._caller(request, READERS, "read a trace")
        events = self.traces.get(trace_id)
        if events is None or not self.access.may_read_trace(caller, trace_id, events):
            raise TraceNotFound(f"no recent request with trace_id {trace_id!r}")
        return _json({"trace_id": trace_id, "events": events})

    async def recent_traces(self, request: web.BaseRequest, _: str) -> web.Response:
        self._caller(request, OPERATORS, "list traces")
        # an empty value (``?intent=``) means no filter, as a form with a blank field sends it
        query = convert({k: v for k, v in request.query.items() if v}, TraceQuery)
        found = self.traces.recent(query.intent, query.outcome, query.limit)
        return _json({"traces": [summary.to_body() for summary in found]})

    async def inflight(self, request: web.BaseRequest, _: str) -> web.Response:
        self._caller(request, OPERATORS, "read deliveries in flight")
        # the delivery attempts this gateway process has open now, by endpoint
        counts = {eid: s.inflight for eid, s in self.gateway.stats.items() if s.inflight > 0}
        return _json(
            {
                "at": round(self.gateway.clock.wall(), 3),
                "total": sum(counts.values()),
                "endpoints": counts,
            }
        )

    async def dashboard(self, request: web.BaseRequest, _: str) -> web.Response:
        return self._send_static(request, "index.html")

    async def static(self, request: web.BaseRequest, name: str) -> web.Response:
        return self._send_static(request, name)

    def _send_static(self, request: web.BaseRequest, name: str) -> web.Response:
        item = self._static.get(name)
        if item is None:
            raise NotFound(f"no such path: {request.path}")
        if request.headers.get("If-None-Match") == item.etag:
            return web.Response(status=304, headers=item.headers)
        return web.Response(body=item.body, headers=item.headers)

    async def diagnostics(self, request: web.BaseRequest, _: str) -> web.Response:
        self._caller(request, OPERATORS, "read diagnostics")
        return _json(self.gateway.diagnostics())

    async def keys(self, request: web.BaseRequest, _: str) -> web.Response:
        # public: agents verify delivery assertions against it (empty in open mode)
        return _json(self.access.jwks())

    async def issue_token(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request, OPERATORS, "issue tokens")
        body = decode(await self._body(request), TokenRequest)
        return _json(self.access.issue(caller, body))

    async def reload(self, request: web.BaseRequest, _: str) -> web.Response:
        caller = self._caller(request, OPERATORS, "reload keys and policy")
        self.access.admin(caller, "reload", "keys+policy")
        answer = self.access.reload()
        if answer.get("policy_changed"):
            answer["evicted"] = await self._enforce_policy()
        return _json(answer)

    async def healthz(self, request: web.BaseRequest, _: str) -> web.Response:
        # always 200 while the gateway serves: with its shared registry away it still routes on
        # its last view, and says so here (and in the metric agent_reach_registry_available)
        state = self.registry.state()
        registry: dict[str, Any] = {
            "backend": state.backend,
            "available": state.available,
            "detail": state.detail,
        }
        if state.last_sync_age_s is not None:
            registry["last_sync_age_s"] = round(state.last_sync_age_s, 3)
        return _json({"ok": True, "registry": registry})

    async def render_metrics(self, request: web.BaseRequest, _: str) -> web.Response:
        return web.Response(body=self.metrics.render(), headers=_METRICS_TYPE)
