"""Scenario 15: hostile input, each part while a legitimate caller sends 50 requests a second to
a fast agent: its p99 must stay within 1.5x its quiet p99 (the same gateway before the hostile
part), and the gateway's memory bounded.

- the fuzz of every route (those of ``/openapi.json``, ``/mcp``, ``/a2a``, the agent card, and
  wrong methods): random bodies, broken valid ones, random bytes, random query strings; zero 5xx
  but the routing outcomes (tests/fuzz_support.py) and ``overloaded``;
- 1,000 idle connections that never send a request, to a gateway started under a 1,024
  open-files limit (the issue's finding: it stopped answering);
- floods of unknown intents (a new one each time, so no cache helps) at 50,000 registered tags,
  with the default matcher (semantic) and the lexical one;
- register/deregister cycles with a new tag each (and a request to it): ``/metrics`` stays
  bounded.
"""

from __future__ import annotations

import json
import random
import resource
import socket
import string
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest

from tests.chaos.support import (
    FULL,
    Load,
    Poller,
    Sent,
    bounded,
    chaos_agent,
    echo,
    errors,
    full_only,
    latencies,
    open_fds,
    pct,
    pick,
    r3,
    report,
    rss_mb,
    stopping,
)
from tests.fuzz_support import ROUTING_5XX
from tests.support import Proc, gateway, http

LEGIT = "legit.echo"
RATE = 50
ALLOWED_5XX = {**ROUTING_5XX, 503: {*ROUTING_5XX[503], "overloaded"}}


def legit(gw: Proc, seconds: float) -> Load:
    """The legitimate caller's load, started."""
    return Load(gw.url, echo(LEGIT, timeout_ms=3000), rate=RATE, duration=seconds).start()


def p99(results: list[Sent]) -> float:
    return pct(latencies(results), 99)


def worst(results: list[Sent], n: int = 5) -> list[list[float | None]]:
    """The ``n`` slowest requests as ``[client ms, gateway ms]``: what the gateway's own
    ``latency_ms`` does not cover was spent in the sockets, the kernel or the client."""
    slowest = sorted(results, key=lambda s: s.latency_ms, reverse=True)[:n]
    return [[r3(s.latency_ms), None if s.gateway_ms is None else r3(s.gateway_ms)] for s in slowest]


def judge(quiet: list[Sent], loud: list[Sent]) -> tuple[float, float, float]:
    """The quiet and the loud p99 and their ratio; every legitimate request must succeed."""
    failed = errors(quiet) + errors(loud)
    assert not failed, failed
    q, loud_p99 = p99(quiet), p99(loud)
    return q, loud_p99, loud_p99 / q


def check_ratio(ratio: float, quiet: float, loud: float) -> None:
    """Full: the goal (<= 1.5x). Smoke, seconds long on a shared machine: within 5x + 20 ms,
    which the issue's finding (p50 from 2.5 ms to 101 ms) would still fail."""
    if FULL:
        assert ratio <= 1.5, (quiet, loud)
    else:
        assert loud <= 5 * quiet + 20, (quiet, loud)


@contextmanager
def legit_agent(gw: Proc) -> Iterator[Proc]:
    with stopping([chaos_agent(gw.url, "agent://legit-00", intents=LEGIT)]) as procs:
        yield procs[0]


# --- the fuzz ------------------------------------------------------------------------------

FIELDS = [
    *("endpoint_id", "capabilities", "endpoint_url", "description", "intent", "intent_text"),
    *("payload", "timeout_ms", "priority", "recipient_hint", "fallback", "msg_id", "trace_id"),
    *("sender", "a2a_card_url", "jsonrpc", "method", "params", "id", "kind", "subject", "ttl_s"),
]
QUERY_KEYS = [
    *("intent", "recipient_hint", "timeout_ms", "limit", "cursor", "status", "intent_text"),
    "fallback",
]


def junk(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**63, -(2**70), 10**30, 1e308, 0.5])
    if kind in (3, 4):
        alphabet = string.printable + "é成都\u0000\ud7ff\u202e"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
    if kind == 5:
        return rng.choice(["agent://fuzz-01", "fuzz.echo", "http://127.0.0.1:9/x", "nats:x"])
    if kind == 6:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FIELDS): junk(rng, depth + 1) for _ in range(rng.randrange(5))}


def fuzz_case(rng: random.Random, routes: list[tuple[str, str]]) -> tuple[str, str, bytes | None]:
    method, path = rng.choice(routes)
    if rng.random() < 0.15:
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH"])
    path = path.replace("{name}", quote(str(junk(rng)), safe=""))
    path = path.replace("{trace_id}", quote(str(junk(rng)), safe=""))
    if rng.random() < 0.5:
        pairs = [
            f"{rng.choice(QUERY_KEYS)}={quote(str(junk(rng)), safe='')}"
            for _ in range(rng.randrange(1, 4))
        ]
        path += "?" + "&".join(pairs)
    body: bytes | None = None
    if method != "GET":
        how = rng.randrange(4)
        if how == 0:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        elif how == 3:
            body = b""
        else:
            try:
                body = json.dumps(junk(rng)).encode()
            except ValueError:  # a number too big for JSON's float: send it as bytes
                body = b"1e999"
    return method, path, body


@bounded(60, 300)
def test_15_fuzz_every_route() -> None:
    cases = pick(400, 20_000)  # full: ~15 s of fuzz, so that the p99 is not one sample
    rng = random.Random(15)
    flags = ("--heartbeat-interval", "2", "--endpoint-networks", "127.0.0.0/8")
    with gateway(*flags) as gw, legit_agent(gw):
        _, doc = http("GET", f"{gw.url}/openapi.json")
        routes = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
        routes += [
            ("POST", "/mcp"),
            ("GET", "/mcp"),
            ("POST", "/a2a"),
            ("GET", "/.well-known/agent-card.json"),
            ("GET", "/nowhere"),
        ]
        quiet = legit(gw, pick(1.5, 10.0)).join()
        rss_before = rss_mb(gw.popen.pid)
        load = legit(gw, 3600)
        bad: list[tuple[str, str, int, Any]] = []
        statuses: Counter[int] = Counter()
        try:
            # every route visited once before the fuzz: a first visit builds what the gateway
            # builds lazily (the MCP server at the first /mcp request, docs/mcp.md), a one-time
            # cost any first client pays; measured apart from what the fuzz costs
            visits = time.monotonic()
            for method, path in routes:
                url = gw.url + path.replace("{name}", "x").replace("{trace_id}", "x")
                http(method, url, raw=None if method == "GET" else b"{}", timeout=15)
            fuzzing = time.monotonic()
            for _ in range(cases):
                method, path, body = fuzz_case(rng, routes)
                code, answer = http(method, gw.url + path, raw=body, timeout=15)
                statuses[code] += 1
                if code >= 500:
                    error = answer.get("error") if isinstance(answer, dict) else None
                    if error not in ALLOWED_5XX.get(code, ()):
                        bad.append((method, path, code, str(answer)[:200]))
            fuzz_s = time.monotonic() - fuzzing
        finally:
            load.stop()
        sent = load.join()
        rss_after = rss_mb(gw.popen.pid)
        assert http("GET", f"{gw.url}/healthz")[0] == 200
    first = [r for r in sent if r.start < fuzzing]
    loud = [r for r in sent if r.start >= fuzzing]
    q, loud_p99, ratio = judge(quiet, loud)
    met = not bad and ratio <= 1.5
    report(
        "15",
        "hostile: the fuzz of every route",
        {
            "cases": cases,
            "routes": len(routes),
            "statuses": dict(sorted(statuses.items())),
            "bad_5xx": len(bad),
            "bad_examples": bad[:5],
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            "legit_worst_client_gateway_ms": worst(loud),
            "legit_during_fuzz": len(loud),
            "fuzz_per_s": r3(cases / fuzz_s),
            "first_visits_s": r3(fuzzing - visits),
            "first_visits_legit_max_ms": r3(max(latencies(first), default=0.0)),
            "rss_before_mb": r3(rss_before),
            "rss_after_mb": r3(rss_after),
        },
        {"bad_5xx": "0", "legit_p99_ratio": "<= 1.5"},
        met,
    )
    assert not bad, bad[:10]
    if FULL:
        check_ratio(ratio, q, loud_p99)
    else:
        # a fraction of a second of fuzz, 10-15 legitimate requests: the p99 is one
        # sample. The p90 still shows a route that costs the loop every time it is called.
        p90_quiet, p90_loud = pct(latencies(quiet), 90), pct(latencies(loud), 90)
        assert p90_loud <= 5 * p90_quiet + 20, (p90_quiet, p90_loud)


# --- idle connections ----------------------------------------------------------------------


@contextmanager
def open_files_limit(limit: int) -> Iterator[None]:
    """This process's soft open-files limit lowered to ``limit`` (children started meanwhile
    inherit it), the old one back afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def closed(sock: socket.socket) -> bool:
    """Whether the gateway closed ``sock`` (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@bounded(60, 240)
def test_15_a_thousand_idle_connections_under_1024_open_files() -> None:
    idle_count, held = 1000, pick(2.5, 40.0)
    with open_files_limit(1024):
        started = gateway("--heartbeat-interval", "2")
        gw = started.__enter__()
    try:
        with legit_agent(gw):
            pid = gw.popen.pid
            host, port = gw.url.removeprefix("http://").split(":")
            quiet = legit(gw, pick(1.5, 10.0)).join()
            rss_before, fds_before = rss_mb(pid), open_fds(pid)
            socks: list[socket.socket] = []
            try:
                with Poller(lambda: (rss_mb(pid), open_fds(pid)), every=0.25) as usage:
                    load = legit(gw, held + 2)
                    for _ in range(idle_count):  # they never send a byte
                        socks.append(socket.create_connection((host, int(port)), timeout=5))
                    loud = load.join()
                gone = sum(closed(s) for s in socks)
            finally:
                for s in socks:
                    s.close()
            healthy = http("GET", f"{gw.url}/healthz", timeout=5)[0] == 200
    finally:
        started.__exit__(None, None, None)
    q, loud_p99, ratio = judge(quiet, loud)
    peak_rss = max(v[0] for _, v in usage.samples)
    peak_fds = max(v[1] for _, v in usage.samples)
    met = healthy and ratio <= 1.5 and peak_rss - rss_before <= 50
    report(
        "15",
        "hostile: 1,000 idle connections, 1,024 open files",
        {
            "idle_connections": idle_count,
            "held_s": held,
            "closed_by_gateway": gone,
            "gateway_fds_before": fds_before,
            "gateway_fds_peak": peak_fds,
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            "legit_worst_client_gateway_ms": worst(loud),
            "rss_before_mb": r3(rss_before),
            "rss_peak_mb": r3(peak_rss),
        },
        {"legit_p99_ratio": "<= 1.5", "memory": "bounded (peak - before <= 50 MB)"},
        met,
    )
    assert healthy
    assert peak_fds < 1024
    assert peak_rss - rss_before <= 50
    check_ratio(ratio, q, loud_p99)


# --- unknown intents at 50,000 tags --------------------------------------------------------

TAGS = 50_000
PER_ENDPOINT = 250  # the most capabilities one registration may declare is 256


# a new tag each time: no cache of the matcher's answers helps
UNKNOWN = [{"intent": "flood.q{i}.unknown", "timeout_ms": 2000, "_kind": "flood"}]


@bounded(60, 300)
# semantic: full run only; the index of 50,000 tags takes that matcher over ten minutes of a
# core to build (it never finishes within the test), too heavy for `make test`
@pytest.mark.parametrize("matcher", [pytest.param("semantic", marks=full_only), "lexical"])
def test_15_unknown_intent_flood_at_50000_tags(matcher: str) -> None:
    quiet_s, tagged_s, flood_s = pick((1.5, 1.0, 2.5), (10.0, 10.0, 30.0))
    flags = ("--heartbeat-interval", "60", "--register-rate-limit", "0", "--matcher", matcher)
    with gateway(*flags) as gw, legit_agent(gw):
        pid = gw.popen.pid
        quiet = legit(gw, quiet_s).join()
        rss_before = rss_mb(pid)
        started = time.monotonic()
        for e in range(TAGS // PER_ENDPOINT):
            caps = [f"hostile.t{e}.c{c}" for c in range(PER_ENDPOINT)]
            record = {
                "endpoint_id": f"agent://tags-{e:03d}",
                "capabilities": caps,
                "endpoint_url": "http://127.0.0.1:9/reach",
            }
            code, answer = http("POST", f"{gw.url}/v1/register", record, timeout=30)
            assert code == 200, answer
        registering = time.monotonic() - started
        tagged = legit(gw, tagged_s).join()
        load = legit(gw, flood_s)
        flood = Load(gw.url, UNKNOWN, rate=100, duration=flood_s).start()
        loud, flooded = load.join(), flood.join()
        rss_after = rss_mb(pid)
    q, loud_p99, ratio = judge(quiet, loud)
    flood_codes = Counter(s.error or "ok" for s in flooded)
    met = ratio <= 1.5
    report(
        "15",
        f"hostile: unknown-intent flood at {TAGS:,} tags ({matcher} matcher)",
        {
            "matcher": matcher,
            "tags": TAGS,
            "s_to_register": r3(registering),
            "flood_per_s": 100,
            "flood_answers": dict(flood_codes),
            "flood_p50_ms": r3(pct(latencies(flooded), 50)),
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms_with_tags": r3(p99(tagged)),
            "legit_p99_ms_flood": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            "legit_worst_client_gateway_ms": worst(loud),
            "rss_before_mb": r3(rss_before),
            "rss_after_mb": r3(rss_after),
        },
        {"legit_p99_ratio": "<= 1.5 (flood vs no tags, no flood)"},
        met,
    )
    # the flood is refused as it should be: no tag that close, or the matcher busy
    assert set(flood_codes) <= {"no_capable_agent", "overloaded", "deadline_exceeded"}
    check_ratio(ratio, q, loud_p99)


# --- metric labels -------------------------------------------------------------------------


def metric_lines(gw: Proc) -> int:
    code, text = http("GET", f"{gw.url}/metrics", timeout=10)
    assert code == 200
    return sum(1 for line in str(text).splitlines() if line and not line.startswith("#"))


@bounded(60, 300)
def test_15_metric_labels_under_register_deregister_cycles() -> None:
    cycles = pick(300, 5000)
    flags = ("--heartbeat-interval", "60", "--register-rate-limit", "0")
    with gateway(*flags) as gw, legit_agent(gw) as agent:
        pid = gw.popen.pid
        quiet = legit(gw, pick(1.5, 10.0)).join()
        rss_before, lines_before = rss_mb(pid), metric_lines(gw)
        load = legit(gw, 3600)
        sizes = []
        try:
            for i in range(cycles):
                name, tag = f"agent://churn-{i:05d}", f"churn.t{i}"
                record = {"endpoint_id": name, "capabilities": [tag], "endpoint_url": agent.url}
                assert http("POST", f"{gw.url}/v1/register", record)[0] == 200
                code, answer = http("POST", f"{gw.url}/v1/send", {"intent": tag})
                assert code == 200, answer
                assert http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": name})[0] == 200
                if i % max(1, cycles // 5) == 0:
                    sizes.append(metric_lines(gw))
        finally:
            load.stop()
        loud = load.join()
        rss_after, lines_after = rss_mb(pid), metric_lines(gw)
    q, loud_p99, ratio = judge(quiet, loud)
    growth = lines_after - lines_before
    met = ratio <= 1.5 and growth <= 200 and rss_after - rss_before <= 30
    report(
        "15",
        f"hostile: {cycles} register/deregister cycles, a new tag each",
        {
            "cycles": cycles,
            "metric_lines_before": lines_before,
            "metric_lines_during": sizes,
            "metric_lines_after": lines_after,
            "rss_before_mb": r3(rss_before),
            "rss_after_mb": r3(rss_after),
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            "legit_worst_client_gateway_ms": worst(loud),
        },
        {"metric_lines": "bounded (<= +200)", "rss": "<= +30 MB", "legit_p99_ratio": "<= 1.5"},
        met,
    )
    assert growth <= 200, sizes
    assert rss_after - rss_before <= 30
    check_ratio(ratio, q, loud_p99)
