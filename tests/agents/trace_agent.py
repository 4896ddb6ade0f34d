"""A test agent for trace propagation: it answers what trace context it saw, and relays.

``trace.echo`` answers the request's ``trace_id`` and ``traceparent``; ``trace.relay`` (async,
``ctx.reach``) and ``trace.relay_sync`` (a sync handler, ``ctx.reach_sync``) reach
``trace.echo`` onward and answer what they saw and what the onward hop saw. With
``OTEL_TRACES_EXPORTER=console`` in its environment, its spans go to stdout.
"""

from __future__ import annotations

import argparse
from typing import Any

from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", default="agent://trace-01")
args = parser.parse_args()

logs.configure("INFO")
agent = Agent(args.id, gateway=args.gateway, shutdown_timeout=0.5)


def seen(ctx: ReachContext) -> dict[str, Any]:
    return {"trace_id": ctx.trace_id, "traceparent": ctx.traceparent, "attempt": ctx.attempt}


@agent.handle("trace.echo")
async def echo(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    return seen(ctx)


@agent.handle("trace.relay")
async def relay(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    reply = await ctx.reach("trace.echo", {})
    return {"mine": seen(ctx), "onward": reply.result, "onward_trace_id": reply.trace_id}


@agent.handle("trace.relay_sync")
def relay_sync(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    reply = ctx.reach_sync("trace.echo", {})
    return {"mine": seen(ctx), "onward": reply.result, "onward_trace_id": reply.trace_id}


agent.run()
