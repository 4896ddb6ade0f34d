"""A test agent process with a chosen behaviour, built on the agent SDK.

Modes: ok (echo what it was given), fail (answer 500), hang (never answer), slow (answer after
--delay-ms), reject (answer 422), big (answer 2 MiB). Every answer says which agent and process
answered and what trace headers it saw; every request is logged as JSON with its trace id.

``--serve nats://HOST:PORT`` serves over NATS instead of HTTP (default: ``$AGENT_REACH_SERVE``,
else HTTP, as the SDK decides), on ``--subject`` when given, with ``--max-inflight``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext, Reject

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--intents", default="test.echo")
parser.add_argument("--mode", choices=["ok", "fail", "hang", "slow", "reject", "big"], default="ok")
parser.add_argument("--delay-ms", type=float, default=0.0)
parser.add_argument("--serve", default=None)
parser.add_argument("--subject", default=None)
parser.add_argument("--max-inflight", type=int, default=None)
args = parser.parse_args()

logs.configure("INFO")
agent = Agent(
    args.id,
    gateway=args.gateway,
    shutdown_timeout=0.5,
    serve=args.serve,
    subject=args.subject,
    max_inflight=args.max_inflight,
)


async def handle(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    if args.mode == "fail":
        raise RuntimeError("told to fail")
    if args.mode == "reject":
        raise Reject("told to reject", status=422)
    if args.mode == "hang":
        await asyncio.sleep(3600)
    if args.mode == "big":
        return {"blob": "x" * (2 << 20)}  # 2 MiB: over the gateway's default answer limit
    if args.mode == "slow":
        await asyncio.sleep(args.delay_ms / 1000)
    return {
        "agent": args.id,
        "pid": os.getpid(),
        "payload": payload,
        "trace_id": ctx.trace_id,
        "traceparent": ctx.traceparent,
        "msg_id": ctx.msg_id,
        "attempt": ctx.attempt,
        "deadline_ms": ctx.deadline_ms,
        "sender": ctx.sender,
        "verified": ctx.verified,
        "intent": ctx.intent,
        "requested_intent": ctx.requested_intent,
        "intent_text": ctx.intent_text,
        "match": None if ctx.match is None else [ctx.match.method, ctx.match.confidence],
        "origin": ctx.origin,
    }


for intent in args.intents.split(","):
    agent.handle(intent)(handle)

agent.run()
