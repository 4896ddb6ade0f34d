"""``agent-reach mcp``: the same MCP server over stdio, for hosts that start a command.

The tools are those of ``/mcp`` (:class:`~agent_reach.edges.mcp.tools.ReachMcp`); their backend
is a gateway reached with the client SDK (:class:`ClientBackend`), as the token of ``--token``:
no second copy of the gateway's wiring, and the answers are the gateway's own v1 answers. The
standard output carries the protocol only; log lines go to stderr.

Every :data:`WATCH_INTERVAL_S` the gateway's intents are read; a change in those reachable now
is published as ``tools/list_changed`` (the tools' descriptions name them): to a host of the
2025 protocol as ``notifications/tools/list_changed`` (``initialize`` told it
``listChanged``), to one of the 2026 protocol on its ``subscriptions/listen`` stream
(:meth:`ReachMcp.tools_changed`). A gateway away is not an end: the tools answer its
``gateway_unavailable`` until it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import anyio
import msgspec

from agent_reach.edges.mcp.tools import ReachMcp, first_reachable, package_version
from agent_reach.errors import AgentReachError
from agent_reach.gateway.service import Caller
from agent_reach.observability.logs import log
from agent_reach.sdk.client import ReachClient
from agent_reach.wire.bodies import RouteQuery, SendBody

__all__ = ["WATCH_INTERVAL_S", "ClientBackend", "serve_stdio"]

WATCH_INTERVAL_S = 5.0


def _reachable(listing: dict[str, Any]) -> frozenset[str]:
    return frozenset(item["tag"] for item in listing.get("intents", []) if item.get("routable"))


class ClientBackend:
    """The tools' backend outside a gateway: its HTTP API through ``client``; the caller is
    the client's own token (``caller`` is unused)."""

    def __init__(self, client: ReachClient) -> None:
        self.client = client

    async def agents(self, caller: Caller | None, query: Mapping[str, str]) -> dict[str, Any]:
        # no query: the v1 list, as GET /v1/agents answers it
        path = f"/v1/agents?{urlencode(query)}" if query else "/v1/agents"
        answer: dict[str, Any] = await self.client.get(path)
        return answer

    async def intents(self, caller: Caller | None) -> dict[str, Any]:
        answer: dict[str, Any] = await self.client.get("/v1/intents")
        return answer

    async def reachable(
        self, caller: Caller | None, first: int
    ) -> tuple[list[dict[str, Any]], int]:
        return first_reachable(await self.intents(caller), first)

    async def explain(self, caller: Caller | None, query: RouteQuery) -> dict[str, Any]:
        params = {k: v for k, v in msgspec.structs.asdict(query).items() if v is not None}
        if params.pop("fallback", True) is False:
            params["fallback"] = "false"
        answer: dict[str, Any] = await self.client.get(f"/v1/route?{urlencode(params)}")
        return answer

    async def send(self, caller: Caller | None, body: SendBody) -> dict[str, Any]:
        reply = await self.client.send(
            body.intent,
            msgspec.json.decode(body.payload),
            intent_text=body.intent_text,
            recipient_hint=body.recipient_hint,
            timeout_ms=body.timeout_ms,
        )
        answer: dict[str, Any] = msgspec.to_builtins(reply)
        return answer


async def _watch(server: ReachMcp, backend: ClientBackend) -> None:
    last: frozenset[str] | None = None
    while True:
        try:
            now = _reachable(await backend.intents(None))
            if last is not None and now != last:
                await server.tools_changed()
            last = now
        except asyncio.CancelledError:
            raise
        except AgentReachError:  # the gateway away, or a token that may not read: next time
            pass
        except Exception:  # a bug must not end the loop
            log(logging.ERROR, "mcp.watch_error", exc_info=True)
        await asyncio.sleep(WATCH_INTERVAL_S)


async def serve_stdio(gateway: str, token: str | None) -> None:
    """Serve the tools on stdin/stdout over the gateway(s) at ``gateway`` until stdin ends."""
    async with ReachClient(gateway, token=token) as client:
        backend = ClientBackend(client)
        server = ReachMcp(backend, version=package_version())
        log(logging.INFO, "mcp.stdio_started", gateway=gateway)
        async with anyio.create_task_group() as group:
            group.start_soon(_watch, server, backend)
            await server.run_stdio_async()
            group.cancel_scope.cancel()
