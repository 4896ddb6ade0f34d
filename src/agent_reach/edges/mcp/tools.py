"""The four MCP tools of the contract, over a :class:`Backend`: the node's service (``/mcp``)
or a gateway reached by the client SDK (``agent-reach mcp`` over stdio).

:class:`ReachMcp` is the ``mcp`` SDK's ``MCPServer`` with its two tool methods given our own
tools: the input schemas are written for a model (what each field means, what a refusal means,
that ``intent_text`` takes plain words), and the arguments are checked by the gateway's own
wire structs, so that a bad argument gets the same ``invalid_request`` body that ``/v1/send``
would answer, as an ``isError`` result. Every result carries the v1 answer twice: as
``structuredContent`` and as its JSON text (hosts that show only text still see it all).

The descriptions of ``reach`` and ``explain_route`` list the intents the gateway can reach
now (from the dictionary and the registry), read at every ``tools/list``.

Invariants:
- A tool never raises to the SDK: every refusal (AgentReachError) is an ``isError`` result
  carrying the contract's error body; anything unexpected is the ``internal_error`` body,
  logged once with its traceback.
- The tools parse, call the backend and render; who may do what is the backend's (the
  service authenticates every call with the bearer token of the HTTP request carrying it).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.metadata
import logging
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations

from agent_reach.errors import AgentReachError, InternalError, InvalidRequest
from agent_reach.gateway.service import Caller
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import (
    AGENTS_DEFAULT_LIMIT,
    AGENTS_MAX_LIMIT,
    MAX_TIMEOUT_MS,
    RouteQuery,
    SendBody,
    decode,
)

__all__ = ["CALLER", "TOOL_NAMES", "Backend", "ReachMcp", "package_version", "reachable_lines"]

# who calls: the Caller of the HTTP request carrying the MCP message (set by the edge's
# middleware for each message; None over stdio, where the backend's own token speaks)
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "agent_reach_mcp_caller", default=None
)
MAX_LISTED = 40  # intents named in a description; the rest are counted (list_intents has all)


class Backend(Protocol):
    """What the tools call: the v1 answers as JSON-ready dicts, refusals as AgentReachError."""

    async def agents(self, caller: Caller | None, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET /v1/agents?...``: one page (limit, cursor, intent, status)."""
        ...

    async def intents(self, caller: Caller | None) -> dict[str, Any]:
        """``GET /v1/intents``."""
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
        "declares, its health (healthy, degraded, suspect, down) and its latencies. At most "
        "'limit' a call (default 100), in id order, with 'total' (how many match) and "
        "'next_cursor': pass it back as 'cursor' for the next ones (null: there are no more).",
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
                    "description": "How many at most (default 100).",
                },
                "cursor": {
                    "type": "string",
                    "description": "The next_cursor of the previous call, to go on from there.",
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


def reachable_lines(listing: Mapping[str, Any]) -> list[str]:
    """The intents of a ``/v1/intents`` answer that some agent can take now, one line each
    (``tag: description (N agents)``), dictionary order first; at most :data:`MAX_LISTED`,
    then a count of the rest."""
    lines: list[str] = []
    rest = 0
    for item in listing.get("intents", []):
        if not item.get("routable") or item.get("deprecated"):
            continue
        if len(lines) == MAX_LISTED:
            rest += 1
            continue
        n = item["routable"]
        about = f": {item['description']}" if item.get("description") else ""
        lines.append(f"- {item['tag']}{about} ({n} agent{'s' if n != 1 else ''})")
    if rest:
        lines.append(f"- ... and {rest} more (call list_intents)")
    return lines


def _reachable_text(listing: Mapping[str, Any] | None) -> str:
    if listing is None:
        return "\n\nThe intents reachable now could not be read: call list_intents."
    lines = reachable_lines(listing)
    if not lines:
        return "\n\nNo agent can take a request now (none is registered and live)."
    return "\n\nIntents reachable now:\n" + "\n".join(lines)


# --- the server ----------------------------------------------------------------------------


def _result(answer: Mapping[str, Any], *, error: bool = False) -> CallToolResult:
    text = msgspec.json.encode(answer).decode()
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=dict(answer),
        is_error=error,
    )


def _arguments(name: str, arguments: Mapping[str, Any], allowed: Mapping[str, Any]) -> None:
    for key in arguments:
        if key not in allowed:
            raise InvalidRequest(
                f"{name} takes no argument {key!r} (it takes: {', '.join(allowed) or 'none'})",
                field=str(key),
            )


class ReachMcp(MCPServer[Any]):
    """``MCPServer`` serving the four tools over ``backend``. ``bus`` is the SDK's subscription
    bus (``tools/list_changed`` events go out on it: :meth:`tools_changed`)."""

    def __init__(self, backend: Backend, *, version: str) -> None:
        self.bus = InMemorySubscriptionBus()
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
            middleware=[self._bind_caller],
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

    async def list_tools(self) -> list[Tool]:
        """The four tools; the descriptions of reach and explain_route name the intents
        reachable now."""
        try:
            listing: dict[str, Any] | None = await self.backend.intents(CALLER.get())
        except AgentReachError:
            listing = None  # e.g. a token that may not read them: the tools are still listed
        reachable = _reachable_text(listing)
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
            _arguments(name, arguments, spec[2]["properties"])
            if name == "list_agents":
                # a page (bounded: a registry of 50,000 is not one tool result); the query's
                # values as a query string's, checked by the gateway's own decoder
                page = {k: str(v) for k, v in arguments.items() if v is not None}
                page.setdefault("limit", str(AGENTS_DEFAULT_LIMIT))
                return _result(await backend.agents(caller, page))
            if name == "list_intents":
                return _result(await backend.intents(caller))
            if name == "explain_route":
                query = decode(msgspec.json.encode(arguments), RouteQuery)
                return _result(await backend.explain(caller, query))
            body = decode(msgspec.json.encode(arguments), SendBody)
            return _result(await backend.send(caller, body))
        except AgentReachError as exc:
            return _result(exc.to_body(), error=True)
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "mcp.unhandled", tool=name, exc_info=True)
            return _result(InternalError("unexpected error; see gateway log").to_body(), error=True)

    async def tools_changed(self) -> None:
        """Tell the clients listening (``subscriptions/listen``) that the tools changed."""
        from mcp.server.subscriptions import ToolsListChanged

        await self.bus.publish(ToolsListChanged())
