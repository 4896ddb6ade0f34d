"""``agent-reach mcp``: the gateway's MCP tools over stdio, for LLM hosts (docs/mcp.md)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import click

from agent_reach.cli.common import gateway_options
from agent_reach.errors import ConfigError
from agent_reach.observability import logs

__all__ = ["mcp"]


@click.command()
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="JSON log lines at this level and above go to stderr (stdout carries MCP only)",
)
@functools.partial(
    gateway_options,
    token_help="bearer token the tools call the gateway with: reach sends as its subject"
    " (token mode, docs/security.md)  [default: none: open mode]",
)
def mcp(gateway: str, token: str | None, log_level: str, **_: Any) -> None:
    """Serve the MCP tools (list_agents, list_intents, explain_route, reach) over stdio.

    For an MCP host that starts a command (Claude Desktop, Claude Code, Cursor, ...): the host
    writes MCP on this command's stdin and reads its stdout. Each tool calls the gateway at
    --gateway and answers with the gateway's own v1 answer; a refusal is an error result that
    carries the v1 error body. The gateway itself also serves MCP at /mcp (streamable HTTP).
    """
    logs.configure(log_level)  # before the SDK's server: it installs no handler of its own then
    try:
        from agent_reach.edges.mcp.stdio import serve_stdio
    except ImportError as exc:
        raise ConfigError(
            "agent-reach mcp needs the mcp SDK: pip install 'agent-reach-gateway[mcp]'",
            source="mcp",
        ) from exc
    asyncio.run(serve_stdio(gateway, token))
