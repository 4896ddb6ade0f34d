"""The gateway's MCP server at ``/mcp`` (streamable HTTP), mounted on the HTTP edge.

It receives a :class:`~agent_reach.gateway.node.Node` and nothing else; the tools call the
node's service (:class:`ServiceBackend`), as every other edge does. The ``mcp`` SDK does the
protocol: :class:`~agent_reach.edges.mcp.tools.ReachMcp` (its ``MCPServer``) and its
streamable HTTP session manager, reached through :func:`~agent_reach.edges.mcp.asgi.serve_asgi`.

Built at the first request to ``/mcp``, not at start: importing the SDK and building its
server cost about 1.5 s of CPU, which a gateway that never serves MCP should not pay. Both run
in a worker thread; only the start of the session manager (well under a millisecond) runs on
the event loop. The thread still takes the GIL from the loop: measured on 2 busy cores, the
loop stalled 0.1-0.19 s once (the SDK importing ``rich`` for its logging) and under 70 ms
otherwise, where building on the loop stalled it 0.16-0.34 s. Then:

- Every request is authenticated before the SDK sees it (the gateway's own rules: the bearer
  token in token mode, the browser guard in open mode), so the SDK's DNS-rebinding check is
  off; in token mode a session is bound to its token's subject (the SDK refuses it to another).
- Sessions (the 2025 protocol's ``Mcp-Session-Id``) are bounded: ``--mcp-max-sessions`` at
  once (503 past it) and closed after ``--mcp-session-idle`` seconds without a request. Under
  ``--workers`` (``stateless``: a worker shares its port) the server is stateless (no sessions:
  a session lives in one process, and the next request may reach another). The 2026 protocol
  has no sessions at all.
- Event streams (answers as ``text/event-stream``: a 2025 session's stream, a request answered
  as events, the 2026 protocol's ``subscriptions/listen``) are bounded too: twice
  ``--mcp-max-sessions`` (at least :data:`MIN_STREAMS`) open at once, 503 ``overloaded`` past
  it (:class:`~agent_reach.edges.mcp.asgi.Streams`). A listen stream has no session, and
  enough of them held open would fill the gateway's connection table.
- A request body over ``--max-body-bytes`` is 413 ``payload_too_large`` (the contract's body)
  when its length is declared; a chunked one is counted by the SDK (413 too, its own text).
- Stopping: the tool calls in hand get the grace other requests get, then the sessions end,
  open event streams are told their client has gone, and new requests get 503 ``overloaded``.
  A manager that ends by a fault is logged, and the next request builds a new one.
- Every :data:`WATCH_INTERVAL_S` the intents reachable now are compared with the last ones; a
  change is published as ``tools/list_changed`` (:meth:`ReachMcp.tools_changed`: to the 2026
  protocol's clients listening on ``subscriptions/listen``, and as
  ``notifications/tools/list_changed`` to every live 2025 session), since the tools'
  descriptions name them.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from agent_reach.errors import (
    AgentReachError,
    ConfigError,
    InternalError,
    Overloaded,
    PayloadTooLarge,
)
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller, intents_pieces
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import RouteQuery, SendBody, encode

if TYPE_CHECKING:
    from agent_reach.edges.mcp.tools import ReachMcp

__all__ = ["WATCH_INTERVAL_S", "McpEdge", "ServiceBackend"]

WATCH_INTERVAL_S = 2.0
MIN_STREAMS = 16  # event streams open at once, at least (--mcp-max-sessions 1 would allow 2)


def _plain(answer: Any) -> dict[str, Any]:
    """A wire struct as the JSON-ready dict its HTTP answer would be."""
    plain: dict[str, Any] = msgspec.json.decode(encode(answer))
    return plain


class ServiceBackend:
    """The tools' backend inside a gateway: the node's service, as the caller of the HTTP
    request carrying the MCP message."""

    def __init__(self, node: Node) -> None:
        self.service = node.service
        self._monotonic = node.clock.monotonic

    @staticmethod
    def _who(caller: Caller | None) -> Caller:
        return caller if caller is not None else Caller("mcp")

    async def agents(self, caller: Caller | None, query: Mapping[str, str]) -> bytes:
        # the answer's JSON built as /v1/agents builds it (no query: the v1 list; else a page):
        # a chunk at a time, the loop free between, and not decoded (14 MB at 50,000 agents)
        listing = self.service.agents(self._who(caller), query)
        return b"".join([c async for c in listing])

    async def intents(self, caller: Caller | None) -> bytes:
        # encoded as /v1/intents is, a chunk of tags at a time (8 MB at 50,000 tags)
        answer = await self.service.intents(self._who(caller))
        return b"".join([piece async for piece in intents_pieces(answer)])

    async def reachable(
        self, caller: Caller | None, first: int
    ) -> tuple[list[dict[str, Any]], int]:
        return await self.service.reachable_intents(self._who(caller), first)

    async def explain(self, caller: Caller | None, query: RouteQuery) -> dict[str, Any]:
        return _plain(await self.service.explain(self._who(caller), query))

    async def send(self, caller: Caller | None, body: SendBody) -> dict[str, Any]:
        # the deadline counts from the tool call
        who = self._who(caller)._replace(received_at=self._monotonic())
        return _plain(await self.service.send(who, body))


class McpEdge:
    """``/mcp`` over one node: :meth:`handle` serves a request, :meth:`close` ends sessions."""

    def __init__(self, node: Node, *, stateless: bool = False) -> None:
        self.node = node
        self.stateless = stateless  # no sessions: other processes serve the same port
        self.service = node.service
        self.settings = node.settings
        self.server: ReachMcp | None = None
        self._handler: Any = None
        self._building = asyncio.Lock()
        self._stop = asyncio.Event()  # set by close(): the sessions end, streams disconnect
        self._tasks: list[asyncio.Task[None]] = []
        # the SDK's 503 (its only one: a new session past --mcp-max-sessions), counted
        self.sessions_refused = 0
        node.metrics.watch_bound("mcp_sessions", lambda: self.sessions_refused)
        from agent_reach.edges.mcp.asgi import Streams

        # event streams open at once (each holds a connection as long as its client likes)
        self.streams = Streams(max(MIN_STREAMS, 2 * self.settings.mcp_max_sessions))
        node.metrics.watch_bound("mcp_streams", lambda: self.streams.refused)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """One HTTP request to ``/mcp``: authenticated, then served by the SDK."""
        from agent_reach.edges.mcp.asgi import FULL_DETAIL, may_stream, serve_asgi

        if self._stop.is_set():
            raise self._stopping()
        headers = request.headers
        caller = Caller(
            remote=request.remote or "?",
            authorization=headers.get("Authorization"),
            host=headers.get("Host"),
            origin=headers.get("Origin"),
            traceparent=headers.get("traceparent"),
        )
        subject = self.service.reader(caller, "use MCP")  # Unauthorized, Forbidden
        limit = self.settings.max_body_bytes
        if (request.content_length or 0) > limit:  # (a chunked one: the SDK counts, 413)
            raise PayloadTooLarge(f"body over the {limit} byte limit")
        handler = self._handler or await self._build()
        extra: dict[str, Any] = {"agent_reach.caller": caller}
        if subject is not None:
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken

            # the SDK binds a session to the principal that opened it
            extra["user"] = AuthenticatedUser(
                AccessToken(token="", client_id=subject, scopes=[], subject=subject)
            )
        # a place for an event stream is taken before the SDK sees the request: it starts the
        # work as it begins the answer, and an `overloaded` must mean nothing was delivered
        held = may_stream(request)
        if held and not self.streams.take():
            raise Overloaded(FULL_DETAIL, retry_after_s=1)
        refused = self.streams.refused
        response = await serve_asgi(handler, request, extra, self._stop, self.streams, held=held)
        if response.status == 503 and self.streams.refused == refused:  # the SDK's
            self.sessions_refused += 1
        return response

    def _stopping(self) -> Overloaded:
        return Overloaded("the gateway is stopping: MCP takes no new requests", retry_after_s=1)

    async def _build(self) -> Any:
        async with self._building:
            if self._stop.is_set():
                raise self._stopping()
            if self._handler is not None:
                return self._handler
            settings = self.settings
            stateless = self.stateless or settings.workers > 1
            try:
                # off the loop: importing the SDK and building its server take ~1.5 s of CPU,
                # pure Python that holds the GIL (the gateway's short switch interval gives it
                # back to the loop within a millisecond: cli/main.py)
                server = await asyncio.to_thread(_make_server, self.node, stateless)
            except ImportError as exc:
                raise ConfigError(
                    "/mcp needs the mcp SDK: pip install 'agent-reach-gateway[mcp]'",
                    source="mcp",
                ) from exc
            manager = server.session_manager
            started = asyncio.Event()
            run = asyncio.create_task(self._run(manager, started), name="agent-reach-mcp")
            waiting = asyncio.ensure_future(started.wait())
            await asyncio.wait((run, waiting), return_when=asyncio.FIRST_COMPLETED)
            if not started.is_set():  # the manager ended (or failed) before it served
                waiting.cancel()
                fault = run.exception() if not run.cancelled() else None
                log(logging.ERROR, "mcp.start_failed", error=repr(fault))
                raise InternalError("the MCP server did not start; see gateway log") from fault
            watch = asyncio.create_task(self._watch(server), name="agent-reach-mcp-watch")
            self._tasks += [run, watch]
            run.add_done_callback(self._ended)
            self.server = server
            self._handler = manager.handle_request
            log(
                logging.INFO,
                "mcp.started",
                path="/mcp",
                stateless=stateless,
                max_sessions=settings.mcp_max_sessions,
                session_idle_s=settings.mcp_session_idle,
            )
            return self._handler

    async def _run(self, manager: Any, started: asyncio.Event) -> None:
        async with manager.run():
            started.set()
            await self._stop.wait()

    def _ended(self, run: asyncio.Task[None]) -> None:
        """The manager's task ended: by close(), or by a fault, after which the next request
        builds a new server rather than reach a dead one."""
        if self._stop.is_set():
            return
        fault = None if run.cancelled() else run.exception()
        log(logging.ERROR, "mcp.stopped_unexpectedly", error=repr(fault))
        self._handler = None
        self.server = None
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def _watch(self, server: ReachMcp) -> None:
        """Publish ``tools/list_changed`` when the intents reachable now change."""
        last = await self.service.reachable_now()
        while True:
            await self.node.clock.sleep(WATCH_INTERVAL_S)
            try:
                now = await self.service.reachable_now()
                if now != last:
                    last = now
                    await server.tools_changed()
            except asyncio.CancelledError:
                raise
            except AgentReachError:  # e.g. the shared registry away: the next tick sees
                continue
            except Exception:  # a bug must not end the loop
                log(logging.ERROR, "mcp.watch_error", exc_info=True)

    async def close(self, grace_s: float = 0.0) -> None:
        """Give the tool calls in hand up to ``grace_s`` to finish, then end every session
        and the loops (idempotent)."""
        if self.server is not None and grace_s > 0 and not self._stop.is_set():
            await self.server.settle(grace_s)
        self._stop.set()  # new requests: 503; open streams: a disconnect
        self._handler = None
        tasks, self._tasks = self._tasks, []
        for task in tasks[1:]:
            task.cancel()
        if tasks:
            try:
                await asyncio.wait_for(tasks[0], 5.0)
            except (TimeoutError, asyncio.CancelledError):
                tasks[0].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _make_server(node: Node, stateless: bool) -> ReachMcp:
    """The SDK imported and the server built, with its streamable HTTP session manager (not
    started): run in a worker thread, since it touches no event loop."""
    from mcp.server.transport_security import TransportSecuritySettings

    from agent_reach.edges.mcp.tools import ReachMcp, package_version

    # anyio loads its asyncio backend at its first use, which would be the manager's start on
    # the loop (~35 ms): loaded here instead
    importlib.import_module("anyio._backends._asyncio")
    settings = node.settings
    server = ReachMcp(ServiceBackend(node), version=package_version())
    server.streamable_http_app(
        stateless_http=stateless,
        max_request_body_size=settings.max_body_bytes,
        session_idle_timeout=settings.mcp_session_idle,
        max_sessions=settings.mcp_max_sessions,
        # the gateway's own browser guard ran first (Service.reader)
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return server
