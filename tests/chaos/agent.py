"""A chaos agent: a bare aiohttp server (no SDK) whose behaviour the test changes while it runs,
with a heartbeat loop of its own that can lose beats and jitter them.

It registers with ``--gateway`` and then heartbeats at the SDK's cadence (every 0.6-0.8 x the
interval the gateway answered). ``--beat-drop P`` loses each beat with probability P, silently:
the beat is never sent and the agent does not know (no retry), the worst case for the gateway's
thresholds. With ``--beat-retry`` a lost beat is a failed one, as a lost HTTP or NATS request is
to its sender: the agent tries again as the SDK does (after a jittered backoff from 0.25 s,
doubling, each try lost with the same P), and beats on at its cadence from the one that went.
``--beat-jitter S`` delays each sent beat by 0-2S seconds (S +- S around its mean), on a task of
its own, so that the schedule itself does not drift. A beat answered 404 registers again.
``--seed`` makes the drops reproducible.

Deliveries (``POST /reach``) are answered after ``delay_ms`` with ``{"agent": ID}`` (drawn from
``delay_ms`` x (1 +- ``delay_spread``), uniformly, when that is set); every ``slow_every``-th
delivery of an intent after ``slow_ms`` instead (a deterministic tail: exactly one in
``slow_every``); with probability ``error_rate`` at once with ``error_status`` (503 by default)
instead; with ``hang`` never (until the gateway gives up on the connection). ``POST /control``
with a JSON object changes any of ``delay_ms``, ``delay_spread``, ``slow_every``, ``slow_ms``,
``error_rate``, ``error_status``, ``hang``, ``beat_drop``. ``GET /stats`` answers what it saw:
deliveries received (also by intent, ``received:TAG``) and answered by status, in flight now and
at most, and the retries (``X-Reach-Attempt`` >= 2) with the ``X-Reach-Deadline-Ms`` they
carried. ``POST /stats/reset`` zeroes the counts.

It prints ``agent://ID serving at URL`` once registered (what tests/support.py waits for)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--intents", default="test.echo")
parser.add_argument("--delay-ms", type=float, default=0.0)
parser.add_argument("--delay-spread", type=float, default=0.0)
parser.add_argument("--slow-every", type=int, default=0)
parser.add_argument("--slow-ms", type=float, default=0.0)
parser.add_argument("--error-rate", type=float, default=0.0)
parser.add_argument("--error-status", type=int, default=503)
parser.add_argument("--hang", action="store_true")
parser.add_argument("--beat-drop", type=float, default=0.0)
parser.add_argument("--beat-jitter", type=float, default=0.0)
parser.add_argument("--beat-retry", action="store_true")
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--no-beat", action="store_true")
args = parser.parse_args()

state: dict[str, Any] = {
    "delay_ms": args.delay_ms,
    "delay_spread": args.delay_spread,
    "slow_every": args.slow_every,
    "slow_ms": args.slow_ms,
    "error_rate": args.error_rate,
    "error_status": args.error_status,
    "hang": args.hang,
    "beat_drop": args.beat_drop,
}
counts: Counter[str] = Counter()
inflight = {"now": 0, "max": 0}
retries: list[tuple[int, int]] = []  # (attempt, deadline_ms) of deliveries with attempt >= 2
beats: list[tuple[float, str]] = []  # (unix time, sent|dropped) of the last beats
rng = random.Random(args.seed)


def log(event: str, **data: Any) -> None:
    print(json.dumps({"ts": time.time(), "event": event, **data}), file=sys.stderr, flush=True)


async def reach(request: web.Request) -> web.Response:
    intent = str(json.loads(await request.read()).get("intent"))
    counts["received"] += 1
    counts[f"received:{intent}"] += 1
    nth = counts[f"received:{intent}"]
    inflight["now"] += 1
    inflight["max"] = max(inflight["max"], inflight["now"])
    attempt = int(request.headers.get("X-Reach-Attempt", "1"))
    if attempt >= 2 and len(retries) < 100_000:
        retries.append((attempt, int(request.headers.get("X-Reach-Deadline-Ms", "-1"))))
    try:
        if state["hang"]:
            await asyncio.sleep(3600)
        if state["error_rate"] > 0 and rng.random() < state["error_rate"]:
            counts[str(state["error_status"])] += 1
            return web.json_response({"error": "told to fail"}, status=state["error_status"])
        delay_ms = state["delay_ms"] * (1 + state["delay_spread"] * rng.uniform(-1, 1))
        if state["slow_every"] and nth % state["slow_every"] == 0:
            delay_ms = state["slow_ms"]
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        counts["200"] += 1
        return web.json_response({"agent": args.id})
    finally:
        inflight["now"] -= 1


async def control(request: web.Request) -> web.Response:
    change = await request.json()
    unknown = set(change) - set(state)
    if unknown:
        return web.json_response({"unknown": sorted(unknown)}, status=422)
    state.update(change)
    log("agent.control", **change)
    return web.json_response(state)


async def stats(_: web.Request) -> web.Response:
    return web.json_response(
        {
            **counts,
            "inflight": inflight["now"],
            "max_inflight": inflight["max"],
            "retries": retries,
            "beats": beats[-2000:],
        }
    )


async def reset(_: web.Request) -> web.Response:
    counts.clear()
    retries.clear()
    inflight["max"] = inflight["now"]
    return web.json_response({"ok": True})


async def register(session: ClientSession, url: str) -> float:
    body = {"endpoint_id": args.id, "capabilities": args.intents.split(","), "endpoint_url": url}
    for attempt in range(200):
        try:
            async with session.post(f"{args.gateway}/v1/register", json=body) as resp:
                answer = await resp.json()
                if resp.status == 200:
                    return float(answer["heartbeat_interval_s"])
                log("agent.register_refused", status=resp.status, answer=answer)
        except (ClientError, TimeoutError) as exc:
            log("agent.register_failed", error=repr(exc), attempt=attempt)
        await asyncio.sleep(0.25)
    raise SystemExit(f"{args.id}: could not register")


async def beat(session: ClientSession, url: str, delay: float) -> None:
    """One heartbeat after ``delay`` (the network's jitter); 404: register again."""
    await asyncio.sleep(delay)
    try:
        body = {"endpoint_id": args.id}
        async with session.post(f"{args.gateway}/v1/heartbeat", json=body) as resp:
            await resp.read()
            if resp.status == 404:
                log("agent.reregistering")
                await register(session, url)
            elif resp.status != 200:
                log("agent.heartbeat_refused", status=resp.status)
    except (ClientError, TimeoutError) as exc:
        log("agent.heartbeat_failed", error=repr(exc))


async def lifeline(session: ClientSession, url: str, interval: float) -> None:
    pending: set[asyncio.Task[None]] = set()
    while True:
        await asyncio.sleep(rng.uniform(0.6, 0.8) * interval)
        backoff = 0.25
        while rng.random() < state["beat_drop"]:
            beats.append((time.time(), "dropped"))
            if not args.beat_retry:
                break  # silent: lost, and the agent never knows
            # a failed beat, seen: tried again after the SDK's jittered backoff
            await asyncio.sleep(backoff * rng.uniform(0.5, 1.0))
            backoff = min(2 * backoff, interval)
        else:  # this beat goes (each ends its own task: the cadence does not wait for it)
            beats.append((time.time(), "sent"))
            task = asyncio.create_task(beat(session, url, rng.uniform(0, 2 * args.beat_jitter)))
            pending.add(task)
            task.add_done_callback(pending.discard)
        del beats[:-5000]


async def main() -> None:
    app = web.Application()
    app.router.add_post("/reach", reach)
    app.router.add_post("/control", control)
    app.router.add_get("/stats", stats)
    app.router.add_post("/stats/reset", reset)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/reach"
    async with ClientSession(timeout=ClientTimeout(total=5)) as session:
        interval = await register(session, url)
        print(f"{args.id} serving at {url}", flush=True)
        if args.no_beat:
            await asyncio.Event().wait()
        await lifeline(session, url, interval)


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())
