"""A test agent for the agent SDK's own tests: every behaviour on its own intent.

Side effects are counted per ``payload["key"]`` so that tests can tell how often a handler
really ran. ``sdk.hold`` blocks a worker thread until ``sdk.release`` (async, so it runs even
when every worker is held) opens its gate; ``sdk.block_loop`` blocks the event loop itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext, Reject

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--workers", type=int, default=4)
parser.add_argument("--max-inflight", type=int, default=None)
args = parser.parse_args()

logs.configure("INFO")
agent = Agent(
    args.id,
    gateway=args.gateway,
    workers=args.workers,
    shutdown_timeout=0.5,
    max_inflight=args.max_inflight,
)
runs: Counter[str] = Counter()
lock = threading.Lock()
gates: dict[str, threading.Event] = {}


def count(payload: Any) -> int:
    with lock:
        runs[payload["key"]] += 1
        return runs[payload["key"]]


def gate(key: str) -> threading.Event:
    with lock:
        return gates.setdefault(key, threading.Event())


def seen(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "payload": payload,
        "msg_id": ctx.msg_id,
        "trace_id": ctx.trace_id,
        "sender": ctx.sender,
        "intent": ctx.intent,
        "priority": ctx.priority,
        "attempt": ctx.attempt,
        "deadline_ms": ctx.deadline_ms,
        "remaining_ms": ctx.remaining_ms(),
        "endpoint_id": ctx.endpoint_id,
    }


@agent.handle("sdk.echo")
def echo(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    logs.log(logging.INFO, "sdk.echo.work", where="worker thread")
    return seen(payload, ctx)


@agent.handle("sdk.aecho")
async def aecho(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    return seen(payload, ctx)


@agent.handle("sdk.count")
def counted(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    return {"run": count(payload), "msg_id": ctx.msg_id, "nonce": os.urandom(8).hex()}


@agent.handle("sdk.runs")
async def how_often(payload: Any, ctx: ReachContext) -> dict[str, int]:
    with lock:
        return dict(runs)


@agent.handle("sdk.hold")
def hold(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    n = count(payload)
    logs.log(logging.INFO, "sdk.hold.entered", key=payload["key"], run=n)
    released = gate(payload["key"]).wait(payload.get("hold_s", 60))
    return {"run": n, "released": released, "attempt": ctx.attempt}


@agent.handle("sdk.release")
async def release(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    for key in payload["keys"]:
        gate(key).set()
    return {"released": payload["keys"]}


@agent.handle("sdk.block-loop")
async def block_loop(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    logs.log(logging.INFO, "sdk.block_loop.entered")
    t0 = time.monotonic()
    time.sleep(payload["seconds"])  # noqa: ASYNC251 - the mistake under test: a blocked loop
    return {"slept_s": time.monotonic() - t0}


@agent.handle("sdk.crash")
def crash(payload: Any, ctx: ReachContext) -> None:
    count(payload)
    raise RuntimeError("told to crash")


@agent.handle("sdk.reject")
async def reject(payload: Any, ctx: ReachContext) -> None:
    count(payload)
    await asyncio.sleep(0)
    raise Reject("no such city", status=422, code="unknown_city")


agent.run()
