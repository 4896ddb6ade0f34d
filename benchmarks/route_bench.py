"""Route decision benchmark, in process: Agent-Reach's plan + choose vs the seed's scan and sort.

100,000 endpoints over 1,000 intents, each endpoint declaring 2 or 3 of them (about 250
candidates an intent). Registered through the real service path: each body is decoded from JSON
into ``RegisterBody`` (as the HTTP edge does) and passed to ``await Router.register``.

Measured (each "run" is one batch; the caller takes medians over runs):

- ``warm``: ``settle(intent)`` + ``plan`` + ``choose`` (the exact path) on random intents, timed
  one call at a time with ``time.perf_counter_ns`` (the timer pair itself costs ``timer_ns``).
  Heartbeat interval 3600 s, so no status changes by time during the benchmark: the steady
  state of fresh endpoints, the per-intent tier cache warm.
- ``cold``: the same after dropping the intent's tier cache (what the first request of an intent,
  or the first after a membership change, pays).
- ``live_sdk`` / ``live_on_time``: the same while the registry is live, on a fake clock: 10 s
  heartbeat interval, every endpoint beating every U(6, 8) s (the project's agent SDK) or every
  10 s exactly (the contract's nominal rate), interleaved with 2,500 route decisions/s over
  12 s / 2 s of simulated time per run;
  ``slow_share`` is the share of decisions over 50 µs (tiers rebuilt or many members re-placed).
- ``seed``: the seed gateway's per-request scan of a dict of 100k agents, filter by intent and
  freshness, sort by latency, take the first.
- memory: tracemalloc's traced bytes after registering 100k endpoints / 100k (the gateway's
  records, index and per-intent state; request bodies freed), then with every tier cache warm.

Prints one JSON object. Usage: ``python benchmarks/route_bench.py --runs 3``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import heapq
import io
import json
import pstats
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any

from agent_reach.clock import SystemClock
from agent_reach.gateway.router import Router
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody, decode

N_INTENTS = 1_000


def make_intents() -> list[str]:
    return [f"svc{i // 10:03d}.op{i % 10}" for i in range(N_INTENTS)]


def register_bodies(n: int, intents: list[str], rng: random.Random) -> list[bytes]:
    """JSON bodies of ``POST /v1/register`` for ``n`` endpoints, 2 or 3 intents each."""
    out = []
    for i in range(n):
        caps = rng.sample(intents, rng.choice((2, 3)))
        out.append(
            json.dumps(
                {
                    "endpoint_id": f"agent://ep-{i:06d}",
                    "capabilities": caps,
                    "endpoint_url": f"http://127.0.0.1:{20000 + i % 40000}/reach",
                    "description": "",
                }
            ).encode()
        )
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def pct(samples: list[int], q: float) -> float:
    s = sorted(samples)
    return float(s[min(len(s) - 1, int(q * len(s)))])


async def build_gateway(
    bodies: list[bytes], settings: GatewaySettings, clock: Any, spread_s: float = 0.0
) -> Router:
    gw = Router(settings, MemoryRegistry(), clock, rng=random.Random(7))
    step = spread_s / len(bodies) if spread_s else 0.0
    for raw in bodies:
        await gw.register(decode(raw, RegisterBody))
        if step:
            clock.advance(step)
    return gw


def decide(gw: Router, intent: str) -> str | None:
    """One route decision on the exact path, as a send makes it: settle (the exact tag, no
    await), plan, choose."""
    match = gw.settle(intent, None)
    if match is None:  # pragma: no cover - every intent of the benchmark is declared
        raise RuntimeError(f"{intent!r} is not declared")
    return gw.choose(gw.plan(match, None))


def time_calls(gw: Router, seq: list[str]) -> list[int]:
    now_ns = time.perf_counter_ns
    out = []
    append = out.append
    for intent in seq:
        t0 = now_ns()
        decide(gw, intent)
        append(now_ns() - t0)
    return out


def seed_scan(agents: dict[str, dict[str, Any]], intent: str) -> dict[str, Any]:
    """The seed gateway's route decision, verbatim in shape (see seed_gateway.send)."""
    now = time.time()
    candidates = [
        a for a in agents.values() if intent in a["capabilities"] and now - a["last_seen"] < 30
    ]
    candidates.sort(key=lambda a: a["latency"])
    return candidates[0]


def profile_text(prof: cProfile.Profile, top: int = 12) -> str:
    """The top functions of ``prof`` by own time, paths shortened."""
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    return text[text.find("   ncalls") :].rstrip() if "   ncalls" in text else text.strip()


LIVE_INTERVAL_S = 10.0
LIVE_ROUTES_PER_S = 2500.0
SLOW_NS = 50_000  # a decision slower than this did cache upkeep (rebuild or re-placing)


async def live_registry(
    args: argparse.Namespace, intents: list[str], lo: float, hi: float, seconds: float
) -> dict[str, Any]:
    """Route decisions while every endpoint heartbeats every U(lo, hi) x 10 s, on a fake clock.

    ``lo, hi = 0.6, 0.8`` is the schedule of the project's agent SDK (a little early, jittered);
    ``1.0, 1.0`` is an agent beating exactly on the interval, the contract's nominal rate. One
    period runs untimed first (the registrations' burst of first heartbeats passes), then each
    run times every decision of ``seconds`` simulated seconds.
    """
    rng = random.Random(43)
    bodies = register_bodies(args.endpoints, intents, rng)
    clock = FakeClock()
    span = LIVE_INTERVAL_S * hi  # registrations spread over one period, so ages are spread
    gw = await build_gateway(
        bodies, GatewaySettings(heartbeat_interval=LIVE_INTERVAL_S), clock, spread_s=span
    )
    del bodies
    start = clock.now - span
    due = [
        (start + span * i / args.endpoints + LIVE_INTERVAL_S * rng.uniform(lo, hi), i)
        for i in range(args.endpoints)
    ]
    heapq.heapify(due)
    ids = [f"agent://ep-{i:06d}" for i in range(args.endpoints)]
    dt = 1.0 / LIVE_ROUTES_PER_S
    beats = 0

    async def step(intent: str) -> int:
        nonlocal beats
        clock.advance(dt)
        while due[0][0] <= clock.now:  # the heartbeats that arrived in this slice
            _, i = heapq.heappop(due)
            gw.heartbeat(ids[i])
            beats += 1
            heapq.heappush(due, (clock.now + LIVE_INTERVAL_S * rng.uniform(lo, hi), i))
        return time_calls(gw, [intent])[0]

    for intent in rng.choices(intents, k=int(span * LIVE_ROUTES_PER_S)):  # one period, untimed
        await step(intent)
    beats = 0
    t0 = clock.now
    runs = []
    for _ in range(args.runs):
        samples = [await step(i) for i in rng.choices(intents, k=int(seconds * LIVE_ROUTES_PER_S))]
        runs.append(
            {
                "p50_ns": pct(samples, 0.5),
                "p99_ns": pct(samples, 0.99),
                "mean_ns": round(statistics.fmean(samples), 1),
                "slow_share": round(sum(x > SLOW_NS for x in samples) / len(samples), 3),
            }
        )
    result: dict[str, Any] = {"runs": runs, "heartbeats_per_s": beats / (clock.now - t0)}
    if args.profile == "always":  # one more simulated second, heartbeats included
        prof = cProfile.Profile()
        prof.enable()
        for intent in rng.choices(intents, k=int(LIVE_ROUTES_PER_S)):
            await step(intent)
        prof.disable()
        result["profile"] = profile_text(prof)
    return result


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(42)
    intents = make_intents()
    bodies = register_bodies(args.endpoints, intents, rng)
    out: dict[str, Any] = {"endpoints": args.endpoints, "intents": N_INTENTS}

    # --- Agent-Reach: register under tracemalloc for memory, then time -------------------
    settings = GatewaySettings(heartbeat_interval=3600.0)
    gc.collect()
    rss0 = rss_bytes()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    gw = await build_gateway(bodies, settings, SystemClock())
    out["register_s"] = round(time.perf_counter() - t0, 3)
    gc.collect()
    mem_registered = tracemalloc.get_traced_memory()[0] - base
    for intent in intents:  # warm every tier cache
        decide(gw, intent)
    gc.collect()
    mem_warm = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    out["rss_delta_per_endpoint_b"] = round((rss_bytes() - rss0) / args.endpoints, 1)
    out["mem_per_endpoint_b"] = round(mem_registered / args.endpoints, 1)
    out["mem_per_endpoint_warm_b"] = round(mem_warm / args.endpoints, 1)
    out["candidates_per_intent"] = round(
        statistics.mean(len(gw.registry.by_intent(i)) for i in intents), 1
    )

    # --- the seed's dict of agents ------------------------------------------------------
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    agents: dict[str, dict[str, Any]] = {}
    now = time.time()
    for raw in bodies:
        body = json.loads(raw)
        agents[body["endpoint_id"]] = {**body, "last_seen": now, "latency": rng.random() * 50}
    gc.collect()
    out["seed_mem_per_endpoint_b"] = round(
        (tracemalloc.get_traced_memory()[0] - base) / args.endpoints, 1
    )
    tracemalloc.stop()
    del bodies

    now_ns = time.perf_counter_ns
    empty = []
    for _ in range(10_000):
        t = now_ns()
        empty.append(now_ns() - t)
    out["timer_ns"] = statistics.median(empty)

    runs: list[dict[str, Any]] = []
    gc.disable()  # no collector pauses inside the timed loops (nothing cyclic is made there)
    try:
        for r in range(args.runs):
            seq = rng.choices(intents, k=args.calls)
            warm = time_calls(gw, seq)
            cold: list[int] = []
            tiers = getattr(gw, "_tiers", None)  # private: the per-intent cache, dropped here
            if isinstance(tiers, dict):
                for intent in rng.choices(intents, k=args.cold_calls):
                    tiers.pop(intent, None)
                    cold.extend(time_calls(gw, [intent]))
            seed_ns = []
            for intent in rng.choices(intents, k=args.seed_calls):
                t = now_ns()
                seed_scan(agents, intent)
                seed_ns.append(now_ns() - t)
            runs.append(
                {
                    "run": r + 1,
                    "warm_p50_ns": pct(warm, 0.5),
                    "warm_p99_ns": pct(warm, 0.99),
                    "warm_mean_ns": round(statistics.fmean(warm), 1),
                    "cold_p50_ns": pct(cold, 0.5) if cold else None,
                    "seed_p50_ns": pct(seed_ns, 0.5),
                    "seed_p99_ns": pct(seed_ns, 0.99),
                }
            )
    finally:
        gc.enable()
    warm_p50_us = statistics.median(r["warm_p50_ns"] for r in runs) / 1000
    if args.profile == "always" or (args.profile == "auto" and warm_p50_us >= args.target_us):
        prof = cProfile.Profile()
        prof.runcall(time_calls, gw, rng.choices(intents, k=20_000))
        out["profile_warm"] = profile_text(prof)
    del agents, gw
    gc.collect()

    # --- live registry: heartbeats flowing, on a fake clock ----------------------------------
    if args.live_scale:
        out["live"] = {"heartbeat_interval_s": LIVE_INTERVAL_S, "routes_per_s": LIVE_ROUTES_PER_S}
        for name, lo, hi, seconds in (("sdk", 0.6, 0.8, 12.0), ("on_time", 1.0, 1.0, 2.0)):
            live = await live_registry(args, intents, lo, hi, seconds * args.live_scale)
            if "profile" in live:
                out[f"profile_live_{name}"] = live.pop("profile")
            out["live"][f"{name}_heartbeats_per_s"] = round(live.pop("heartbeats_per_s"))
            for r, figures in enumerate(live["runs"]):
                runs[r].update({f"live_{name}_{k}": v for k, v in figures.items()})
    out["runs"] = runs
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--endpoints", type=int, default=100_000)
    p.add_argument("--calls", type=int, default=100_000, help="timed warm calls per run")
    p.add_argument("--cold-calls", type=int, default=200, help="timed cache-miss calls per run")
    p.add_argument("--seed-calls", type=int, default=30, help="timed seed scans per run")
    p.add_argument(
        "--live-scale",
        type=float,
        default=1.0,
        help="scale of the live-registry runs (1: 12 s and 2 s simulated per run; 0: skip)",
    )
    p.add_argument(
        "--profile",
        choices=["auto", "always", "never"],
        default="auto",
        help="cProfile of the decision: when the warm p50 misses --target-us (auto), "
        "always (also the live registry), or never",
    )
    p.add_argument("--target-us", type=float, default=10.0)
    args = p.parse_args()
    result = asyncio.run(bench(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
