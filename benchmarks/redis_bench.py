"""Shared registry (Redis) benchmarks, run by ``run.py redis`` on a private redis-server.

Three measures (run.py turns them into rows of the report):

- ``decision`` (in process, this file run as a child, pinned like ``route``): the route
  decision (``Router.plan`` + ``Router.choose``, one call at a time with ``perf_counter_ns``)
  on a gateway whose view was LOADED FROM REDIS at start (10,000 endpoints registered through
  another gateway, 100 intents, 2-3 intents each: ~250 candidates an intent, as in ``route``)
  vs the same registrations on a ``MemoryRegistry``. Both also "live": decisions while every
  endpoint heartbeats every ~7 s (through the other gateway and Redis for the Redis view,
  directly for the memory one), 25 decisions then a 10 ms pause so that the loops run between.
  Also: how long the second gateway took to load the 10k records at start.
- ``workers``: good answers/s of ``POST /v1/send`` through ``serve --workers 2`` and
  ``--workers 1`` on Redis to the trivial agent (wrk, 32 connections), and through one gateway
  on the in-memory registry under the same conditions (a reference: the registry does no work
  per send), measured in rotating order; nothing pinned (the point is to use both cores), CPU
  of all the workers per request.
- ``propagation``: two gateway processes A and B on Redis; per trial, from just before the
  request to A until B's answer shows the change (B polled over one keep-alive connection, a
  poll every ~0.3 ms): a registration (seen on B), a heartbeat that turns a degraded endpoint
  healthy on B (each started at a random phase of B's sync loop), a deregistration (gone from
  B). Median, p99 and max over ``--trials``.
- ``churn`` (in process, not part of ``run.py``): ids registered and deregistered, and ids
  never registered deregistered; what Redis and the views hold afterwards (should be nothing
  but the fixed keys) and how long a full reconcile then takes.

    python benchmarks/redis_bench.py decision --redis redis://127.0.0.1:6390/0   # JSON
    python benchmarks/redis_bench.py churn --ids 50000 --unknown 10000          # JSON
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
from agent_reach.clock import SystemClock
from agent_reach.gateway.router import Router
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.registry.redis import STALENESS_BOUND_S, RedisRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.wire.bodies import RegisterBody, decode
from route_bench import decide

HERE = Path(__file__).resolve().parent
PY = sys.executable
N_INTENTS = 100
LIVE_INTERVAL_S = 7.0  # each endpoint beats this often in the live runs (SDK: 0.6-0.8 x 10 s)
LIVE_S = 4.0
INTENT = "bench.echo"
AGENT_ID = "agent://bench-agent"
SEND_BODY = json.dumps({"intent": INTENT, "payload": {"city": "Chengdu", "n": 1}})


# --- a private redis-server ---------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(url: str | None = None) -> Iterator[tuple[str, int | None]]:
    """``url`` as given, or a private redis-server on a free port (no persistence): (URL, pid)."""
    if url:
        yield url, None
        return
    if not shutil.which("redis-server"):
        raise RuntimeError("redis-server is not installed: install it, or pass --redis URL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="agent-reach-bench-redis-")
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "no", "--dir", workdir, "--daemonize", "no"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), 1) as c,
            ):
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)  # polling interval, not a settle delay
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- decision (in process) ----------------------------------------------------------------------


def bodies(n: int, rng: random.Random) -> list[bytes]:
    intents = [f"svc{i // 10:02d}.op{i % 10}" for i in range(N_INTENTS)]
    return [
        json.dumps(
            {
                "endpoint_id": f"agent://ep-{i:06d}",
                "capabilities": rng.sample(intents, rng.choice((2, 3))),
                "endpoint_url": f"http://127.0.0.1:{20000 + i % 40000}/reach",
            }
        ).encode()
        for i in range(n)
    ]


def progress(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def pct(samples: list[int], q: float) -> float:
    s = sorted(samples)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def figures(samples: list[int]) -> dict[str, float]:
    return {
        "p50_ns": pct(samples, 0.5),
        "p99_ns": pct(samples, 0.99),
        "mean_ns": round(statistics.fmean(samples), 1),
    }


def time_calls(gw: Router, seq: list[str]) -> list[int]:
    now_ns = time.perf_counter_ns
    out = []
    for intent in seq:
        t0 = now_ns()
        decide(gw, intent)
        out.append(now_ns() - t0)
    return out


async def live(gw: Router, beat: Router, ids: list[str], intents: list[str]) -> list[int]:
    """Decisions on ``gw`` (25, then a 10 ms pause) while every id beats through ``beat``."""
    stop = asyncio.Event()
    per_tick = max(1, round(len(ids) / LIVE_INTERVAL_S / 100))  # beats every 10 ms

    async def beats() -> None:
        i = 0
        while not stop.is_set():
            for _ in range(per_tick):
                beat.heartbeat(ids[i % len(ids)])
                i += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(beats())
    rng = random.Random(5)
    samples: list[int] = []
    end = time.monotonic() + LIVE_S
    try:
        while time.monotonic() < end:
            samples += time_calls(gw, rng.choices(intents, k=25))
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await task
    return samples


async def decision(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(42)
    raw = bodies(args.endpoints, rng)
    settings = GatewaySettings(heartbeat_interval=3600.0)
    prefix = f"bench-{os.urandom(4).hex()}"
    out: dict[str, Any] = {"endpoints": args.endpoints, "intents": N_INTENTS, "runs": []}

    memory = Router(settings, MemoryRegistry(), SystemClock(), rng=random.Random(7))
    for body in raw:
        await memory.register(decode(body, RegisterBody))

    writer_reg = RedisRegistry(args.redis, prefix=prefix)
    writer = Router(settings, writer_reg, SystemClock(), rng=random.Random(7))
    await writer_reg.start()
    t0 = time.perf_counter()
    for body in raw:
        await writer.register(decode(body, RegisterBody))
    out["register_s"] = round(time.perf_counter() - t0, 2)
    progress(f"{args.endpoints} registered through Redis in {out['register_s']} s")
    reader_reg = RedisRegistry(args.redis, prefix=prefix)
    reader = Router(settings, reader_reg, SystemClock(), rng=random.Random(7))
    t0 = time.perf_counter()
    await reader_reg.start()  # loads the whole registry from Redis
    out["load_s"] = round(time.perf_counter() - t0, 3)
    progress(f"loaded by a second gateway in {out['load_s']} s")
    try:
        assert len(reader_reg) == args.endpoints, len(reader_reg)
        intents = sorted(memory.registry.intents())
        out["candidates_per_intent"] = round(
            statistics.mean(len(reader_reg.by_intent(i)) for i in intents), 1
        )
        for gw in (memory, reader):  # every tier cache warm
            for intent in intents:
                decide(gw, intent)
        for r in range(args.runs):
            seq = rng.choices(intents, k=args.calls)
            gc.disable()
            try:
                m, d = time_calls(memory, seq), time_calls(reader, seq)
            finally:
                gc.enable()
            out["runs"].append(
                {"run": r + 1, **{f"memory_{k}": v for k, v in figures(m).items()}}
                | {f"redis_{k}": v for k, v in figures(d).items()}
            )
            await asyncio.sleep(0)  # the registry loops run between runs
        if args.live:
            ids = [f"agent://ep-{i:06d}" for i in range(args.endpoints)]
            settings_live = GatewaySettings(heartbeat_interval=10.0)
            memory.settings = settings_live
            progress("live, memory")
            lm = await live(memory, memory, ids, intents)
            progress("live, Redis")
            lr = await live(reader, writer, ids, intents)
            progress("live done")
            out["live"] = {
                "beats_per_s": round(args.endpoints / LIVE_INTERVAL_S),
                "memory": figures(lm),
                "redis": figures(lr),
                "decisions": len(lr),
            }
    finally:
        progress("closing")
        await reader_reg.close()
        await writer_reg.close()
        progress("closed")
        import redis

        client = redis.Redis.from_url(args.redis)
        keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    return out


# --- propagation between two gateway processes ---------------------------------------------------


class Poller:
    """GETs on one keep-alive connection to a gateway."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def get(self, path: str) -> tuple[int, Any]:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        self.conn.request(
            "POST", path, json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    def close(self) -> None:
        self.conn.close()


def _until(poll: Any, bound_s: float = 5.0) -> float:
    """Seconds until ``poll()`` holds, polled back to back; RuntimeError past ``bound_s``."""
    start = time.perf_counter()
    while not poll():
        if time.perf_counter() - start > bound_s:
            raise RuntimeError(f"not seen within {bound_s} s")
    return time.perf_counter() - start


def _summary(delays: list[float]) -> dict[str, float]:
    ms = sorted(d * 1000 for d in delays)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "max_ms": round(ms[-1], 2),
    }


def propagation(a_url: str, b_url: str, trials: int, degraded_after_s: float) -> dict[str, Any]:
    """Delays of a registration, a heartbeat (degraded -> healthy) and a deregistration, from
    gateway A to gateway B; every endpoint is new (a prefix of the run's own)."""
    a, b = Poller(a_url), Poller(b_url)
    run = os.urandom(3).hex()
    ids = [f"agent://prop-{run}-{i:04d}" for i in range(trials)]
    path = {i: "/v1/agents/" + i.removeprefix("agent://") for i in ids}
    reg, beat, dereg = [], [], []
    try:
        for endpoint_id in ids:
            body = {
                "endpoint_id": endpoint_id,
                "capabilities": ["bench.prop"],
                "endpoint_url": "http://127.0.0.1:9/reach",
            }
            t0 = time.perf_counter()
            code, _ = a.post("/v1/register", body)
            assert code == 200
            _until(lambda: b.get(path[endpoint_id])[0] == 200)  # noqa: B023
            reg.append(time.perf_counter() - t0)
        # every endpoint past degraded-after on B, then one heartbeat each through A
        oldest = path[ids[-1]]
        _until(lambda: b.get(oldest)[1]["status"] != "healthy", degraded_after_s + 5)
        phase = random.Random(11)
        for endpoint_id in ids:
            if b.get(path[endpoint_id])[1]["status"] == "healthy":
                continue  # not aged yet: no status change to time
            # a random phase against B's sync loop: a trial that starts when B has just seen
            # the last one would always wait one whole sync period
            time.sleep(phase.uniform(0, STALENESS_BOUND_S))
            t0 = time.perf_counter()
            code, _ = a.post("/v1/heartbeat", {"endpoint_id": endpoint_id})
            assert code == 200
            _until(lambda: b.get(path[endpoint_id])[1]["status"] == "healthy")  # noqa: B023
            beat.append(time.perf_counter() - t0)
        for endpoint_id in ids:
            t0 = time.perf_counter()
            code, _ = a.post("/v1/deregister", {"endpoint_id": endpoint_id})
            assert code == 200
            _until(lambda: b.get(path[endpoint_id])[0] == 404)  # noqa: B023
            dereg.append(time.perf_counter() - t0)
    finally:
        a.close()
        b.close()
    return {
        "registration": _summary(reg),
        "heartbeat": _summary(beat),
        "deregistration": _summary(dereg),
        "staleness_bound_ms": round(STALENESS_BOUND_S * 1000),
    }


# --- processes: --workers 1 vs 2, and two gateways for propagation -----------------------------


def _cli() -> list[str]:
    bindir = Path(PY).parent
    exe = bindir / "agent-reach"
    return [str(exe)] if exe.exists() else [PY, "-m", "agent_reach"]


def _children(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.add(int(entry.name))
    return out


def _serve(name: str, redis_url: str, workers: int, interval: float) -> harness.Child:
    prefix = f"bench-{name}-{os.urandom(3).hex()}"
    cmd = [*_cli(), "serve", "--port", "0", "--registry", redis_url, "--registry-prefix", prefix]
    cmd += ["--workers", str(workers), "--heartbeat-interval", str(interval)]
    child = harness.start(name, [*cmd, "--log-level", "WARNING"], None)
    child.url = child.wait_line(r"listening on (http://\S+)")
    return child


def _seen_through_every_worker(url: str, endpoint_id: str, bound_s: float = 10.0) -> None:
    """20 fresh connections in a row find ``endpoint_id`` (each may land on another worker)."""
    host, port = url.removeprefix("http://").split(":")
    path = "/v1/agents/" + endpoint_id.removeprefix("agent://")
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        ok = 0
        for _ in range(20):
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            try:
                conn.request("GET", path)
                ok += conn.getresponse().status == 200
            finally:
                conn.close()
        if ok == 20:
            return
        time.sleep(0.02)  # polling interval, not a settle delay
    raise RuntimeError(f"{endpoint_id} not seen through every worker of {url}")


# what the workers comparison runs: name -> (registry, --workers)
WORKER_STACKS = {"2": ("redis", 2), "1": ("redis", 1), "memory": ("memory://", 1)}


def workers(args: argparse.Namespace, redis_url: str, redis_pid: int | None) -> dict[str, Any]:
    """Good answers/s of ``--workers 2`` and ``--workers 1`` on Redis, and of one gateway on
    the in-memory registry under the same conditions, measured in rotating order."""
    started: list[harness.Child] = []
    try:
        stacks: dict[str, harness.Child] = {}
        for name, (registry, n) in WORKER_STACKS.items():
            url = redis_url if registry == "redis" else registry
            stacks[name] = _serve(f"workers-{name}", url, n, 3600.0)
            started.append(stacks[name])
        agent_cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        for child in stacks.values():
            agent_cmd += ["--register", child.url]
        agent = harness.start("workers-agent", agent_cmd, None)
        started.append(agent)
        agent.wait_line(r"listening on (http://\S+)")
        pids = {
            name: _children(c.pid) if WORKER_STACKS[name][1] > 1 else {c.pid}
            for name, c in stacks.items()
        }
        assert all(len(pids[k]) == n for k, (_, n) in WORKER_STACKS.items()), pids
        for child in stacks.values():
            _seen_through_every_worker(child.url, AGENT_ID)
        ours = {c.pid for c in started} | {p for ps in pids.values() for p in ps}
        ours |= {redis_pid} if redis_pid else set()
        out: dict[str, Any] = {"connections": args.conns, "runs": {k: [] for k in stacks}}
        for child in stacks.values():  # warm-up
            harness.wrk(
                child.url + "/v1/send",
                SEND_BODY,
                args.conns,
                1,
                core=None,
                gateway_pid=None,
                ours=ours,
                measured=False,
            )
        names = list(stacks)
        for i in range(args.runs):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                j0 = sum(harness.jiffies(p) for p in pids[name])
                r = harness.wrk(
                    stacks[name].url + "/v1/send",
                    SEND_BODY,
                    args.conns,
                    args.duration,
                    core=None,
                    gateway_pid=None,
                    ours=ours,
                )
                j1 = sum(harness.jiffies(p) for p in pids[name])
                if r["requests"]:
                    r["gw_cpu_us_per_req"] = round(
                        (j1 - j0) / harness.CLK_TCK * 1e6 / r["requests"], 1
                    )
                out["runs"][name].append(r)
        return out
    finally:
        for child in reversed(started):
            child.stop()


def propagation_run(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """Two gateways on one Redis (heartbeat interval 1 s: degraded after 1 s), and the trials."""
    started: list[harness.Child] = []
    try:
        prefix = f"bench-prop-{os.urandom(3).hex()}"
        for name in ("prop-a", "prop-b"):
            cmd = [*_cli(), "serve", "--port", "0", "--registry", redis_url]
            cmd += [
                "--registry-prefix",
                prefix,
                "--heartbeat-interval",
                "1",
                "--log-level",
                "WARNING",
            ]
            child = harness.start(name, cmd, None)
            started.append(child)
            child.url = child.wait_line(r"listening on (http://\S+)")
        return propagation(started[0].url, started[1].url, args.trials, 1.0)
    finally:
        for child in reversed(started):
            child.stop()


# --- churn: what registrations and removals leave behind (in process) ------------------------


async def churn(args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """Register and deregister ``--ids`` ids through gateway A (B watching), deregister
    ``--unknown`` ids never registered, then count what Redis and both views still hold and
    time a full reconcile of B. Everything should be back to zero but the fixed keys."""
    from redis import asyncio as aioredis

    from agent_reach.core.model import EndpointRecord

    prefix = f"bench-churn-{os.urandom(4).hex()}"
    a, b = (RedisRegistry(redis_url, prefix=prefix) for _ in range(2))
    for view in (a, b):
        view.bind(time.monotonic)
        await view.start()
    t0 = time.perf_counter()
    for i in range(args.ids):
        now = time.monotonic()
        await a.upsert(
            EndpointRecord(f"agent://churn-{i}", ("bench.t",), "http://h:1/", "", now, 0)
        )
        await a.remove(f"agent://churn-{i}")
    for i in range(args.unknown):
        await a.remove(f"agent://unknown-{i}")
    churn_s = time.perf_counter() - t0
    for _ in range(500):  # at most 5 s: the views drop their tombstones at their next syncs
        if not (a._versions.tombstones() or b._versions.tombstones()):
            break
        await asyncio.sleep(0.01)  # polling interval
    t1 = time.perf_counter()
    await b._sync.reconcile()
    reconcile_ms = (time.perf_counter() - t1) * 1000
    p = "{" + prefix + "}"
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = [k async for k in client.scan_iter(p + ":*", count=10_000)]
        out = {
            "ids": args.ids,
            "unknown": args.unknown,
            "ops_per_s": round((2 * args.ids + args.unknown) / churn_s),
            "ver_fields": await client.hlen(p + ":ver"),
            "seen_members": await client.zcard(p + ":seen"),
            "keys": sorted(k.removeprefix(p) for k in keys),
            "a_versions": len(a._versions.live),
            "b_versions": len(b._versions.live),
            "a_tombstones": a._versions.tombstones(),
            "b_tombstones": b._versions.tombstones(),
            "b_reconcile_ms": round(reconcile_ms, 2),
        }
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
        for view in (a, b):
            await view.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("decision", help="route decision on a Redis-loaded view vs memory (JSON)")
    d.add_argument("--redis", required=True)
    d.add_argument("--endpoints", type=int, default=10_000)
    d.add_argument("--runs", type=int, default=3)
    d.add_argument("--calls", type=int, default=100_000, help="timed decisions per run")
    d.add_argument("--no-live", dest="live", action="store_false")
    c = sub.add_parser("churn", help="what registrations and removals leave in Redis (JSON)")
    c.add_argument("--redis", help="a Redis URL (default: a private redis-server)")
    c.add_argument("--ids", type=int, default=50_000, help="ids registered, then deregistered")
    c.add_argument("--unknown", type=int, default=10_000, help="ids deregistered, never there")
    args = p.parse_args()
    if args.what == "decision":
        json.dump(asyncio.run(decision(args)), sys.stdout)
        sys.stdout.write("\n")
    elif args.what == "churn":
        with redis_server(args.redis) as (url, _):
            json.dump(asyncio.run(churn(args, url)), sys.stdout)
        sys.stdout.write("\n")


if __name__ == "__main__":
    main()
