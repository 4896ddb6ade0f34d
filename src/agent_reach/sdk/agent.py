"""The agent SDK: declare an agent and its handlers, serve deliveries, keep the heartbeat line.

::

    agent = Agent("agent://weather-cn-01", description="Weather for Chinese cities")

    @agent.handle("weather.query")
    def query(payload, ctx):                 # sync: runs on the agent's thread pool
        return {"city": payload["city"], "temp_c": 21}

    agent.run()                              # serve, register, heartbeat; SIGTERM deregisters

The pieces, one module each: :mod:`._delivery` turns a delivery into an answer (context, dedup
by ``msg_id``, error table) whatever the transport; :mod:`._lifeline` registers and heartbeats
on a thread of its own (the line itself in :mod:`._beat`, through the client SDK's calls);
:mod:`.asgi` mounts the delivery endpoint into an existing ASGI app; :mod:`._natslistener`
answers deliveries over NATS. This module wires them: its own aiohttp server or a NATS
subscription (``run``/``start``/``stop``, chosen by ``serve``), or an existing app's lifespan
(``asgi``/``lifespan``). Details and reasons: docs/agent-sdk.md.

Invariants: nats-py is imported only for an agent that serves over NATS (a ConfigError naming
the extra to install when it is missing); ``serve``, ``subject`` and the NATS servers are
checked when the agent is made, so a bad one never gets as far as ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from agent_reach.core.names import is_endpoint_id, is_intent
from agent_reach.errors import ConfigError
from agent_reach.observability.logs import log
from agent_reach.sdk._assertions import DeliveryVerifier
from agent_reach.sdk._delivery import (
    DEFAULT_WORKERS,
    Dispatcher,
    Handler,
    not_allowed,
    too_large,
)
from agent_reach.sdk._failover import read_capped
from agent_reach.sdk._lifeline import Lifeline
from agent_reach.sdk._wire import EMPTY, register_body
from agent_reach.sdk.asgi import AsgiDelivery
from agent_reach.sdk.client import ReachClient, Reply
from agent_reach.sdk.context import ReachContext, Reject
from agent_reach.settings import SERVE_ENV, gateway_token, gateway_urls, nats_servers

if TYPE_CHECKING:
    from agent_reach.sdk._natslistener import NatsListener

__all__ = [
    "DEFAULT_WORKERS",
    "SERVE_ENV",
    "Agent",
    "Handler",
    "ReachContext",
    "Reject",
    "nats_servers",
]

F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """An agent: an endpoint id, a description, and one handler per intent.

    ``gateway`` is one URL, a comma-separated list or a sequence of URLs of gateways that share a
    registry; it defaults to ``$AGENT_REACH_GATEWAY`` (same forms), else
    ``http://127.0.0.1:7700`` (read when the agent is made, by
    :func:`agent_reach.settings.gateway_urls`). The agent registers and heartbeats through one
    of them at a time, and moves to the next when it cannot be reached. ``host``, ``port`` (0: a
    free one) and ``path`` are where :meth:`start` serves deliveries. Sync handlers run on a pool
    of ``workers`` threads. Repeated deliveries of a ``msg_id`` are answered from one run,
    remembered for ``dedup_ttl_s`` seconds, ``dedup_size`` messages and ``dedup_max_bytes``
    bytes of answers at most (0 turns the memory off; runs in flight are still joined). Bodies over
    ``max_body_bytes`` get 413. ``shutdown_timeout`` bounds how long :meth:`stop` waits for
    deliveries in flight, and then for the runs it cancelled to end. Past ``max_inflight``
    handler runs in hand (default: the larger of 4 x ``workers`` and 64; a run whose caller
    has gone counts until it ends) a delivery is answered 503 ``backend_unavailable`` at once,
    on every transport: the gateway tries another agent. Calls to the gateway time out after
    ``request_timeout_s``; while it cannot be reached, the agent retries with a backoff of up
    to ``retry_max_s``.

    Token mode (docs/security.md): ``token`` is the agent's enrollment token (default
    ``$AGENT_REACH_TOKEN``); the agent registers with it and then holds the endpoint token the
    gateway answers with (renewed by heartbeats), which its heartbeats, deregistration and
    reaches present. ``verify_deliveries`` (default: on when the agent has a token) refuses
    deliveries not signed by the gateway for this endpoint (unsigned, expired, replayed or
    mis-addressed; :mod:`agent_reach.sdk._assertions`).

    Over NATS (docs/agent-sdk.md, "Serving over NATS"): ``serve`` is ``"http"`` (the agent's
    own server, as above) or ``nats://HOST:PORT[,nats://...]``; it defaults to
    ``$AGENT_REACH_SERVE``, else ``"http"`` (:func:`nats_servers`). Over NATS the agent opens
    no port: it answers requests to ``subject`` (default ``agents.NAME``, with ``.`` in NAME
    mapped to ``~``: :func:`agent_reach.sdk._natslistener.agent_subject`) in the queue group
    named by its endpoint id, so that replicas share the load, and registers
    ``nats:<subject>``. Past ``max_inflight`` deliveries in hand a request is answered 503 at
    once, before it is read; ``host``, ``port`` and ``path`` are not used. A bad
    ``subject`` is a ValueError here; ``subject`` without NATS too.
    """

    def __init__(
        self,
        endpoint_id: str,
        *,
        gateway: str | Sequence[str] | None = None,
        description: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        path: str = "/reach",
        shutdown_timeout: float = 5.0,
        workers: int = DEFAULT_WORKERS,
        dedup_size: int = 10_000,
        dedup_ttl_s: float = 600.0,
        dedup_max_bytes: int = 64 << 20,
        max_body_bytes: int = 1 << 20,
        request_timeout_s: float = 5.0,
        retry_max_s: float = 5.0,
        token: str | None = None,
        verify_deliveries: bool | None = None,
        serve: str | None = None,
        subject: str | None = None,
        max_inflight: int | None = None,
    ) -> None:
        if not is_endpoint_id(endpoint_id):
            raise ValueError(f"{endpoint_id!r} is not an agent://name endpoint id")
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/', got {path!r}")
        self.endpoint_id = endpoint_id
        # () for HTTP; the NATS servers to serve deliveries through otherwise
        self.nats_servers = nats_servers(serve)
        self._nats_explicit = serve is not None and bool(self.nats_servers)
        self.subject: str | None = None  # the NATS subject served (None over HTTP)
        if self.nats_servers:
            _require_nats()
            from agent_reach.sdk._natslistener import agent_subject, check_servers, check_subject

            self.nats_servers = check_servers(self.nats_servers)
            self.subject = agent_subject(endpoint_id) if subject is None else check_subject(subject)
        elif subject is not None:
            raise ValueError("subject is for an agent that serves over NATS (serve='nats://...')")
        self.gateways = gateway_urls(gateway)
        self.description = description
        self.host, self.port, self.path = host, port, path
        self.shutdown_timeout = shutdown_timeout
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.retry_max_s = retry_max_s
        self.handlers: dict[str, Handler] = {}
        self.url: str | None = None  # the endpoint_url registered, once started
        self._token = gateway_token(token)
        if verify_deliveries is None:
            verify_deliveries = self._token is not None
        self._dispatcher = Dispatcher(
            endpoint_id,
            self.handlers,
            workers=workers,
            dedup_size=dedup_size,
            dedup_ttl_s=dedup_ttl_s,
            dedup_max_bytes=dedup_max_bytes,
            owner=self,
            verifier=DeliveryVerifier(endpoint_id, self._fetch_keys) if verify_deliveries else None,
            max_inflight=max_inflight,
        )
        # handler runs in hand past which a delivery is answered 503 at once (every transport)
        self.max_inflight = self._dispatcher.max_inflight
        self._lifeline: Lifeline | None = None
        # the endpoint token of a line stopped while deliveries may still be in flight: their
        # onward reaches present it until the agent is closed (deregistering drops it)
        self._ending_token: str | None = None
        self._runner: web.AppRunner | None = None
        self._listener: NatsListener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: ReachClient | None = None

    def handle(self, intent: str) -> Callable[[F], F]:
        """Make the decorated function the handler of ``intent``.

        It is called as ``fn(payload, ctx)`` with the request's payload (any JSON) and its
        :class:`ReachContext`, and returns the JSON answer. ``async def`` handlers run on the
        agent's event loop; plain functions on its thread pool. Raise :class:`Reject` to refuse
        (4xx, final); any other exception answers 500 (the gateway may retry).
        """
        if not is_intent(intent):
            raise ValueError(f"{intent!r} is not a valid intent tag")
        if self._lifeline is not None:
            raise RuntimeError("handlers are declared before the agent starts (and registers)")

        def decorate(fn: F) -> F:
            self.handlers[intent] = fn
            return fn

        return decorate

    @property
    def gateway(self) -> str:
        """The gateway the agent registers and heartbeats through now (the first one given,
        before the agent starts)."""
        line = self._lifeline
        return line.gateway if line is not None else self.gateways[0]

    @property
    def registered(self) -> bool:
        """Whether the gateway has this agent registered, as far as the agent knows."""
        return self._lifeline is not None and self._lifeline.registered

    @property
    def verifies_deliveries(self) -> bool:
        """Whether deliveries must carry the gateway's signature for this endpoint."""
        return self._dispatcher.verifier is not None

    @property
    def endpoint_token(self) -> str | None:
        """Token mode: the endpoint token the gateway gave this agent (None before, or in open
        mode). It heartbeats, deregisters and sends as this id: keep it to the agent."""
        line = self._lifeline
        return line.endpoint_token if line is not None else self._ending_token

    @property
    def heartbeat_interval(self) -> float | None:
        """The interval the gateway asked for at registration (None before it answered)."""
        line = self._lifeline
        return line.interval if line is not None else None

    # -- serving on the agent's own aiohttp server, or over NATS ----------------------------

    async def start(self) -> None:
        """Serve deliveries (on ``host:port/path``, or on ``subject`` over NATS), register, and
        start the heartbeat line.

        Returns after the first registration attempt. A gateway that cannot be reached is not
        an error (the agent keeps trying, and serves meanwhile); one that refuses the
        registration (4xx) raises its error (e.g. :class:`~agent_reach.errors.InvalidRequest`).
        Over NATS, a NATS system that takes no connection within 2 s raises
        :class:`~agent_reach.errors.BackendUnavailable` (nothing is registered).
        """
        self._check_startable()
        if self.nats_servers:
            await self._start_nats()
            return
        app = web.Application()
        app.router.add_route("*", self.path, self._serve)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self.shutdown_timeout
        )
        await runner.setup()
        self._runner = runner
        try:
            await web.TCPSite(runner, self.host, self.port).start()
            port = runner.addresses[0][1]
            await self._begin(f"http://{self.host}:{port}{self.path}")
        except BaseException:
            self._runner = None
            await runner.cleanup()
            raise

    async def _start_nats(self) -> None:
        from agent_reach.sdk._natslistener import NatsListener

        assert self.subject is not None  # set with nats_servers
        listener = NatsListener(
            self.nats_servers,
            self.subject,
            queue=self.endpoint_id,  # replicas of one id share its deliveries
            dispatcher=self._dispatcher,
            max_body_bytes=self.max_body_bytes,
            max_inflight=self.max_inflight,
        )
        # subscribed before registering: the gateway never routes to a subject nobody serves
        await listener.start()
        self._listener = listener
        try:
            await self._begin(f"nats:{self.subject}")
        except BaseException:
            self._listener = None
            await listener.stop()
            raise

    async def stop(self) -> None:
        """Deregister and stop heartbeating, then stop serving (deliveries in flight get up to
        ``shutdown_timeout`` seconds, and the runs still going then as long again to end once
        cancelled). Handlers in flight may still reach onward meanwhile, as this agent: the
        onward-reach client (and the endpoint token) is let go only after them. Safe to call
        twice.

        Over NATS the order differs, for replicas (which share one registration): the agent
        leaves its queue group first (new deliveries go to the other members), lets those in
        flight finish, and then deregisters only if no other member answers."""
        listener, self._listener = self._listener, None
        replicas = False
        if listener is not None:
            replicas = await listener.leave(self.shutdown_timeout)
            if replicas:
                log(logging.INFO, "agent.replicas_remain", endpoint_id=self.endpoint_id)
        await self._end(deregister=not replicas)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if listener is not None:
            await listener.stop()
        # only now: a handler still running until here may reach onward, as this agent
        await self._close()

    def run(self) -> None:
        """Start, print the agent's URL, and run until SIGINT or SIGTERM, then stop."""

        async def main() -> None:
            await self.start()
            print(f"{self.endpoint_id} serving {sorted(self.handlers)} at {self.url}", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                await stop.wait()
            finally:
                await self.stop()

        asyncio.run(main())

    async def _serve(self, request: web.Request) -> web.Response:
        limit = self.max_body_bytes
        headers: dict[str, str] = {}
        if request.method != "POST":
            answer, headers = not_allowed(request.method), {"Allow": "POST"}
        elif request.content_length is not None and request.content_length > limit:
            answer = too_large(limit)
        else:
            body = await read_capped(request.content, limit)
            if body is None:
                answer = too_large(limit)
            else:
                answer = await self._dispatcher.deliver(body, request.headers)
        timing = answer.server_timing()
        if timing is not None:
            headers["Server-Timing"] = timing
        return web.Response(
            body=answer.body, status=answer.status, headers=headers, content_type="application/json"
        )

    # -- mounted into an existing ASGI app ---------------------------------------------------

    def asgi(self) -> AsgiDelivery:
        """The delivery endpoint as a raw ASGI app, to mount into Starlette or FastAPI
        (``Mount("/reach", app=agent.asgi())``); pair it with :meth:`lifespan`."""
        return AsgiDelivery(self._dispatcher, self.max_body_bytes)

    def lifespan(self, endpoint_url: str) -> Callable[[Any], AbstractAsyncContextManager[None]]:
        """A lifespan for the app that mounts :meth:`asgi`: registers ``endpoint_url`` (where
        the gateway reaches the mounted endpoint) and heartbeats while the app runs, and
        deregisters when it stops. ``Starlette(..., lifespan=agent.lifespan(url))``."""
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint_url must be an http(s) URL, got {endpoint_url!r}")
        if self._nats_explicit:
            # ($AGENT_REACH_SERVE is for agents that serve themselves: a mount ignores it)
            raise ValueError("the ASGI mount is served over HTTP: make the Agent without serve=")

        @contextlib.asynccontextmanager
        async def span(app: Any) -> AsyncIterator[None]:
            self._check_startable()
            await self._begin(endpoint_url)
            try:
                yield
            finally:
                # the server has stopped serving (and waited for its requests) by now
                await self._end()
                await self._close()

        return span

    # -- reaching other agents --------------------------------------------------------------

    async def reach(self, intent: str, payload: Any = EMPTY, **options: Any) -> Reply:
        """Reach another agent through the gateway, as this agent (``sender``).

        Takes :meth:`ReachClient.send`'s options. Inside a handler use ``ctx.reach``, which
        also carries the request's trace id and keeps within its deadline. One pooled client
        per agent, on the agent's event loop; closed when the agent stops.
        """
        return await self._reach_client().send(intent, payload, **options)

    def _reach_client(self) -> ReachClient:
        if self._client is None:
            # token mode: the agent sends as itself with its endpoint token (the current one)
            self._client = ReachClient(
                self.gateways, sender=self.endpoint_id, token=lambda: self.endpoint_token
            )
        return self._client

    async def _fetch_keys(self) -> Any:
        """The gateway's JWKS (``GET /v1/keys``) as this agent's endpoint token sees it: the
        public keys and this registration's delivery keys, to verify deliveries with. Without
        an endpoint token yet (the registration not answered) there is nothing to fetch: the
        verifier answers 503 (retried) meanwhile."""
        if self.endpoint_token is None:
            raise RuntimeError("no endpoint token yet: the registration has not been answered")
        return await self._reach_client().get("/v1/keys")

    def reach_blocking(self, coro: Any) -> Any:
        """Run an awaitable of :meth:`reach` on the agent's event loop from a worker thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError(f"{self.endpoint_id} is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError("reach_sync is for sync handlers; async handlers await ctx.reach")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- shared ------------------------------------------------------------------------------

    def _check_startable(self) -> None:
        if not self.handlers:
            raise ValueError(f"{self.endpoint_id} has no handlers: declare one with @handle")
        if self._lifeline is not None:
            raise RuntimeError(f"{self.endpoint_id} is already started")

    async def _begin(self, url: str) -> None:
        # InvalidRequest here for an endpoint_url the gateway would refuse as well
        registration = register_body(self.endpoint_id, list(self.handlers), url, self.description)
        self.url = url
        self._loop = asyncio.get_running_loop()
        line = Lifeline(
            self.gateways,
            registration,
            request_timeout_s=self.request_timeout_s,
            retry_max_s=self.retry_max_s,
            token=self._token,
        )
        self._lifeline = line
        try:
            await asyncio.wrap_future(line.start())
        except BaseException:  # refused, or start() cancelled: no thread left behind
            self._lifeline = None
            await asyncio.wrap_future(line.stop())
            raise

    async def _end(self, *, deregister: bool = True) -> None:
        """Deregister (when asked) and stop the heartbeat line. The onward-reach client and
        the endpoint token stay: deliveries in flight may still reach (:meth:`_close`)."""
        line, self._lifeline = self._lifeline, None
        if line is not None:
            # read before deregistering, which drops it: readable until _close
            self._ending_token = line.endpoint_token
            await asyncio.wrap_future(line.stop(deregister=deregister))

    async def _close(self) -> None:
        """After the deliveries in flight have ended (or had their time): cancel the runs
        left, then close the onward-reach client and let the endpoint token go."""
        await self._dispatcher.close(self.shutdown_timeout)
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        self._ending_token = None


def _require_nats() -> None:
    """ConfigError naming the extra to install when nats-py is not there (before
    :mod:`agent_reach.sdk._natslistener`, which imports it, is imported)."""
    if importlib.util.find_spec("nats") is None:
        raise ConfigError(
            "serving over NATS needs nats-py: pip install 'agent-reach-gateway[nats]'",
            source="serve",
        )
