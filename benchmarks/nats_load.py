"""The NATS load generator of ``run.py nats``: requests to a subject, N always in flight.

    python benchmarks/nats_load.py --nats nats://127.0.0.1:4222 --subject agent-reach.v1.heartbeat \
        --body '{"endpoint_id": "agent://x"}' --concurrency 32 --duration 5

It connects (nats-py, on uvloop when installed), subscribes one reply inbox and prints
``READY``; on a line ``go`` on stdin it keeps ``--concurrency`` requests in flight for
``--duration`` s (a reply to a slot fires that slot's next request: no futures, no task per
request, so the generator costs as little as a Python client can), then prints one line
``RESULT {json}``: requests, errors (non200, badbody, timeout), good answers/s, latency p50 /
p99 / mean in µs. The runner starts it first and says ``go`` when its CPU accounting starts, so
that the window covers the requests only.

Invariants:
- An answer is good only with no ``Reach-Status`` (200) and ``"ok":true`` in the body, as
  ``wrk_post.lua`` counts HTTP answers; nats-py's ``Status: 503`` (no responders) is an error.
- Bounded: the run stops at ``--duration`` (and past ``MAX_REQUESTS``); a request unanswered for
  ``REQUEST_TIMEOUT_S`` is an error and its slot goes on; a reply after the window, or to a
  request already counted as a timeout, is not counted; waiting for ``go`` is bounded too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import nats
from nats.aio.msg import Msg

REQUEST_TIMEOUT_S = 10.0  # as wrk's --timeout
MAX_REQUESTS = 5_000_000  # per run, whatever its duration
GO_TIMEOUT_S = 60.0


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    """``args.concurrency`` requests always in flight to ``args.subject`` for ``args.duration``
    s after "go" on stdin: one reply inbox, a reply to a slot fires that slot's next request."""
    loop = asyncio.get_running_loop()
    nc = await nats.connect(args.nats, connect_timeout=2, allow_reconnect=False, name="bench-load")
    inbox = nc.new_inbox() + "."
    body = args.body.encode()
    n = args.concurrency
    seq, sent = [0] * n, [0.0] * n
    lat: list[float] = []
    c = {"requests": 0, "non200": 0, "badbody": 0, "timeout": 0}
    now = time.perf_counter
    stop_at = float("inf")

    async def fire(slot: int) -> None:
        seq[slot] += 1
        sent[slot] = now()
        await nc.publish(args.subject, body, reply=f"{inbox}{slot}.{seq[slot]}")

    async def on_reply(msg: Msg) -> None:
        t = now()
        slot_s, _, seq_s = msg.subject[len(inbox) :].partition(".")
        slot = int(slot_s)
        if t >= stop_at or int(seq_s) != seq[slot] or not sent[slot]:
            return  # after the window, or a late reply to a request already counted a timeout
        c["requests"] += 1
        headers = msg.headers or {}
        if "Reach-Status" in headers or "Status" in headers:  # Status 503: no responders
            c["non200"] += 1
        elif b'"ok":true' not in msg.data:
            c["badbody"] += 1
        else:
            lat.append(t - sent[slot])
        sent[slot] = 0.0
        if c["requests"] < MAX_REQUESTS:
            await fire(slot)

    await nc.subscribe(inbox + ">", cb=on_reply)
    await nc.flush()
    print("READY", flush=True)
    async with asyncio.timeout(GO_TIMEOUT_S):
        go = await loop.run_in_executor(None, sys.stdin.readline)
    if go.strip() != "go":
        raise SystemExit("no go")
    t0 = now()
    stop_at = t0 + args.duration
    for slot in range(n):
        await fire(slot)
    while (t := now()) < stop_at:  # the watchdog: a request unanswered too long is a timeout
        await asyncio.sleep(min(0.1, stop_at - t))
        for slot in range(n):
            if sent[slot] and now() - sent[slot] > REQUEST_TIMEOUT_S and now() < stop_at:
                c["timeout"] += 1
                c["requests"] += 1
                await fire(slot)
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e6 if lat else 0.0

    duration_us = (stop_at - t0) * 1e6
    errors = c["non200"] + c["badbody"] + c["timeout"]
    out = {**c, "errors": errors, "duration_us": round(duration_us)}
    out["rps"] = round(max(0, c["requests"] - errors) / (duration_us / 1e6), 1)
    out |= {"p50_us": round(pct(0.5)), "p99_us": round(pct(0.99))}
    out["mean_us"] = round(statistics.fmean(lat) * 1e6, 1) if lat else 0.0
    await nc.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nats", required=True, metavar="URL", help="nats://HOST:PORT")
    p.add_argument("--subject", required=True)
    p.add_argument("--body", required=True, help="the request body (JSON)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    p.add_argument("--duration", type=float, required=True, metavar="S")
    args = p.parse_args()
    if not 1 <= args.concurrency <= 4096 or not 0 < args.duration <= 600:
        p.error("--concurrency within 1-4096, --duration within 0-600 s")
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(_load(args))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(_load(args))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
