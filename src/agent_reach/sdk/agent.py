"""A small agent SDK: serve the contract's delivery endpoint, register, heartbeat.

This is the first cut, enough for the examples and the end-to-end tests: handlers per intent
(sync or async), registration on start, deregistration on stop, heartbeats with jitter that
re-register when the gateway answers ``endpoint_not_registered``. Sync handlers run in a worker
thread so that they do not block the event loop the heartbeats run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from agent_reach.core.intents import is_endpoint_id, is_intent
from agent_reach.logs import TRACE_ID, log

__all__ = ["Agent", "ReachContext", "Reject"]

Handler = Callable[[Any, "ReachContext"], Any]


@dataclass(frozen=True, slots=True)
class ReachContext:
    """What a handler knows of the request besides its payload."""

    msg_id: str
    trace_id: str
    intent: str
    sender: str | None
    priority: str
    attempt: int
    deadline_ms: int


class Reject(Exception):
    """Raise in a handler to refuse a request with a 4xx (not retried by the gateway)."""

    def __init__(self, detail: str, status: int = 400, code: str = "rejected") -> None:
        super().__init__(detail)
        if not 400 <= status < 500:
            raise ValueError("Reject status must be 4xx")
        self.detail, self.status, self.code = detail, status, code


class _Delivery(msgspec.Struct):
    intent: str
    msg_id: str = ""
    trace_id: str = ""
    sender: str | None = None
    payload: Any = None
    priority: str = "normal"


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(body), status=status, content_type="application/json"
    )


def _header_int(request: web.Request, name: str, default: int) -> int:
    value = request.headers.get(name, "")
    return int(value) if value.isdigit() else default


class Agent:
    """An agent process: ``@agent.handle("weather.query")`` then ``agent.run()``."""

    def __init__(
        self,
        endpoint_id: str,
        *,
        gateway: str = "http://127.0.0.1:7700",
        description: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = "/reach",
        shutdown_timeout: float = 5.0,
    ) -> None:
        if not is_endpoint_id(endpoint_id):
            raise ValueError(f"{endpoint_id!r} is not an agent://name endpoint id")
        self.endpoint_id = endpoint_id
        self.gateway = gateway.rstrip("/")
        self.description = description
        self.host, self.port, self.path = host, port, path
        self.shutdown_timeout = shutdown_timeout
        self.handlers: dict[str, Handler] = {}
        self.heartbeat_interval = 10.0
        self.url: str | None = None
        self._registered = False
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._beat: asyncio.Task[None] | None = None

    def handle(self, intent: str) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of ``intent``."""
        if not is_intent(intent):
            raise ValueError(f"{intent!r} is not a valid intent tag")

        def decorate(fn: Handler) -> Handler:
            self.handlers[intent] = fn
            return fn

        return decorate

    async def _serve(self, request: web.Request) -> web.Response:
        try:
            d = msgspec.json.decode(await request.read(), type=_Delivery)
        except msgspec.DecodeError as exc:
            return _json({"ok": False, "error": "invalid_request", "detail": str(exc)}, 400)
        token = TRACE_ID.set(d.trace_id or request.headers.get("X-Reach-Trace-Id"))
        try:
            handler = self.handlers.get(d.intent)
            if handler is None:
                return _json(
                    {
                        "ok": False,
                        "error": "unknown_intent",
                        "detail": f"{self.endpoint_id} does not handle {d.intent!r}",
                    },
                    404,
                )
            ctx = ReachContext(
                msg_id=d.msg_id,
                trace_id=d.trace_id,
                intent=d.intent,
                sender=d.sender,
                priority=d.priority,
                attempt=_header_int(request, "X-Reach-Attempt", 1),
                deadline_ms=_header_int(request, "X-Reach-Deadline-Ms", 0),
            )
            log(
                logging.INFO,
                "agent.request",
                endpoint_id=self.endpoint_id,
                intent=d.intent,
                msg_id=d.msg_id,
                attempt=ctx.attempt,
            )
            try:
                if inspect.iscoroutinefunction(handler):
                    result = await handler(d.payload, ctx)
                else:
                    result = await asyncio.to_thread(handler, d.payload, ctx)
            except Reject as exc:
                log(logging.INFO, "agent.rejected", detail=exc.detail, status=exc.status)
                return _json({"ok": False, "error": exc.code, "detail": exc.detail}, exc.status)
            except Exception as exc:
                log(logging.ERROR, "agent.handler_failed", intent=d.intent, exc_info=True)
                return _json({"ok": False, "error": "handler_failed", "detail": str(exc)}, 500)
            return _json(result)
        finally:
            TRACE_ID.reset(token)

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert self._session is not None
        async with self._session.post(self.gateway + path, json=body) as resp:
            return resp.status, await resp.json(content_type=None)

    async def register(self) -> None:
        """Register (or register again) with the gateway; raises on refusal."""
        status, answer = await self._post(
            "/v1/register",
            {
                "endpoint_id": self.endpoint_id,
                "capabilities": list(self.handlers),
                "endpoint_url": self.url,
                "description": self.description,
            },
        )
        if status != 200:
            raise RuntimeError(f"registration refused ({status}): {answer}")
        self.heartbeat_interval = float(answer["heartbeat_interval_s"])
        self._registered = True
        log(logging.INFO, "agent.registered", endpoint_id=self.endpoint_id, url=self.url)

    async def _heartbeats(self) -> None:
        while True:
            # a little early and jittered, so agents do not beat in step or arrive late;
            # while unregistered (gateway not up yet, or restarted), try again every second
            period = self.heartbeat_interval if self._registered else 1.0 / 0.7
            await asyncio.sleep(period * random.uniform(0.6, 0.8))
            try:
                if not self._registered:
                    await self.register()
                    continue
                status, _ = await self._post("/v1/heartbeat", {"endpoint_id": self.endpoint_id})
                if status == 404:
                    self._registered = False
                    await self.register()
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                log(
                    logging.WARNING,
                    "agent.heartbeat_failed",
                    error=str(exc),
                    registered=self._registered,
                )

    async def start(self) -> None:
        """Serve, register and start heartbeating."""
        app = web.Application()
        app.router.add_post(self.path, self._serve)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self.shutdown_timeout
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{port}{self.path}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        try:
            await self.register()
        except (aiohttp.ClientError, TimeoutError) as exc:
            # the gateway may start after its agents: keep serving, register when it is up
            log(logging.WARNING, "agent.register_failed", error=str(exc), retry="every ~1 s")
        self._beat = asyncio.create_task(self._heartbeats())

    async def stop(self) -> None:
        """Deregister, stop heartbeating and serving."""
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self._session is not None:
            if self._registered:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    await self._post("/v1/deregister", {"endpoint_id": self.endpoint_id})
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def run(self) -> None:
        """Start, print the agent's URL, and run until SIGINT/SIGTERM."""

        async def main() -> None:
            await self.start()
            print(f"{self.endpoint_id} serving {sorted(self.handlers)} at {self.url}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            await self.stop()

        asyncio.run(main())
