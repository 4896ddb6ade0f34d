"""A test agent that reaches another agent through the gateway from its handlers.

``relay.async`` awaits ``ctx.reach``, ``relay.sync`` (a sync handler, on a worker thread) calls
``ctx.reach_sync``; both forward ``payload["payload"]`` to ``payload["intent"]`` with the options
in ``payload["options"]`` and answer what came back, or the onward error's code.
"""

from __future__ import annotations

import argparse
from typing import Any

from agent_reach.errors import ReachError
from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext, Reply

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", default="agent://relay-01")
args = parser.parse_args()

logs.configure("INFO")
agent = Agent(args.id, gateway=args.gateway, shutdown_timeout=0.5)


def _answer(reply: Reply, ctx: ReachContext) -> dict[str, Any]:
    return {
        "result": reply.result,
        "endpoint_id": reply.endpoint_id,
        "trace_id": reply.trace_id,
        "my_deadline_ms": ctx.deadline_ms,
    }


def _failed(exc: ReachError) -> dict[str, Any]:
    return {"error": exc.code, "trace_id": exc.trace_id, "attempts": exc.attempts}


@agent.handle("relay.async")
async def relay_async(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    try:
        reply = await ctx.reach(payload["intent"], payload["payload"], **payload["options"])
    except ReachError as exc:
        return _failed(exc)
    return _answer(reply, ctx)


@agent.handle("relay.sync")
def relay_sync(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    try:
        reply = ctx.reach_sync(payload["intent"], payload["payload"], **payload["options"])
    except ReachError as exc:
        return _failed(exc)
    return _answer(reply, ctx)


agent.run()
