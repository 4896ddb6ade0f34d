"""The four MCP tools of the contract, over a :class:`Backend`: the node's service (``/mcp``)
or a gateway reached by the client SDK (``agent-reach mcp`` over stdio).

:class:`ReachMcp` is the ``mcp`` SDK's ``MCPServer`` with its two tool methods given our own
tools: the input schemas are written for a model (what each field means, what a refusal means,
that ``intent_text`` takes plain words), and the arguments are checked by the gateway's own
wire structs, so that a bad argument gets the same ``invalid_request`` body that ``/v1/send``
would answer, as an ``isError`` result. Every result carries the v1 answer as its JSON text
(hosts that show only text still see it all) and, up to :data:`MAX_STRUCTURED_BYTES` of it
(~1,000 agents listed, fewer with long descriptions), as ``structuredContent`` too: a bigger
one, re-encoded object by object by the SDK, would hold the event loop for most of a second at
50,000 agents.

The descriptions of ``reach`` and ``explain_route`` list the intents the gateway can reach
now (from the dictionary and the registry), read at every ``tools/list``; when they change,
:meth:`ReachMcp.tools_changed` tells every client: the 2026 protocol's listeners through the
SDK's subscription bus, the 2025 protocol's sessions (remembered weakly at ``initialize``,
which then says ``"tools": {"listChanged": true}``) with ``notifications/tools/list_changed``.

Invariants:
- A tool never raises to the SDK: every refusal (AgentReachError) is an ``isError`` result
  carrying the contract's error body; anything unexpected is the ``internal_error`` body,
  logged once with its traceback. A ``reach`` or ``explain_route`` refused for its arguments
  carries ``msg_id``, ``trace_id`` and ``attempts``, as ``/v1/send`` and ``/v1/route`` do.
- The tools parse, call the backend and render; who may do what is the backend's (the
  service authenticates every call with the bearer token of the HTTP request carrying it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib.metadata
import logging
import weakref
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

import msgspec
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_reach.errors import AgentReachError, InternalError, InvalidRequest
from agent_reach.gateway.service import Caller, with_ids
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import (
    AGENTS_DEFAULT_LIMIT,
    AGENTS_MAX_LIMIT,
    MAX_TIMEOUT_MS,
    RouteQuery,
    SendBody,
    decode,
)

__all__ = [
    "CALLER",
    "TOOL_NAMES",
    "Backend",
    "ReachMcp",
    "first_reachable",
    "package_version",
    "reachable_lines",
]

# who calls: the Caller of the HTTP request carrying the MCP message (set by the edge's
# middleware for each message; None over stdio, where the backend's own token speaks)
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "agent_reach_mcp_caller", default=None
)
MAX_LISTED = 40  # intents named in a description; the rest are counted (list_intents has all)
_Args = TypeVar("_Args", RouteQuery, SendBody)
NOTIFY_TIMEOUT_S = 1.0  # a 2025 session's event stream that takes longer is skipped this time
# a result whose JSON is longer carries it as text only, not also as structuredContent: the SDK
# re-encodes a structured answer object by object on the event loop (at 50,000 agents the
# list held it 0.4-0.7 s; a string of the same JSON 30-60 ms: benchmarks/routes_hold_bench.py)
MAX_STRUCTURED_BYTES = 256 * 1024


class Backend(Protocol):
    """What the tools call: the v1 answers as JSON-ready dicts (the listings, which may be
    large, as their JSON too), refusals as AgentReachError."""

    async def agents(
        self, caller: Caller | None, query: Mapping[str, str]
    ) -> dict[str, Any] | bytes:
        """``GET /v1/agents?...``: the v1 list (no query), or one page (limit, cursor, intent,
        status)."""
        ...

    async def intents(self, caller: Caller | None) -> dict[str, Any] | bytes:
        """``GET /v1/intents``."""
        ...

    async def reachable(
        self, caller: Caller | None, first: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The first ``first`` intents of ``GET /v1/intents`` that some agent can take now and
        are not deprecated, as its items (``tag``, ``description``, ``routable``), and how many
        more there are (:func:`first_reachable` of the listing, or a cheaper way to the same)."""
        ...

    async def explain(self, caller: Caller | None, query: RouteQuery) -> dict[str, Any]:
        """``GET /v1/route``."""
        ...

    async def send(self, caller: Caller | None, body: SendBody) -> dict[str, Any]:
        """``POST /v1/send``."""
        ...


# --- the tools' inputs, written for a model ------------------------------------------------

_INTENT = {
    "type": "string",
    "maxLength": 128,
    "description": (
        "The intent tag to reach, exactly as the gateway knows it: dot-separated lower-case "
        "segments such as 'weather.query'. Take it from the list below or from list_intents. "
        "Leave it out and give intent_text instead when you do not know the tag."
    ),
}
_TEXT = {
    "type": "string",
    "maxLength": 2000,
    "description": (
        "What you want, in plain words, in any language (for example 'what is the weather in "
        "Chengdu tomorrow' or '帮我查一下明天成都的天气'). Used when no agent declares `intent` "
        "exactly: the gateway matches the words to a tag and delivers only when it is "
        "confident enough; otherwise it refuses and names the nearest tags."
    ),
}
_HINT = {
    "type": "string",
    "description": (
        "Optional: one endpoint to deliver to, as 'agent://NAME' (see list_agents). Nothing is "
        "delivered anywhere else: if that agent is unknown, down or does not declare the "
        "intent, the call is refused."
    ),
}
_PAYLOAD = {
    "description": (
        "The request for the agent: any JSON, usually an object with the fields its intent "
        'expects (for example {"city": "Chengdu", "date": "2026-12-02"}). Default {}.'
    ),
}
_TIMEOUT = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_TIMEOUT_MS,
    "description": (
        "The whole deadline of this call in milliseconds (default 8000). The answer comes back "
        "within it, whatever the agents do; retries and failover happen inside it."
    ),
}
_REFUSALS = (
    " A refusal is an error result whose JSON has 'error' (the reason code) and 'detail': "
    "no_capable_agent means no agent serves that intent or the words matched none "
    "confidently (see 'suggestions' for the nearest tags and try one of them as intent); "
    "no_available_agent means the capable agents are down now (retry later); "
    "deadline_exceeded and all_attempts_failed mean the agents did not answer in time."
)


def _schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False}


_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_TOOLS: dict[str, tuple[str, str, dict[str, Any], ToolAnnotations]] = {
    "list_agents": (
        "List agents",
        "The agents registered with the gateway: each one's id (agent://NAME), the intents it "
        "declares, its health (healthy, degraded, suspect, down) and its latencies. With no "
        "argument: every agent, in registration order. With any argument: one page, in id "
        "order, of at most 'limit' agents (default 100), with 'total' (how many match) and "
        "'next_cursor': pass it back as 'cursor' for the next page (null: there are no more). "
        "A large registry (hundreds of agents or more) is long to read whole: page it with "
        "'limit', and narrow it with 'intent' or 'status'.",
        _schema(
            {
                "intent": {
                    "type": "string",
                    "description": "Optional: only the agents that declare this exact tag.",
                },
                "status": {
                    "type": "string",
                    "enum": ["healthy", "degraded", "suspect", "down"],
                    "description": "Optional: only the agents in this health now.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": AGENTS_MAX_LIMIT,
                    "description": "Optional: how many agents at most on the page (default "
                    f"{AGENTS_DEFAULT_LIMIT}).",
                },
                "cursor": {
                    "type": "string",
                    "description": "Optional: the next_cursor of the previous page, to go on "
                    "from there (with the same intent and status).",
                },
            }
        ),
        _READ_ONLY,
    ),
    "list_intents": (
        "List intents",
        "Every intent the gateway knows: the dictionary's tags with their descriptions, "
        "aliases and examples, and the tags agents registered; 'routable' counts the agents "
        "that can take a request for it now.",
        _schema({}),
        _READ_ONLY,
    ),
    "explain_route": (
        "Explain a route",
        "Where a reach would go now, without delivering anything: the tag matched (and how: "
        "exact, alias or semantic, with a confidence), the agent chosen, the candidates and "
        "why each is eligible or not, the per-try timeout and retries. Give intent, or "
        "intent_text, or both." + _REFUSALS,
        _schema({"intent": _INTENT, "intent_text": _TEXT, "recipient_hint": _HINT}),
        _READ_ONLY,
    ),
    "reach": (
        "Reach an agent",
        "Send a request to the agent that serves an intent and return its answer ('result'), "
        "with the agent that answered, every attempt and a trace_id. The gateway picks a live, "
        "capable agent, retries and fails over within timeout_ms, and refuses rather than "
        "guess: give intent when you know the tag, or intent_text (plain words) when you do "
        "not." + _REFUSALS,
        _schema(
            {
                "intent": _INTENT,
                "intent_text": _TEXT,
                "payload": _PAYLOAD,
                "recipient_hint": _HINT,
                "timeout_ms": _TIMEOUT,
            }
        ),
        ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
    ),
}
TOOL_NAMES = tuple(_TOOLS)


def package_version() -> str:
    """This package's version, for the server's ``serverInfo``."""
    try:
        return importlib.metadata.version("agent-reach-gateway")
    except importlib.metadata.PackageNotFoundError:  # a source tree without an install
        return "0"


def first_reachable(listing: Mapping[str, Any], first: int) -> tuple[list[dict[str, Any]], int]:
    """The first ``first`` intents of a ``/v1/intents`` answer that some agent can take now,
    deprecated ones left out, and how many more there are."""
    live = [i for i in listing.get("intents", []) if i.get("routable") and not i.get("deprecated")]
    return live[:first], max(0, len(live) - first)


def reachable_lines(items: list[dict[str, Any]], rest: int) -> list[str]:
    """The intents some agent can take now, one line each (``tag: description (N agents)``),
    then a count of the ``rest``."""
    lines = []
    for item in items:
        n = item["routable"]
        about = f": {item['description']}" if item.get("description") else ""
        lines.append(f"- {item['tag']}{about} ({n} agent{'s' if n != 1 else ''})")
    if rest:
        lines.append(f"- ... and {rest} more (call list_intents)")
    return lines


def _reachable_text(reachable: tuple[list[dict[str, Any]], int] | None) -> str:
    if reachable is None:
        return "\n\nThe intents reachable now could not be read: call list_intents."
    lines = reachable_lines(*reachable)
    if not lines:
        return "\n\nNo agent can take a request now (none is registered and live)."
    return "\n\nIntents reachable now:\n" + "\n".join(lines)


# --- the server ----------------------------------------------------------------------------


def _result(answer: Mapping[str, Any] | bytes, *, error: bool = False) -> CallToolResult:
    """The v1 answer (or its JSON) as the result's JSON text, and as ``structuredContent`` too
    unless its JSON is over :data:`MAX_STRUCTURED_BYTES` (the text alone then: one string for
    the SDK to copy)."""
    data = answer if isinstance(answer, bytes) else msgspec.json.encode(answer)
    structured: dict[str, Any] | None = None
    if len(data) <= MAX_STRUCTURED_BYTES:
        structured = msgspec.json.decode(data) if isinstance(answer, bytes) else dict(answer)
    return CallToolResult(
        content=[TextContent(type="text", text=data.decode())],
        structured_content=structured,
        is_error=error,
    )


def _arguments(name: str, arguments: Mapping[str, Any], allowed: Mapping[str, Any]) -> None:
    for key in arguments:
        if key not in allowed:
            raise InvalidRequest(
                f"{name} takes no argument {key!r} (it takes: {', '.join(allowed) or 'none'})",
                field=str(key),
            )


def _parsed(name: str, arguments: Mapping[str, Any], kind: type[_Args]) -> _Args:
    """The arguments of a send or a dry run as its wire struct; refused, the error carries new
    ``msg_id``, ``trace_id`` and ``attempts``, as ``/v1/send``'s and ``/v1/route``'s do."""
    try:
        _arguments(name, arguments, _TOOLS[name][2]["properties"])
        return decode(msgspec.json.encode(arguments), kind)
    except AgentReachError as exc:
        raise with_ids(exc) from None


def _connection(session: ServerSession) -> Connection | None:
    """The connection (2025: the session and its event stream) a request's ``session`` speaks
    for. The SDK gives a middleware the request's ``ServerSession``, built anew for each
    message, and keeps its connection private (its ``Context.connection`` is not given to
    handlers yet): read here, in one place; an SDK without it gives None (no notifications)."""
    connection = getattr(session, "_connection", None)
    return connection if isinstance(connection, Connection) else None


class ReachMcp(MCPServer[Any]):
    """``MCPServer`` serving the four tools over ``backend``. ``bus`` is the SDK's subscription
    bus; :meth:`tools_changed` publishes on it and notifies the 2025 protocol's sessions, to
    which ``initialize`` says ``listChanged`` (not on a stateless server: without a session
    there is no event stream to be told on)."""

    def __init__(self, backend: Backend, *, version: str) -> None:
        self.bus = InMemorySubscriptionBus()
        # the 2025 protocol's live sessions, held weakly: an ended one is dropped
        self._sessions: weakref.WeakSet[Connection] = weakref.WeakSet()
        super().__init__(
            "agent-reach",
            title="Agent-Reach",
            description="Find agents, explain routes, and reach agents by intent or words",
            instructions=(
                "This server reaches other agents through an Agent-Reach gateway. Call reach "
                "with an intent tag, or with intent_text in plain words, and a payload; the "
                "gateway picks a live agent that serves it. A refusal (no_capable_agent) is "
                "the gateway declining to guess: try a suggested tag, or ask the user."
            ),
            version=version,
            subscriptions=self.bus,
            middleware=[self._bind_caller, self._handshake],
        )
        self.backend = backend
        self._calls = 0  # tool calls in hand
        self._idle = asyncio.Event()
        self._idle.set()

    @staticmethod
    async def _bind_caller(ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        # the HTTP request carrying this message says who calls (the edge put it in its scope)
        request = ctx.request
        scope = getattr(request, "scope", None)
        caller = scope.get("agent_reach.caller") if isinstance(scope, dict) else None
        token = CALLER.set(caller)
        try:
            return await call_next(ctx)
        finally:
            CALLER.reset(token)

    async def _handshake(self, ctx: ServerRequestContext[Any, Any], call_next: Any) -> Any:
        # a 2025 session's initialize: listChanged said, and the session remembered (weakly,
        # and dropped at once when it ends) for tools_changed. (The SDK takes listChanged from
        # options its streamable HTTP manager does not pass: hence the answer amended.) No
        # event stream (stateless HTTP): nothing to say it on, so not said.
        result = await call_next(ctx)
        if ctx.method != "initialize" or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return result
        connection = _connection(ctx.session)
        if connection is None or not connection.has_standalone_channel:
            return result
        tools = result.get("capabilities", {}).get("tools") if isinstance(result, dict) else None
        if isinstance(tools, dict):
            tools["listChanged"] = True
        self._sessions.add(connection)
        connection.exit_stack.callback(self._sessions.discard, connection)
        return result

    async def list_tools(self) -> list[Tool]:
        """The four tools; the descriptions of reach and explain_route name the intents
        reachable now."""
        found: tuple[list[dict[str, Any]], int] | None = None
        # a token that may not read them: the tools are still listed
        with contextlib.suppress(AgentReachError):
            found = await self.backend.reachable(CALLER.get(), MAX_LISTED)
        reachable = _reachable_text(found)
        tools = []
        for name, (title, description, schema, hints) in _TOOLS.items():
            if name in ("reach", "explain_route"):
                description += reachable
            tools.append(
                Tool(
                    name=name,
                    title=title,
                    description=description,
                    input_schema=schema,
                    annotations=hints,
                )
            )
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult:
        """Run one tool: its v1 answer, or the v1 error body as an ``isError`` result."""
        self._calls += 1
        self._idle.clear()
        try:
            return await self._call(name, arguments)
        finally:
            self._calls -= 1
            if not self._calls:
                self._idle.set()

    async def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the tool calls in hand to end; whether they did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def _call(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        caller = CALLER.get()
        backend = self.backend
        try:
            spec = _TOOLS.get(name)
            if spec is None:
                raise InvalidRequest(f"no tool named {name!r} (tools: {', '.join(_TOOLS)})")
            if name == "list_agents":
                _arguments(name, arguments, spec[2]["properties"])
                # no argument: the v1 list, as GET /v1/agents; any: a page. The values as a
                # query string's, checked by the gateway's own decoder
                params = {k: str(v) for k, v in arguments.items() if v is not None}
                return _result(await backend.agents(caller, params))
            if name == "list_intents":
                _arguments(name, arguments, spec[2]["properties"])
                return _result(await backend.intents(caller))
            if name == "explain_route":
                query = _parsed(name, arguments, RouteQuery)
                return _result(await backend.explain(caller, query))
            body = _parsed(name, arguments, SendBody)
            return _result(await backend.send(caller, body))
        except AgentReachError as exc:
            return _result(exc.to_body(), error=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "mcp.unhandled", tool=name, exc_info=True)
            return _result(InternalError("unexpected error; see gateway log").to_body(), error=True)

    async def tools_changed(self) -> None:
        """Tell every client that the tools changed: those of the 2026 protocol listening
        (``subscriptions/listen``) through the bus, and each live session of the 2025 protocol
        with ``notifications/tools/list_changed`` on its event stream (one that does not take
        it within :data:`NOTIFY_TIMEOUT_S` holds up no other)."""
        await self.bus.publish(ToolsListChanged())
        sessions = [c for c in self._sessions if c.initialized.is_set()]
        await asyncio.gather(*(self._notify(c) for c in sessions))

    @staticmethod
    async def _notify(connection: Connection) -> None:
        try:  # never raises for a closed stream: the SDK drops what it cannot send
            await asyncio.wait_for(connection.send_tool_list_changed(), NOTIFY_TIMEOUT_S)
        except TimeoutError:
            log(logging.WARNING, "mcp.notify_slow", session_id=connection.session_id)
