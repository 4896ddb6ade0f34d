"""Agent-Reach benchmarks against the seed-style baseline, measured in the same run.

    .venv/bin/python benchmarks/run.py                   # all (redis if redis-server is there)
    .venv/bin/python benchmarks/run.py route --runs 5
    .venv/bin/python benchmarks/run.py e2e heartbeat --duration 3 --floor

Sub-benchmarks (benchmarks/README.md says more):

- ``route``: in-process route decision at 100k endpoints / 1,000 intents, and memory per
  endpoint (benchmarks/route_bench.py, in a child process).
- ``latency``: p50 at one caller (wrk -c1 -t1): direct to the agent, through Agent-Reach,
  through the seed gateway.
- ``e2e``: good answers/s of ``POST /v1/send`` at 32 and 128 connections (wrk).
- ``heartbeat``: ``POST /v1/heartbeat`` answered per second at 32 connections (wrk).
- ``ladder``: one interleaved run over six rungs to the same trivial agent: direct, an nginx
  hop, the lean forwarder (benchmarks/lean_forwarder.py), Agent-Reach in open mode and in token
  mode, the seed gateway; at 1 caller (p50, p99, added p50 over direct), at 32 and 128
  (answers/s, p50/p99, CPU per request) and heartbeats at 32, with the targets of issue 18
  (benchmarks/ladder_bench.py). Part of "all" when nginx is installed.
- ``redis``: the shared registry on a private redis-server (or ``--redis URL``): the route
  decision on a view loaded from Redis vs memory, ``serve --workers 2`` vs ``--workers 1``
  (wrk), and the propagation delay of a registration, a heartbeat and a deregistration between
  two gateways (benchmarks/redis_bench.py). Part of "all" when redis-server is installed.
- ``auth``: token mode's pieces in process, µs per call next to baselines (verify, policy,
  rate limit, delivery signature, the SDK's check of it; benchmarks/auth_bench.py, a child).
- ``tokens``: good answers/s of ``POST /v1/send`` at 32 connections through an open-mode
  gateway, a token-mode one and a token-mode one with a rate limit that never refuses, measured
  alternately against one trivial agent (which does not verify assertions): the gateway's cost
  of token mode, in answers/s and CPU per request.
- ``nats``: one gateway with ``--nats`` to a private nats-server: ``POST /v1/send`` to an HTTP
  agent vs a NATS agent (``nats:SUBJECT``) at 32 connections and at 1, and heartbeats over HTTP
  (wrk) vs over NATS (a nats-py load generator), measured alternately; nats-server's and the
  generator's CPU beside (benchmarks/nats_bench.py). Part of "all" when nats-server is installed.
- ``a2a``: one gateway, one trivial agent: the same reach as ``POST /v1/send`` and as
  ``POST /a2a`` (A2A 1.0 ``SendMessage``, the intent in ``metadata.intent``) at 1 and 32
  connections, measured alternately: the added cost of the protocol (benchmarks/a2a_bench.py).
- ``federation``: a directory and two gateways (A without agents, B with the trivial agent):
  the same send to B (local) and to A, which forwards it to B, at 1 and 32 connections, measured
  alternately (p50, answers/s, both gateways' CPU per request); a summary of 1,000 tags: its
  bytes, ``build_summary``'s time and a PUT round trip to the directory
  (benchmarks/federation_bench.py).

Every figure is the median over ``--runs`` runs with min-max; ratios are taken run by run (the
gateways are measured alternately within each run) and then their median. With 2+ CPUs and
``taskset``, gateways run on CPU 0 and wrk + the trivial agent on CPU 1. Before each measured
wrk run the runner waits (within ``--quiet-budget``) until processes outside the benchmark leave
the CPUs alone, and says how much CPU they took anyway. Output: a markdown table on stdout and in
benchmarks/out/latest.md, raw figures in benchmarks/out/latest.json, child logs in
benchmarks/out/logs/. When a target is missed and py-spy is installed, the Agent-Reach gateway is
profiled under the same load and the summary is appended.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    AGENT_ID,
    DIRECT_BODY,
    HERE,
    INTENT,
    NOISY_PCT,
    OUT,
    PY,
    QUIET,
    SEND_BODY,
    Child,
    Cores,
    agent_reach_cli,
    die_with_parent,
    fmt,
    machine,
    med,
    nginx_path,
    pin,
    profile,
    register_with_token,
    source_revision,
    start,
    token_mode,
    versions,
    wait_http,
    wrk,
)

# run in this order: in-process ones first, latency before load
BENCHES = (
    "route",
    "auth",
    "latency",
    "e2e",
    "heartbeat",
    "ladder",
    "tokens",
    "redis",
    "nats",
    "a2a",
    "federation",
)
STEAL_PCT = 5.0  # steal time, in % of one core, above which a run is noted as noisy
HEARTBEAT_BODY = json.dumps({"endpoint_id": AGENT_ID})
TOKENS_CONNS = 32
NEVER_LIMITED = 1e9  # --rate-limit of the "tokens + rate limit" gateway: the bucket never empties
TARGETS = {
    "route_p50_us": 10.0,  # below
    "route_ratio": 1000.0,  # at least
    "route_mem_b": 2048.0,  # below
    "e2e_ratio": 8.0,  # at least
    "added_ms": 0.6,  # at most
    "heartbeat_ratio": 4.0,  # at least
    "redis_decision_ratio": 10.0,  # at most: the same order of magnitude as memory
    "redis_beat_allowance_ms": 20.0,  # heartbeat p99 over the stated staleness bound, at most
    "workers_ratio": 1.8,  # --workers 2 over one worker, at least, where the cores allow it
}
REDIS_CONNS = 32


@dataclass
class Stack:
    """Agent-Reach, the seed gateway, optionally the floor, and one trivial agent."""

    reach: Child
    seed: Child
    agent: Child
    floor: Child | None = None

    def pids(self) -> set[int]:
        return {c.pid for c in (self.reach, self.seed, self.agent, self.floor) if c}

    def gateways(self) -> list[tuple[str, Child]]:
        out = [("agent_reach", self.reach), ("seed", self.seed)]
        return out + ([("floor", self.floor)] if self.floor else [])


@contextlib.contextmanager
def stack(cores: Cores, *, floor: bool = False, seed_as_installed: bool = False) -> Iterator[Stack]:
    gw_core, load_core = cores
    children: list[Child] = []
    try:
        serve = [*agent_reach_cli(), "serve", "--port", "0", "--log-level", "WARNING"]
        reach = start("agent-reach", [*serve, "--heartbeat-interval", "3600"], gw_core)
        children.append(reach)
        seed_cmd = [PY, str(HERE / "seed_gateway.py"), "--port", "0"]
        seed_cmd += ["--heartbeat-interval", "3600"]
        seed = start("seed", seed_cmd + (["--as-installed"] if seed_as_installed else []), gw_core)
        children.append(seed)
        reach.url = reach.wait_line(r"listening on (http://\S+)")
        seed.url = seed.wait_line(r"listening on (http://\S+)")
        wait_http(reach.url + "/healthz")
        wait_http(seed.url + "/openapi.json")
        agent_cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        agent_cmd += ["--register", reach.url, "--register", seed.url]
        agent = start("agent", agent_cmd, load_core)
        children.append(agent)
        agent.url = agent.wait_line(r"listening on (http://\S+)")
        st = Stack(reach, seed, agent)
        if floor:
            st.floor = start(
                "floor", [PY, str(HERE / "floor_gateway.py"), "--agent", agent.url], gw_core
            )
            children.append(st.floor)
            st.floor.url = st.floor.wait_line(r"listening on (http://\S+)")
        yield st
    finally:
        for child in reversed(children):
            child.stop()


@dataclass
class AuthStack:
    """``tokens``: gateways in open mode, token mode, token mode with a rate limit, one agent."""

    gateways: dict[str, Child]
    agent: Child
    client_token: str

    def pids(self) -> set[int]:
        return {self.agent.pid, *(c.pid for c in self.gateways.values())}


@contextlib.contextmanager
def auth_stack(cores: Cores) -> Iterator[AuthStack]:
    """Keys, policy and tokens in a temporary directory; three gateways on the gateway core."""
    gw_core, load_core = cores
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="bench-tokens-") as tmp:
        tm = token_mode(Path(tmp))
        serve = [*agent_reach_cli(), "serve", "--port", "0", "--log-level", "WARNING"]
        serve += ["--heartbeat-interval", "3600"]
        commands = {
            "open": serve,
            "tokens": [*serve, *tm.flags],
            "tokens_limited": [*serve, *tm.flags, "--rate-limit", f"{NEVER_LIMITED:g}"],
        }
        try:
            gateways: dict[str, Child] = {}
            for name, cmd in commands.items():
                gateways[name] = start(f"gateway-{name}", cmd, gw_core)
                children.append(gateways[name])
            for child in gateways.values():
                child.url = child.wait_line(r"listening on (http://\S+)")
                wait_http(child.url + "/healthz")
            agent_cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
            agent_cmd += ["--register", gateways["open"].url]
            agent = start("agent-tokens", agent_cmd, load_core)
            children.append(agent)
            agent.url = agent.wait_line(r"listening on (http://\S+)")
            for name in ("tokens", "tokens_limited"):
                register_with_token(gateways[name].url, tm.enroll, AGENT_ID, [INTENT], agent.url)
            yield AuthStack(gateways, agent, tm.client)
        finally:
            for child in reversed(children):
                child.stop()


@dataclass
class Report:
    rows: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdicts: list[tuple[str, bool, str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    profiles: dict[str, str] = field(default_factory=dict)

    def row(
        self,
        bench: str,
        metric: str,
        ar: str,
        seed: str = "",
        ratio: str = "",
        target: str = "",
        floor: str = "",
    ) -> None:
        self.rows.append(
            {
                "bench": bench,
                "metric": metric,
                "ar": ar,
                "seed": seed,
                "ratio": ratio,
                "target": target,
                "floor": floor,
            }
        )

    def verdict(self, name: str, ok: bool, detail: str) -> None:
        self.verdicts.append((name, ok, detail))

    def noise(self, name: str, runs: list[dict[str, Any]]) -> None:
        worst = max(runs, key=lambda r: r["foreign_cpu_pct"])
        if worst["foreign_cpu_pct"] >= NOISY_PCT:
            self.notes.append(
                f"{name}: processes outside the benchmark took up to {worst['foreign_cpu_pct']}% "
                f"of a core during a measured run ({worst['foreign_top']}): figures are noisy."
            )
        steal = max(r["steal_pct"] for r in runs)
        if steal >= STEAL_PCT:
            self.notes.append(
                f"{name}: the hypervisor took up to {steal}% of a core from this machine during a "
                "measured run (steal time): figures are noisy."
            )


# --- sub-benchmarks ---------------------------------------------------------------------------


def bench_route(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    QUIET.wait(set())
    cmd = [*pin(cores[0]), PY, str(HERE / "route_bench.py"), "--runs", str(args.runs)]
    cmd += ["--profile", args.profile, "--target-us", str(TARGETS["route_p50_us"])]
    proc = subprocess.run(
        cmd, capture_output=True, timeout=900, cwd=HERE.parent, preexec_fn=die_with_parent
    )
    if proc.returncode != 0:
        raise RuntimeError(f"route_bench failed: {proc.stderr.decode()[-2000:]}")
    d = json.loads(proc.stdout)
    rep.data["route"] = d
    runs = d["runs"]

    def us(key: str) -> dict[str, float]:
        return med([r[key] / 1000 for r in runs])

    warm = us("warm_p50_ns")
    ratio = med([r["seed_p50_ns"] / r["warm_p50_ns"] for r in runs])
    n = f"{d['endpoints'] // 1000}k endpoints, {d['candidates_per_intent']:.0f} per intent"
    target = f"< {TARGETS['route_p50_us']:.0f} µs, ≥ {TARGETS['route_ratio']:.0f}x"
    rep.row(
        "route",
        f"decision p50 ({n})",
        fmt(warm, " µs", 2),
        fmt(us("seed_p50_ns"), " µs"),
        fmt(ratio, "x"),
        target,
    )
    rep.row(
        "route", "  decision p99", fmt(us("warm_p99_ns"), " µs", 2), fmt(us("seed_p99_ns"), " µs")
    )
    if runs[0].get("cold_p50_ns") is not None:
        rep.row(
            "route",
            "  p50 on a tier cache miss (first request of an intent)",
            fmt(us("cold_p50_ns"), " µs"),
            target="info",
        )
    live = d.get("live")
    for name, label in (("sdk", "every 6-8 s, as the SDK"), ("on_time", "every 10 s exactly")):
        if live and f"live_{name}_p50_ns" in runs[0]:
            share = med([100 * r[f"live_{name}_slow_share"] for r in runs])
            rep.row(
                "route",
                f"  live registry, heartbeats {label} ({live[f'{name}_heartbeats_per_s']:,}/s), "
                f"{live['routes_per_s']:,.0f} routes/s: p50 / p99 / mean; share > 50 µs",
                f"{fmt(us(f'live_{name}_p50_ns'), ' µs')} / {fmt(us(f'live_{name}_p99_ns'), ' µs')}"
                f" / {fmt(us(f'live_{name}_mean_ns'), ' µs')}; {fmt(share, ' %')}",
                target="info",
            )
    mem = d["mem_per_endpoint_warm_b"]
    rep.row(
        "route",
        "memory per registered endpoint (tracemalloc, 100k)",
        f"{d['mem_per_endpoint_b']:,.0f} B ({mem:,.0f} B, tier caches warm)",
        f"{d['seed_mem_per_endpoint_b']:,.0f} B",
        "",
        f"< {TARGETS['route_mem_b']:.0f} B",
    )
    for key, title in (
        ("profile_warm", "route decision, warm (cProfile)"),
        ("profile_live_sdk", "route decision, live registry, SDK heartbeats (cProfile, 1 s)"),
        ("profile_live_on_time", "route decision, live registry, on-time heartbeats (cProfile)"),
    ):
        if key in d:
            rep.profiles[title] = d.pop(key)
    rep.notes.append(
        f"route: 100k registrations took {d['register_s']} s under tracemalloc; the timer pair "
        f"({d['timer_ns']:.0f} ns) is included in the per-call figures; RSS grew "
        f"{d['rss_delta_per_endpoint_b']:,.0f} B per endpoint while registering (tracemalloc's "
        "own bookkeeping included)."
    )
    rep.verdict(
        "route decision p50 < 10 µs", warm["median"] < TARGETS["route_p50_us"], fmt(warm, " µs", 2)
    )
    rep.verdict(
        "route decision ≥ 1000x faster than the seed's",
        ratio["median"] >= TARGETS["route_ratio"],
        fmt(ratio, "x"),
    )
    rep.verdict("memory < 2 KB per endpoint", mem < TARGETS["route_mem_b"], f"{mem:,.0f} B")


def bench_auth(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    QUIET.wait(set())
    cmd = [*pin(cores[0]), PY, str(HERE / "auth_bench.py"), "--json"]
    cmd += ["--repeats", str(max(args.runs, 5))]
    proc = subprocess.run(
        cmd, capture_output=True, timeout=600, cwd=HERE.parent, preexec_fn=die_with_parent
    )
    if proc.returncode != 0:
        raise RuntimeError(f"auth_bench failed: {proc.stderr.decode()[-2000:]}")
    d = json.loads(proc.stdout)
    rep.data["auth"] = d
    for item in d["items"]:
        spread = {"median": item["us_median"], "min": item["us_min"], "max": item["us_max"]}
        digits = 3 if item["us_median"] < 1 else 1
        rep.row(
            "auth", f"{item['group']}: {item['name']}", fmt(spread, " µs", digits), target="info"
        )
    v = d["versions"]
    rep.notes.append(
        f"auth: in process, pinned like route; {d['repeats']} loops per call (median, min-max), "
        f"the garbage collector off; PyJWT {v['pyjwt']}, cryptography {v['cryptography']}."
    )


def _rotate(
    args: argparse.Namespace, names: list[str], one: Callable[[str, int, bool], dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Each of ``names`` measured ``args.runs`` times in rotating order, after an unmeasured 1 s
    warm-up each (pools filled, code paths hot); ``one(name, seconds, measured)`` is one run."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for name in names:
        one(name, 1, False)
    for i in range(args.runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(one(name, args.duration, True))
    return out


def _alternate(
    args: argparse.Namespace,
    st: Stack | AuthStack,
    cores: Cores,
    targets: list[tuple[str, str, str, int]],
    conns: int,
    headers: dict[str, dict[str, str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``targets`` = (name, url, body, pid or 0), wrk runs measured by ``_rotate``;
    ``headers[name]`` are sent with that target's requests."""
    ours = st.pids()
    hdrs = headers or {}
    by_name = {name: (url, body, pid) for name, url, body, pid in targets}

    def one(name: str, seconds: int, measured: bool) -> dict[str, Any]:
        url, body, pid = by_name[name]
        return wrk(
            url,
            body,
            conns,
            seconds,
            core=cores[1],
            gateway_pid=pid or None,
            ours=ours,
            measured=measured,
            headers=hdrs.get(name),
        )

    return _rotate(args, list(by_name), one)


def _ratio(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float]:
    return med([x["rps"] / max(y["rps"], 1e-9) for x, y in zip(a, b, strict=True)])


def bench_latency(args: argparse.Namespace, rep: Report, st: Stack, cores: Cores) -> None:
    targets = [("direct", st.agent.url, DIRECT_BODY, 0)]
    targets += [(name, c.url + "/v1/send", SEND_BODY, c.pid) for name, c in st.gateways()]
    runs = _alternate(args, st, cores, targets, 1)
    rep.data["latency"] = runs
    floor = "floor" in runs

    def ms(name: str, key: str = "p50_us", digits: int = 3) -> str:
        return fmt(med([r[key] / 1000 for r in runs[name]]), " ms", digits)

    def added(name: str) -> dict[str, float]:
        pairs = zip(runs[name], runs["direct"], strict=True)
        return med([(a["p50_us"] - d["p50_us"]) / 1000 for a, d in pairs])

    def cpu(name: str) -> str:
        return fmt(med([r["gw_cpu_us_per_req"] for r in runs[name]]), " µs")

    def errors(name: str) -> str:
        return str(sum(r["errors"] for r in runs[name]))

    rep.row(
        "latency",
        "p50 at 1 caller (wrk -c1), through the gateway",
        ms("agent_reach"),
        ms("seed"),
        floor=ms("floor") if floor else "",
    )
    rep.row(
        "latency",
        "  p50 direct to the agent",
        ms("direct"),
        ms("direct"),
        floor=ms("direct") if floor else "",
    )
    ar_added = added("agent_reach")
    rep.row(
        "latency",
        "  added p50 over direct",
        fmt(ar_added, " ms", 3),
        fmt(added("seed"), " ms", 3),
        "",
        f"≤ {TARGETS['added_ms']} ms",
        fmt(added("floor"), " ms", 3) if floor else "",
    )
    rep.row(
        "latency",
        "  p99 through the gateway",
        ms("agent_reach", "p99_us", 2),
        ms("seed", "p99_us", 2),
        floor=ms("floor", "p99_us", 2) if floor else "",
    )
    rep.row(
        "latency",
        "  gateway CPU per request at 1 caller",
        cpu("agent_reach"),
        cpu("seed"),
        target="info",
        floor=cpu("floor") if floor else "",
    )
    rep.row(
        "latency",
        "  errors",
        errors("agent_reach"),
        errors("seed"),
        target=f"0 (direct: {errors('direct')})",
        floor=errors("floor") if floor else "",
    )
    rep.noise("latency", [r for v in runs.values() for r in v])
    rep.verdict(
        "added p50 ≤ 0.6 ms at 1 caller",
        ar_added["median"] <= TARGETS["added_ms"],
        fmt(ar_added, " ms", 3),
    )


def bench_e2e(args: argparse.Namespace, rep: Report, st: Stack, cores: Cores) -> None:
    rep.data["e2e"] = {}
    for conns in (32, 128):
        targets = [(name, c.url + "/v1/send", SEND_BODY, c.pid) for name, c in st.gateways()]
        runs = _alternate(args, st, cores, targets, conns)
        rep.data["e2e"][str(conns)] = runs
        floor = "floor" in runs
        ratio = _ratio(runs["agent_reach"], runs["seed"])
        errors = sum(r["errors"] for r in runs["agent_reach"])

        def col(name: str, key: str, unit: str = "", digits: int = 0, div: float = 1) -> str:
            if name not in runs:  # noqa: B023 - used at once, inside the loop
                return ""
            return fmt(med([r[key] / div for r in runs[name]]), unit, digits)  # noqa: B023

        def lat(name: str) -> str:
            if name not in runs:  # noqa: B023 - used at once, inside the loop
                return ""
            p50, p99 = col(name, "p50_us", " ms", 1, 1000), col(name, "p99_us", " ms", 1, 1000)
            return f"{p50} / {p99}"

        rep.row(
            "e2e",
            f"POST /v1/send, good answers/s, {conns} connections",
            col("agent_reach", "rps"),
            col("seed", "rps"),
            fmt(ratio, "x", 1),
            f"≥ {TARGETS['e2e_ratio']:.0f}x, 0 errors",
            col("floor", "rps"),
        )
        rep.row("e2e", "  latency p50 / p99", lat("agent_reach"), lat("seed"), floor=lat("floor"))
        rep.row(
            "e2e",
            "  errors (non-200, bad body, socket)",
            str(errors),
            str(sum(r["errors"] for r in runs["seed"])),
            target="0",
            floor=str(sum(r["errors"] for r in runs["floor"])) if floor else "",
        )
        rep.row(
            "e2e",
            "  gateway CPU per request",
            col("agent_reach", "gw_cpu_us_per_req", " µs"),
            col("seed", "gw_cpu_us_per_req", " µs"),
            target="info",
            floor=col("floor", "gw_cpu_us_per_req", " µs"),
        )
        rep.noise(f"e2e at {conns} connections", [r for v in runs.values() for r in v])
        rep.verdict(
            f"e2e ≥ 8x the seed at {conns} connections",
            ratio["median"] >= TARGETS["e2e_ratio"],
            fmt(ratio, "x", 1),
        )
        rep.verdict(f"e2e zero errors at {conns} connections", errors == 0, f"{errors} errors")


def bench_heartbeat(args: argparse.Namespace, rep: Report, st: Stack, cores: Cores) -> None:
    targets = [(n, c.url + "/v1/heartbeat", HEARTBEAT_BODY, c.pid) for n, c in st.gateways()]
    runs = _alternate(args, st, cores, targets, 32)
    rep.data["heartbeat"] = runs
    ratio = _ratio(runs["agent_reach"], runs["seed"])

    def col(name: str, key: str, unit: str = "") -> str:
        return fmt(med([r[key] for r in runs[name]]), unit) if name in runs else ""

    def errors(name: str) -> str:
        return str(sum(r["errors"] for r in runs[name])) if name in runs else ""

    rep.row(
        "heartbeat",
        "POST /v1/heartbeat answered/s, 32 connections",
        col("agent_reach", "rps"),
        col("seed", "rps"),
        fmt(ratio, "x", 1),
        f"≥ {TARGETS['heartbeat_ratio']:.0f}x",
        col("floor", "rps"),
    )
    rep.row(
        "heartbeat",
        "  gateway CPU per heartbeat",
        col("agent_reach", "gw_cpu_us_per_req", " µs"),
        col("seed", "gw_cpu_us_per_req", " µs"),
        target="info",
        floor=col("floor", "gw_cpu_us_per_req", " µs"),
    )
    rep.row(
        "heartbeat",
        "  errors",
        errors("agent_reach"),
        errors("seed"),
        target="0",
        floor=errors("floor"),
    )
    rep.noise("heartbeat", [r for v in runs.values() for r in v])
    rep.verdict(
        "heartbeats ≥ 4x the seed",
        ratio["median"] >= TARGETS["heartbeat_ratio"],
        fmt(ratio, "x", 1),
    )


def bench_tokens(args: argparse.Namespace, rep: Report, st: AuthStack, cores: Cores) -> None:
    targets = [(n, c.url + "/v1/send", SEND_BODY, c.pid) for n, c in st.gateways.items()]
    bearer = {"Authorization": f"Bearer {st.client_token}"}
    headers = {"tokens": bearer, "tokens_limited": bearer}
    runs = _alternate(args, st, cores, targets, TOKENS_CONNS, headers)
    rep.data["tokens"] = runs

    def col(name: str, key: str, unit: str = "", digits: int = 0, div: float = 1) -> str:
        return fmt(med([r[key] / div for r in runs[name]]), unit, digits)

    def cpu_added(name: str) -> tuple[dict[str, float], dict[str, float]]:
        pairs = list(zip(runs[name], runs["open"], strict=True))
        added = med([a["gw_cpu_us_per_req"] - o["gw_cpu_us_per_req"] for a, o in pairs])
        pct = med([100 * (a["gw_cpu_us_per_req"] / o["gw_cpu_us_per_req"] - 1) for a, o in pairs])
        return added, pct

    labels = {
        "open": "open mode",
        "tokens": "token mode (bearer token, policy, signed delivery); ratio to open",
        "tokens_limited": f"token mode + --rate-limit {NEVER_LIMITED:g} (never refuses); "
        "ratio to open",
    }
    for name, label in labels.items():
        rep.row(
            "tokens",
            f"POST /v1/send good answers/s, {TOKENS_CONNS} connections, {label}",
            col(name, "rps"),
            ratio="" if name == "open" else fmt(_ratio(runs[name], runs["open"]), "x", 3),
            target="info",
        )
        rep.row(
            "tokens",
            "  latency p50 / p99; errors",
            f"{col(name, 'p50_us', ' ms', 1, 1000)} / {col(name, 'p99_us', ' ms', 1, 1000)}; "
            f"{sum(r['errors'] for r in runs[name])}",
            target="0 errors",
        )
        if name == "open":
            rep.row(
                "tokens",
                "  gateway CPU per request",
                col(name, "gw_cpu_us_per_req", " µs"),
                target="info",
            )
        else:
            added, pct = cpu_added(name)
            rep.row(
                "tokens",
                "  gateway CPU per request; added over open (run by run)",
                f"{col(name, 'gw_cpu_us_per_req', ' µs')}; +{fmt(added, ' µs')} "
                f"(+{fmt(pct, ' %', 1)})",
                target="info",
            )
    rep.noise("tokens", [r for v in runs.values() for r in v])
    rep.notes.append(
        "tokens: three gateways on the gateway core, one trivial agent registered with each "
        "(with an enrollment token in token mode); one client token for all requests, so it is "
        "verified once and then cached; policy: one [[reach]] rule for every sender and intent. "
        "The agent does not verify the assertions: the agent's side is in auth."
    )


def bench_ladder(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    import ladder_bench

    data: dict[str, dict[str, list[dict[str, Any]]]] = {}
    first = len(rep.verdicts)
    with ladder_bench.stack(cores, seed_as_installed=args.seed_as_installed) as st:
        for kind in ladder_bench.KINDS:
            print(f"== ladder {kind}", flush=True)
            names, one = ladder_bench.targets(kind, st, cores)
            data[kind] = _rotate(args, names, one)
        st.samples.append(ladder_bench.check_answers(st, "after"))
        ladder_bench.report(rep, data, st)
        missed = [n for n, ok, _ in rep.verdicts[first:] if not ok]
        # the load under which each kind of missed target is profiled; token mode's CPU is not
        # (profile() sends no bearer token): auth's rows say where its cost goes
        loads = {
            ("send", 1): ("at 1 caller",),
            ("send", 32): ("answers/s", "p99"),
            ("heartbeat", 32): ("heartbeats/s",),
        }
        for (path, conns), words in loads.items():
            hit = any(w in n for w in words for n in missed)
            if args.profile == "always" or (args.profile == "auto" and hit):
                print(f"== profile ladder, /v1/{path} at {conns} caller(s)", flush=True)
                beat = path == "heartbeat"
                title = (
                    f"Agent-Reach gateway (ladder), POST /v1/{path} at {conns} connection(s) "
                    "(py-spy)"
                )
                rep.profiles[title] = profile(
                    st.servers["agent_reach"].pid,
                    st.url("agent_reach", beat),
                    st.body("agent_reach", beat),
                    conns,
                    cores,
                )
    rep.data["ladder"] = {"samples": st.samples, **data}


def bench_redis(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    import redis_bench

    with redis_bench.redis_server(args.redis) as (url, redis_pid):
        QUIET.wait(set())
        cmd = [*pin(cores[0]), PY, str(HERE / "redis_bench.py"), "decision", "--redis", url]
        cmd += ["--runs", str(args.runs)]
        proc = subprocess.run(
            cmd, capture_output=True, timeout=900, cwd=HERE.parent, preexec_fn=die_with_parent
        )
        if proc.returncode != 0:
            raise RuntimeError(f"redis_bench decision failed: {proc.stderr.decode()[-2000:]}")
        d = json.loads(proc.stdout)
        print("== redis workers", flush=True)
        args.conns = REDIS_CONNS
        w = redis_bench.workers(args, url, redis_pid)
        print("== redis propagation", flush=True)
        prop = redis_bench.propagation_run(args, url)
    rep.data["redis"] = {"decision": d, "workers": w, "propagation": prop}
    rep.notes.append(
        "redis: a private redis-server (no persistence) unless --redis; the decision child is "
        "pinned like route; the --workers runs are NOT pinned (2 workers are meant to use both "
        "CPUs), so wrk, the trivial agent, Redis and the workers share this machine's CPUs; "
        "the seed column does not apply to these rows."
    )

    runs = d["runs"]

    def us(key: str) -> dict[str, float]:
        return med([r[key] / 1000 for r in runs])

    ratio = med([r["redis_p50_ns"] / r["memory_p50_ns"] for r in runs])
    n = f"{d['endpoints'] // 1000}k endpoints, {d['candidates_per_intent']:.0f} per intent"
    rep.row(
        "redis",
        f"decision p50, view loaded from Redis ({n}); ratio to memory",
        fmt(us("redis_p50_ns"), " µs", 2),
        ratio=fmt(ratio, "x", 2),
        target=f"≤ {TARGETS['redis_decision_ratio']:.0f}x memory",
    )
    rep.row("redis", "  the same on MemoryRegistry", fmt(us("memory_p50_ns"), " µs", 2))
    rep.row(
        "redis",
        "  decision p99: Redis view / memory",
        f"{fmt(us('redis_p99_ns'), ' µs', 2)} / {fmt(us('memory_p99_ns'), ' µs', 2)}",
    )
    live = d.get("live")
    if live:

        def lv(k: str) -> str:
            f = live[k]
            p50, p99, mean = (f[k] / 1000 for k in ("p50_ns", "p99_ns", "mean_ns"))
            return f"{p50:.1f} / {p99:.1f} / {mean:.1f} µs"

        rep.row(
            "redis",
            f"  live: every endpoint beating every ~7 s ({live['beats_per_s']:,}/s, through the "
            "other gateway for Redis): p50 / p99 / mean, Redis view",
            lv("redis"),
            target="info",
        )
        rep.row("redis", "  live, the same on MemoryRegistry", lv("memory"), target="info")
    rep.row(
        "redis",
        f"  a gateway starting on {d['endpoints']:,} endpoints loads them from Redis in",
        f"{d['load_s'] * 1000:,.0f} ms",
        target="info",
    )
    rep.verdict(
        "route decision on a Redis view within 10x of memory",
        ratio["median"] <= TARGETS["redis_decision_ratio"],
        fmt(ratio, "x", 2),
    )

    wr = w["runs"]

    def col(k: str, key: str, unit: str = "", digits: int = 0, div: float = 1) -> str:
        return fmt(med([r[key] / div for r in wr[k]]), unit, digits)

    rps_ratio = _ratio(wr["2"], wr["1"])
    labels = {
        "2": "--workers 2 on Redis; ratio to 1 worker",
        "1": "--workers 1 on Redis",
        "memory": "1 gateway on memory:// (reference, same conditions)",
    }
    for k, label in labels.items():
        if k not in wr:
            continue
        rep.row(
            "redis",
            f"POST /v1/send good answers/s, {w['connections']} connections, {label}",
            col(k, "rps"),
            ratio=fmt(rps_ratio, "x", 2) if k == "2" else "",
            target="info",
        )
        rep.row(
            "redis",
            "  latency p50 / p99; errors; gateway CPU per request (all workers)",
            f"{col(k, 'p50_us', ' ms', 1, 1000)} / {col(k, 'p99_us', ' ms', 1, 1000)}; "
            f"{sum(r['errors'] for r in wr[k])}; {col(k, 'gw_cpu_us_per_req', ' µs')}",
        )
        rep.row(
            "redis",
            "  the whole machine (workers, wrk, the agent, Redis, the kernel): busy share of "
            f"its {os.cpu_count()} CPUs; CPU per request",
            f"{col(k, 'machine_busy_pct', ' %')}; {col(k, 'machine_cpu_us_per_req', ' µs')}",
        )
    # what the cores allow: 1.8x one worker's answers/s at the two-worker run's CPU per request
    # of the whole machine, in CPUs (more than the machine has: the target is out of its reach)
    needed = med(
        [
            TARGETS["workers_ratio"] * one["rps"] * two["machine_cpu_us_per_req"] / 1e6
            for one, two in zip(wr["1"], wr["2"], strict=True)
        ]
    )
    rep.row(
        "redis",
        f"  CPUs that {TARGETS['workers_ratio']}x one worker's answers/s would take at the "
        "two-worker run's CPU per request (whole machine; run by run)",
        f"{fmt(needed, '', 2)} of {os.cpu_count()}",
        target="info",
    )
    beyond = needed["median"] > (os.cpu_count() or 1)
    rep.verdict(
        f"--workers 2 on Redis ≥ {TARGETS['workers_ratio']}x one worker where the cores allow it",
        rps_ratio["median"] >= TARGETS["workers_ratio"],
        fmt(rps_ratio, "x", 2)
        + (
            f"; {TARGETS['workers_ratio']}x would take {needed['median']:.2f} CPUs, "
            f"the machine has {os.cpu_count()}"
            if beyond
            else ""
        ),
    )
    rep.noise("redis workers", [r for v in wr.values() for r in v])

    bound = prop["staleness_bound_ms"]
    for key, label in (
        ("registration", "a registration (pub/sub)"),
        ("heartbeat", "a heartbeat: degraded -> healthy"),
        ("deregistration", "a deregistration (pub/sub)"),
    ):
        f = prop[key]
        rep.row(
            "redis",
            f"propagation A -> B, {label}: p50 / p99 / max ({f['n']} trials)",
            f"{f['p50_ms']:.1f} / {f['p99_ms']:.1f} / {f['max_ms']:.1f} ms",
            target=f"≤ {bound} ms (the bound)" if key == "heartbeat" else "info",
        )
    beat_p99 = prop["heartbeat"]["p99_ms"]
    rep.verdict(
        f"heartbeat propagation p99 within the stated bound ({bound} ms) + "
        f"{TARGETS['redis_beat_allowance_ms']:.0f} ms",
        beat_p99 <= bound + TARGETS["redis_beat_allowance_ms"],
        f"{beat_p99:.1f} ms",
    )


def bench_nats(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    import nats_bench

    data: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with nats_bench.stack(cores) as st:
        for kind in ("send_c32", "send_c1", "heartbeat"):
            print(f"== nats {kind}", flush=True)
            names, one = nats_bench.targets(kind, st, cores)
            data[kind] = _rotate(args, names, one)
        rep.data["nats"] = {"prefix": st.prefix, "subject": st.subject, **data}
        nats_bench.report(rep, data, st.prefix, st.subject)


def bench_a2a(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    import a2a_bench

    data: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with a2a_bench.stack(cores) as st:
        for conns in a2a_bench.CONNS:
            print(f"== a2a {conns} connection(s)", flush=True)
            names, one = a2a_bench.targets(conns, st, cores)
            data[f"c{conns}"] = _rotate(args, names, one)
    rep.data["a2a"] = {"samples": st.samples, **data}  # the answers checked after the rounds too
    a2a_bench.report(rep, data, st)


def bench_federation(args: argparse.Namespace, rep: Report, cores: Cores) -> None:
    import federation_bench

    data: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with federation_bench.stack(cores) as st:
        for conns in federation_bench.CONNS:
            print(f"== federation {conns} connection(s)", flush=True)
            names, one = federation_bench.targets(conns, st, cores)
            data[f"c{conns}"] = _rotate(args, names, one)
    costs = federation_bench.summary_costs(cores)  # processes of its own, after the rounds'
    table = federation_bench.table(data, costs)
    print(table, flush=True)
    rep.data["federation"] = {"samples": st.samples, "summary": costs, "table": table, **data}
    federation_bench.report(rep, data, costs, st)


def render(rep: Report, meta: dict[str, Any]) -> str:
    m = meta["machine"]
    floor = any(r["floor"] for r in rep.rows)
    head = ["benchmark", "metric", "Agent-Reach", "seed gateway", "ratio", "target"]
    head += ["aiohttp floor"] if floor else []
    lines = [
        f"# Agent-Reach benchmarks, {meta['date']}",
        "",
        f"- Command: `{meta['command']}` on commit {meta['revision']}",
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, "
        f"load average {m['loadavg_at_start']} at start",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- Placement: {meta['placement']}",
        f"- Seed gateway: {meta['seed']}",
        f"- {meta['runs']} runs per figure: median (min-max); {meta['duration']} s per wrk run; "
        "ratios taken run by run, then their median; req/s counts good answers only",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rep.rows:
        cells = [r["bench"], r["metric"], r["ar"], r["seed"], r["ratio"], r["target"]]
        lines.append("| " + " | ".join(cells + ([r["floor"]] if floor else [])) + " |")
    lines += ["", "## Targets", ""]
    lines += [f"- {'MET' if ok else 'MISSED'}: {n} ({d})" for n, ok, d in rep.verdicts]
    if rep.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in rep.notes]
    for name, text in rep.profiles.items():
        lines += ["", f"## Profile: {name}", "", "```", text]
        lines += ["```"]
    return "\n".join(lines) + "\n"


def nats_server() -> bool:
    """Whether ``nats`` can run: a nats-server binary and nats-py."""
    import importlib.util

    import nats_bench

    return nats_bench.server_path() is not None and importlib.util.find_spec("nats") is not None


def main() -> int:
    p = argparse.ArgumentParser(description="Agent-Reach benchmarks vs the seed-style gateway.")
    p.add_argument(
        "benches", nargs="*", metavar="BENCH", help=f"any of {', '.join(BENCHES)} (default: all)"
    )
    p.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    p.add_argument("--duration", type=int, default=4, help="seconds per wrk run (default 4)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes with taskset")
    p.add_argument(
        "--quiet-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the whole run may wait for other processes to leave the CPUs "
        "alone before measured wrk runs (0: never wait; default 60)",
    )
    p.add_argument(
        "--profile",
        choices=["auto", "always", "never"],
        default="auto",
        help="py-spy profile of the Agent-Reach gateway under load: when a target "
        "is missed (auto, the default), always, or never",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also measure the cheapest aiohttp forwarder (benchmarks/"
        "floor_gateway.py) as a reference column",
    )
    p.add_argument(
        "--seed-as-installed",
        action="store_true",
        help="run the seed gateway without its sniffio stand-in (see "
        "seed_gateway.py): slower, as a fresh install of the bench extra is",
    )
    p.add_argument(
        "--redis",
        metavar="URL",
        help="redis: use this Redis (a key prefix of the run's own) instead of starting a "
        "private redis-server on a free port",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=200,
        help="redis: propagation trials of each kind (default 200)",
    )
    args = p.parse_args()
    unknown = set(args.benches) - {*BENCHES, "all"}
    if unknown:
        p.error(f"unknown benchmark {', '.join(sorted(unknown))}: use {', '.join(BENCHES)}")
    if args.runs < 1 or not 1 <= args.duration <= 60:
        p.error("--runs must be >= 1 and --duration within 1-60 s")
    every = not args.benches or "all" in args.benches
    selected = [b for b in BENCHES if every or b in args.benches]
    if every and not args.redis and not shutil.which("redis-server"):
        selected.remove("redis")  # "all" without a Redis to run on
        print("redis-server not found: the redis benchmark is skipped", file=sys.stderr)
    if every and not nats_server():
        selected.remove("nats")
        print("nats-server or nats-py not found: the nats benchmark is skipped", file=sys.stderr)
    if every and not nginx_path():
        selected.remove("ladder")
        print("nginx not found: the ladder benchmark is skipped", file=sys.stderr)
    if "ladder" in selected and not nginx_path():
        p.error("ladder needs nginx (apt-get install -y nginx-light)")
    if "nats" in selected and not nats_server():
        p.error("nats needs /usr/sbin/nats-server (apt-get install -y nats-server) and nats-py")
    if "redis" in selected and not (args.redis or shutil.which("redis-server")):
        p.error("redis needs redis-server (apt-get install -y redis-server) or --redis URL")
    if any(b not in ("route", "auth") for b in selected) and not shutil.which("wrk"):
        p.error("wrk is not installed (apt-get install -y wrk)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks run
    QUIET.budget_s = max(0.0, args.quiet_budget)

    can_pin = not args.no_pin and (os.cpu_count() or 1) >= 2 and shutil.which("taskset")
    cores: Cores = (0, 1) if can_pin else (None, None)
    OUT.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python benchmarks/run.py", *sys.argv[1:]]).strip(),
        "revision": source_revision(),
        "versions": versions(),
        "machine": machine(),
        "placement": "gateways and the route benchmark pinned to CPU 0, wrk and the trivial "
        "agent to CPU 1 (taskset)"
        if can_pin
        else "not pinned",
        "seed": "FastAPI + one httpx.AsyncClient + dict scanned and sorted per request, plain "
        "uvicorn (its defaults: uvloop, h11), access log off, "
        + ("as installed (no sniffio)" if args.seed_as_installed else "sniffio stand-in"),
        "runs": args.runs,
        "duration": args.duration,
        "benches": selected,
    }
    rep = Report()
    t0 = time.monotonic()
    if "route" in selected:
        print("== route", flush=True)
        bench_route(args, rep, cores)
    if "auth" in selected:
        print("== auth", flush=True)
        bench_auth(args, rep, cores)
    http = [b for b in ("latency", "e2e", "heartbeat") if b in selected]
    if http:
        with stack(cores, floor=args.floor, seed_as_installed=args.seed_as_installed) as st:
            fns = {"latency": bench_latency, "e2e": bench_e2e, "heartbeat": bench_heartbeat}
            for name in http:
                print(f"== {name}", flush=True)
                fns[name](args, rep, st, cores)
            missed = [n for n, ok, _ in rep.verdicts if not ok]
            loads = {
                "latency": ("added p50", st.reach.url + "/v1/send", SEND_BODY, 1),
                "e2e": ("e2e ≥", st.reach.url + "/v1/send", SEND_BODY, 32),
                "heartbeat": ("heartbeats", st.reach.url + "/v1/heartbeat", HEARTBEAT_BODY, 32),
            }
            for name in http:
                prefix, url, body, conns = loads[name]
                if args.profile == "always" or (
                    args.profile == "auto" and any(m.startswith(prefix) for m in missed)
                ):
                    print(f"== profile {name}", flush=True)
                    title = (
                        f"Agent-Reach gateway, POST /v1/{url.rsplit('/', 1)[1]} at {conns} "
                        "connection(s) (py-spy)"
                    )
                    rep.profiles[title] = profile(st.reach.pid, url, body, conns, cores)
    if "ladder" in selected:
        print("== ladder", flush=True)
        bench_ladder(args, rep, cores)
    if "tokens" in selected:
        with auth_stack(cores) as ast:
            print("== tokens", flush=True)
            bench_tokens(args, rep, ast, cores)
    if "redis" in selected:
        print("== redis", flush=True)
        bench_redis(args, rep, cores)
    if "nats" in selected:
        print("== nats", flush=True)
        bench_nats(args, rep, cores)
    if "a2a" in selected:
        print("== a2a", flush=True)
        bench_a2a(args, rep, cores)
    if "federation" in selected:
        print("== federation", flush=True)
        bench_federation(args, rep, cores)
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    meta["quiet_wait_s"] = round(QUIET.waited_s, 1)
    meta["noisy_reruns"] = QUIET.reruns
    rep.notes.append(
        f"the run took {meta['elapsed_s']} s, {meta['quiet_wait_s']} s of it waiting for other "
        f"processes to leave the CPUs alone; {QUIET.reruns} noisy run(s) measured again."
    )
    text = render(rep, meta)
    (OUT / "latest.md").write_text(text)
    verdicts = [{"target": n, "met": ok, "value": d} for n, ok, d in rep.verdicts]
    payload = {"meta": meta, "verdicts": verdicts, "data": rep.data, "profiles": rep.profiles}
    (OUT / "latest.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False))
    print()
    print(text)
    print(f"written: {OUT / 'latest.md'}, {OUT / 'latest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
