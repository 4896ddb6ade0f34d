"""The gateway's HTTP edge: thin aiohttp routes that parse, call the service, and render.

Errors are rendered in one place (:func:`_errors` middleware) from the exception tree of
:mod:`agent_reach.errors`; anything unexpected is a 500 ``internal_error``, logged once with its
traceback, and never takes the process down.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from agent_reach.clock import Clock, SystemClock
from agent_reach.core.intents import is_endpoint_id
from agent_reach.errors import (
    AgentReachError,
    EndpointNotRegistered,
    InvalidRequest,
    PayloadTooLarge,
    TraceNotFound,
)
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.monitor import run_purger, run_ticker
from agent_reach.gateway.reach import Reacher, new_id
from agent_reach.gateway.schemas import (
    EndpointIdBody,
    RegisterBody,
    RouteQuery,
    SendBody,
    convert,
    decode,
    encode,
)
from agent_reach.gateway.service import Gateway
from agent_reach.gateway.traces import TraceStore
from agent_reach.logs import log
from agent_reach.registry import RegistryBackend, open_registry
from agent_reach.settings import GatewaySettings
from agent_reach.transport import HttpTransport, Transport

__all__ = ["GATEWAY", "create_app"]

GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
_REACHER: web.AppKey[Reacher] = web.AppKey("reacher", Reacher)
_METRICS: web.AppKey[GatewayMetrics] = web.AppKey("metrics", GatewayMetrics)
_TRACES: web.AppKey[TraceStore] = web.AppKey("traces", TraceStore)

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type="application/json")


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except AgentReachError as exc:
        return _json(exc.to_body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "invalid_request")
        return _json({"ok": False, "error": code, "detail": exc.reason}, exc.status)
    except asyncio.CancelledError:
        raise
    except Exception:
        log(logging.ERROR, "http.unhandled", path=request.path, exc_info=True)
        return _json(
            {"ok": False, "error": "internal_error", "detail": "unexpected error; see gateway log"},
            500,
        )


async def _body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        limit = request.app[GATEWAY].settings.max_body_bytes
        raise PayloadTooLarge(f"body over the {limit} byte limit") from exc


async def register(request: web.Request) -> web.Response:
    body = decode(await _body(request), RegisterBody)
    gw = request.app[GATEWAY]
    record = await gw.register(body)
    request.app[_METRICS].registrations.inc()
    return _json(
        {
            "ok": True,
            "endpoint_id": record.endpoint_id,
            "heartbeat_interval_s": float(gw.settings.heartbeat_interval),
        }
    )


async def heartbeat(request: web.Request) -> web.Response:
    body = decode(await _body(request), EndpointIdBody)
    metrics = request.app[_METRICS]
    try:
        health = await request.app[GATEWAY].heartbeat(body.endpoint_id)
    except EndpointNotRegistered:
        metrics.heartbeats_unknown.inc()
        raise
    metrics.heartbeats_ok.inc()
    return _json({"ok": True, "endpoint_id": body.endpoint_id, "status": health.status.value})


async def deregister(request: web.Request) -> web.Response:
    body = decode(await _body(request), EndpointIdBody)
    await request.app[GATEWAY].deregister(body.endpoint_id)
    return _json({"ok": True})


async def agents(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    now = gw.now()
    return _json({"agents": [gw.describe(r, now) for r in gw.registry.records()]})


async def agent(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    endpoint_id = f"agent://{name}"
    gw = request.app[GATEWAY]
    record = gw.registry.get(endpoint_id) if is_endpoint_id(endpoint_id) else None
    if record is None:  # a malformed name cannot be registered either
        raise EndpointNotRegistered(f"{endpoint_id!r} is not registered")
    return _json(gw.describe(record, gw.now()))


def _with_ids(exc: AgentReachError) -> AgentReachError:
    """Every error answer of /v1/send (and its dry run) carries msg_id, trace_id, attempts."""
    exc.fields.setdefault("msg_id", new_id("msg"))
    exc.fields.setdefault("trace_id", new_id("trace"))
    exc.fields.setdefault("attempts", [])
    return exc


async def send(request: web.Request) -> web.Response:
    reacher = request.app[_REACHER]
    received_at = reacher.clock.monotonic()
    try:
        if "X-Reach-Attempt" in request.headers:
            raise InvalidRequest(
                "this request is a gateway's delivery (X-Reach-Attempt): an endpoint_url points "
                "at a gateway's /v1/send, and the gateway will not deliver to itself",
                field="X-Reach-Attempt",
            )
        body = decode(await _body(request), SendBody)
        result = await reacher.send(body, received_at)
    except AgentReachError as exc:
        raise _with_ids(exc) from None
    return _json(result.to_body())


async def route(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    try:
        query = convert(dict(request.query), RouteQuery)
        answer = gw.explain_route(query.intent, query.recipient_hint, query.timeout_ms)
    except AgentReachError as exc:
        raise _with_ids(exc) from None
    return _json(answer)


async def trace(request: web.Request) -> web.Response:
    trace_id = request.match_info["trace_id"]
    events = request.app[_TRACES].get(trace_id)
    if events is None:
        raise TraceNotFound(f"no recent request with trace_id {trace_id!r}")
    return _json({"trace_id": trace_id, "events": events})


async def healthz(request: web.Request) -> web.Response:
    return _json({"ok": True})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[_METRICS].render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


def create_app(
    settings: GatewaySettings,
    *,
    clock: Clock | None = None,
    registry: RegistryBackend | None = None,
    transport: Transport | None = None,
    rng: random.Random | None = None,
) -> web.Application:
    """The gateway as an aiohttp application; its background loops run while it is started."""
    settings.check()
    clock = clock or SystemClock()
    registry = registry or open_registry(settings.registry)
    transport = transport or HttpTransport(max_response_bytes=settings.max_body_bytes)
    gateway = Gateway(settings, registry, clock, rng=rng)
    metrics_ = GatewayMetrics(gateway.status_counts)
    traces = TraceStore(settings.trace_capacity)
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[_errors])
    app[GATEWAY] = gateway
    app[_METRICS] = metrics_
    app[_TRACES] = traces
    app[_REACHER] = Reacher(gateway, transport, metrics_, traces, wall=clock.wall)
    app.router.add_post("/v1/register", register)
    app.router.add_post("/v1/heartbeat", heartbeat)
    app.router.add_post("/v1/deregister", deregister)
    app.router.add_get("/v1/agents", agents)
    app.router.add_get("/v1/agents/{name}", agent)
    app.router.add_post("/v1/send", send)
    app.router.add_get("/v1/route", route)
    app.router.add_get("/v1/traces/{trace_id}", trace)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await registry.start()
        await transport.start()
        tasks = [
            asyncio.create_task(run_ticker(gateway, metrics_), name="agent-reach-ticker"),
            asyncio.create_task(run_purger(gateway), name="agent-reach-purger"),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await transport.close()
            await registry.close()

    app.cleanup_ctx.append(lifecycle)
    return app
