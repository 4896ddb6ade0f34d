"""Scenario 15: hostile input, each part while a legitimate caller sends 50 requests a second to
a fast agent: its p99 must stay within 1.5x its quiet p99, and the gateway's memory bounded.

The quiet and the hostile phases take turns on the same gateway, under one legitimate load
(:func:`interleaved`: rounds of a quiet phase and a hostile one, in the order QH HQ QH ...), and
the figure is the p99 of every hostile phase's legitimate requests against that of every quiet
phase's: a spell of the machine's own noise (a two-core VM's neighbours) then falls on both
sides, not on one, and each side's p99 is a pool of several phases' samples.

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
import math
import random
import resource
import socket
import string
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest

from agent_reach.settings import GatewaySettings
from tests.chaos.support import (
    FULL,
    Load,
    Phases,
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
    take_turns,
    worst,
)
from tests.fuzz_support import ROUTING_5XX
from tests.support import Proc, gateway, http

LEGIT = "legit.echo"
RATE = 50
ALLOWED_5XX = {**ROUTING_5XX, 503: {*ROUTING_5XX[503], "overloaded"}}


def legit(gw: Proc, seconds: float) -> Load:
    """The legitimate caller's load, started."""
    return Load(gw.url, echo(LEGIT, timeout_ms=3000), rate=RATE, duration=seconds).start()


ROUNDS = pick(2, 5)
PHASE_S = pick(1.0, 6.0)  # each phase; full: ~300 legitimate requests a phase, 1,500 a side
# a quiet phase's first second is not counted: requests started as the hostile phase before it
# ended may still be answered in its wake, and work it left queued may still run (the matcher
# starts a build up to 0.5 s after the last change). A conservative cut: the quiet side quiet.
# Smoke: a quarter of its 1 s phases (no more of them to spare; its bound is a loose one)
QUIET_WAKE_S = pick(0.25, 1.0)


def p99(results: list[Sent]) -> float:
    return pct(latencies(results), 99)


def interleaved(gw: Proc, hostile: Callable[[int], float | None], rounds: int = ROUNDS) -> Phases:
    """Rounds of a quiet phase (:data:`PHASE_S`) and a hostile one (``hostile(round)``, which
    returns when its phase is over: with the instant it began when that was not at the call,
    say after a helper process of the test's started), in the order QH HQ QH ..., under one
    legitimate load; each request counted in the phase it started in."""

    def quiet(_: int) -> tuple[float, float]:
        began = time.monotonic()
        time.sleep(PHASE_S)  # the quiet phase is a measuring window: nothing to wait for
        return began + QUIET_WAKE_S, time.monotonic()

    def loud(r: int) -> tuple[float, float]:
        called = time.monotonic()
        began = hostile(r)
        return called if began is None else began, time.monotonic()

    load = legit(gw, 3600)
    try:
        windows = take_turns(rounds, quiet, loud)
    except BaseException:
        load.stop()
        load.join()  # the driver ended and its files gone, whatever the test does next
        raise
    load.stop()
    phases = Phases.split(load.join(), windows)
    # every legitimate request must succeed, counted in a window or not (a quiet phase's
    # first second, a hostile one's set-up)
    failed = errors(phases.sent)
    assert not failed, failed
    return phases


def judge(quiet: list[Sent], loud: list[Sent]) -> tuple[float, float, float]:
    """The quiet and the loud p99 and their ratio; every request of them must succeed."""
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
        rss_before = rss_mb(gw.popen.pid)
        # every route visited once before the fuzz: a first visit builds what the gateway
        # builds lazily (the MCP server at the first /mcp request, docs/mcp.md), a one-time
        # cost any first client pays; measured apart from what the fuzz costs
        visits = legit(gw, 3600)
        try:
            visited = time.monotonic()
            for method, path in routes:
                url = gw.url + path.replace("{name}", "x").replace("{trace_id}", "x")
                http(method, url, raw=None if method == "GET" else b"{}", timeout=15)
            visits_s = time.monotonic() - visited
        finally:
            visits.stop()
            visits.join()
        bad: list[tuple[str, str, int, Any]] = []
        statuses: Counter[int] = Counter()
        fuzz_s = 0.0

        def fuzz(_: int) -> None:  # a phase of fuzz: cases back to back for PHASE_S
            nonlocal fuzz_s
            began = time.monotonic()
            while time.monotonic() - began < PHASE_S:
                method, path, body = fuzz_case(rng, routes)
                code, answer = http(method, gw.url + path, raw=body, timeout=15)
                statuses[code] += 1
                if code >= 500:
                    error = answer.get("error") if isinstance(answer, dict) else None
                    if error not in ALLOWED_5XX.get(code, ()):
                        bad.append((method, path, code, str(answer)[:200]))
            fuzz_s += time.monotonic() - began

        phases = interleaved(gw, fuzz)
        rss_after = rss_mb(gw.popen.pid)
        assert http("GET", f"{gw.url}/healthz")[0] == 200
    cases = statuses.total()
    q, loud_p99, ratio = judge(phases.quiet, phases.loud)
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
            **phases.figures(),
            "phase_s": PHASE_S,
            "legit_worst_client_gateway_ms": worst(phases.loud),
            "fuzz_per_s": r3(cases / fuzz_s),
            "first_visits_s": r3(visits_s),
            "first_visits_legit_max_ms": r3(max(latencies(visits.results), default=0.0)),
            "rss_before_mb": r3(rss_before),
            "rss_after_mb": r3(rss_after),
        },
        {"bad_5xx": "0", "legit_p99_ratio": "<= 1.5"},
        met,
    )
    assert not bad, bad[:10]
    assert not errors(visits.results), errors(visits.results)
    # the fuzz ran, at about its usual pace: 1,100-1,400 cases a second on 2026-12-07 at
    # first, 510-570 later that day (the tree of the day before alike: the machine)
    assert cases >= pick(200, 10_000), cases
    if FULL:
        check_ratio(ratio, q, loud_p99)
    else:
        # two seconds of fuzz, 75-100 legitimate requests a side: the p99 is one
        # sample. The p90 still shows a route that costs the loop every time it is called.
        p90_quiet, p90_loud = pct(latencies(phases.quiet), 90), pct(latencies(phases.loud), 90)
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


@bounded(60, 300)
def test_15_a_thousand_idle_connections_under_1024_open_files() -> None:
    idle_count = 1000
    with open_files_limit(1024):
        started = gateway("--heartbeat-interval", "2")
        gw = started.__enter__()
    try:
        with legit_agent(gw):
            pid = gw.popen.pid
            host, port = gw.url.removeprefix("http://").split(":")
            socks: list[socket.socket] = []

            gone, closing_s = 0, math.nan

            def idle(r: int) -> None:  # a phase: 1,000 connections that never send a byte
                nonlocal gone, closing_s
                began = time.monotonic()
                for _ in range(idle_count):
                    socks.append(socket.create_connection((host, int(port)), timeout=5))
                time.sleep(max(0.0, began + PHASE_S - time.monotonic()))  # held
                if FULL and r == ROUNDS - 1 and r % 2 == 0:
                    # the last phase of the run: held until the gateway closes them, as it
                    # does connections silent for --idle-timeout (30 s), under measurement
                    while time.monotonic() - began < 45 and not all(closed(s) for s in socks):
                        time.sleep(0.5)
                    gone, closing_s = sum(closed(s) for s in socks), time.monotonic() - began
                while socks:
                    socks.pop().close()

            try:
                if FULL:
                    fill_trace_store(gw)  # its growth is the legitimate load's, not theirs
                rss_before, fds_before = rss_mb(pid), open_fds(pid)
                with Poller(lambda: (rss_mb(pid), open_fds(pid)), every=0.25) as usage:
                    phases = interleaved(gw, idle)
            finally:
                for s in socks:
                    s.close()
            healthy = http("GET", f"{gw.url}/healthz", timeout=5)[0] == 200
    finally:
        started.__exit__(None, None, None)
    q, loud_p99, ratio = judge(phases.quiet, phases.loud)
    peak_rss = max(v[0] for _, v in usage.samples)
    peak_fds = max(v[1] for _, v in usage.samples)
    met = healthy and ratio <= 1.5 and peak_rss - rss_before <= 50
    report(
        "15",
        "hostile: 1,000 idle connections, 1,024 open files",
        {
            "idle_connections": idle_count,
            "closed_by_gateway": gone,
            "s_opened_until_closed": r3(closing_s),
            "gateway_fds_before": fds_before,
            "gateway_fds_peak": peak_fds,
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            **phases.figures(),
            "phase_s": PHASE_S,
            "legit_worst_client_gateway_ms": worst(phases.loud),
            "rss_before_mb": r3(rss_before),
            "rss_peak_mb": r3(peak_rss),
        },
        {"legit_p99_ratio": "<= 1.5", "memory": "bounded (peak - before <= 50 MB)"},
        met,
    )
    assert healthy
    assert peak_fds < 1024
    assert peak_rss - rss_before <= 50
    if FULL:
        assert gone == idle_count, gone
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
    """The quiet phases have the 50,000 tags too: the hostile input is the flood. The p99
    before the tags were registered is reported beside (``legit_p99_ms_no_tags``)."""
    flags = ("--heartbeat-interval", "60", "--register-rate-limit", "0", "--matcher", matcher)
    with gateway(*flags) as gw, legit_agent(gw):
        pid = gw.popen.pid
        no_tags = legit(gw, pick(1.5, 10.0)).join()
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
        slow_gc_before = gc_pauses_over(gw, "0.01")
        flooded: list[Sent] = []

        def flood(_: int) -> float:  # a phase: 100 unknown intents a second
            load = Load(gw.url, UNKNOWN, rate=100, duration=PHASE_S).start()
            flooded.extend(load.join())
            return load.started_at  # its driver's start-up (a Python process) not counted

        phases = interleaved(gw, flood)
        rss_after = rss_mb(pid)
        slow_gc = gc_pauses_over(gw, "0.01") - slow_gc_before
    q, loud_p99, ratio = judge(phases.quiet, phases.loud)
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
            "legit_p99_ms_no_tags": r3(p99(no_tags)),
            "legit_quiet_p99_ms": r3(q),
            "legit_p99_ms_flood": r3(loud_p99),
            "legit_p99_ratio": r3(ratio),
            # against the p99 before the tags (not interleaved): what the registrations' own
            # work (the matcher's index builds) and the flood cost together
            "legit_p99_ratio_to_no_tags": r3(loud_p99 / p99(no_tags)),
            **phases.figures(),
            "phase_s": PHASE_S,
            "legit_worst_client_gateway_ms": worst(phases.loud),
            "rss_before_mb": r3(rss_before),
            "rss_after_mb": r3(rss_after),
            "gc_pauses_over_10ms": slow_gc,  # the collector's, during the phases (F20)
        },
        {"legit_p99_ratio": "<= 1.5 (flood vs no flood, both at 50,000 tags)"},
        met,
    )
    assert not errors(no_tags), errors(no_tags)
    answered = sum(1 for s in flooded if s.status)
    assert answered >= ROUNDS * PHASE_S * 100 * 0.9, answered  # the flood went, and was answered
    # the flood is refused as it should be: no tag that close, or the matcher busy
    assert set(flood_codes) <= {"no_capable_agent", "overloaded", "deadline_exceeded"}
    check_ratio(ratio, q, loud_p99)


# --- metric labels -------------------------------------------------------------------------


def metrics_text(gw: Proc) -> str:
    code, text = http("GET", f"{gw.url}/metrics", timeout=10)
    assert code == 200
    return str(text)


def metric_lines(gw: Proc) -> int:
    return sum(1 for line in metrics_text(gw).splitlines() if line and not line.startswith("#"))


def gc_pauses_over(gw: Proc, bound: str) -> int:
    """The gateway's collections so far (every generation) that stopped it longer than
    ``bound``, a bucket bound of ``agent_reach_gc_pause_seconds`` ("0.01": 10 ms)."""
    within = total = 0.0
    for line in metrics_text(gw).splitlines():
        if line.startswith("agent_reach_gc_pause_seconds_bucket{") and f'le="{bound}"' in line:
            within += float(line.split()[-1])
        elif line.startswith("agent_reach_gc_pause_seconds_count{"):
            total += float(line.split()[-1])
    return int(total - within)


TRACE_CAPACITY = GatewaySettings().trace_capacity  # the trace store's bound (docs/operations.md)


def traces_kept(gw: Proc) -> int:
    for line in metrics_text(gw).splitlines():
        if line.startswith("agent_reach_trace_store_traces "):
            return int(float(line.split()[1]))
    raise AssertionError("no agent_reach_trace_store_traces in /metrics")


def fill_trace_store(gw: Proc) -> None:
    """Legitimate requests, 8 callers at once, until the trace store holds its bound: from
    there on it only replaces traces, and the RSS no longer grows with the requests sent
    (~5 KB a trace: 10,000 of them are more than the churn's own growth by far)."""
    for _ in range(30):  # bounded: ~1,000 requests a second, 10,000 needed
        if traces_kept(gw) >= TRACE_CAPACITY:
            return
        Load(gw.url, echo(LEGIT, timeout_ms=3000), callers=8, duration=2.0).start().join()
    kept = traces_kept(gw)
    assert kept >= TRACE_CAPACITY, f"the trace store holds {kept} traces after 60 s of load"


@bounded(60, 300)
def test_15_metric_labels_under_register_deregister_cycles() -> None:
    flags = ("--heartbeat-interval", "60", "--register-rate-limit", "0")
    with gateway(*flags) as gw, legit_agent(gw) as agent:
        pid = gw.popen.pid
        if FULL:
            fill_trace_store(gw)
        rss_before, lines_before = rss_mb(pid), metric_lines(gw)
        slow_gc_before = gc_pauses_over(gw, "0.01")
        sizes: list[int] = []
        # 5,000 cycles in all (full), as fast as they go: ~2 s of each hostile phase; the
        # memory's bound below is for that many (they fill the trace store's 10,000 past it)
        cycles, per_phase = 0, pick(150, 1000)

        def churn(_: int) -> None:  # a phase: cycles back to back, a new tag each
            nonlocal cycles
            began, until = time.monotonic(), cycles + per_phase
            while cycles < until and time.monotonic() - began < PHASE_S:
                name, tag = f"agent://churn-{cycles:05d}", f"churn.t{cycles}"
                record = {"endpoint_id": name, "capabilities": [tag], "endpoint_url": agent.url}
                assert http("POST", f"{gw.url}/v1/register", record)[0] == 200
                code, answer = http("POST", f"{gw.url}/v1/send", {"intent": tag})
                assert code == 200, answer
                assert http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": name})[0] == 200
                cycles += 1
            sizes.append(metric_lines(gw))

        phases = interleaved(gw, churn)
        rss_after, lines_after = rss_mb(pid), metric_lines(gw)
        slow_gc = gc_pauses_over(gw, "0.01") - slow_gc_before
    q, loud_p99, ratio = judge(phases.quiet, phases.loud)
    growth = lines_after - lines_before
    # full: after the trace store is full, what the churn adds: ~160 bytes a cycle measured
    # (the exact matches kept, bounded at 65,536 tags), 10 MB fails a leak of 2 KB a cycle.
    # Smoke: from a cold gateway (its first requests' pools and the matcher's model, its
    # traces): a loose bound, the full run's is the figure
    rss_bound = pick(60, 10)
    met = ratio <= 1.5 and growth <= 200 and rss_after - rss_before <= rss_bound
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
            **phases.figures(),
            "phase_s": PHASE_S,
            "legit_worst_client_gateway_ms": worst(phases.loud),
            # the collector's pauses of more than 10 ms meanwhile (F20: a full one was 47-77 ms
            # with the trace store's events tracked)
            "gc_pauses_over_10ms": slow_gc,
        },
        {
            "metric_lines": "bounded (<= +200)",
            "rss": f"<= +{rss_bound} MB" + (" (trace store full)" if FULL else ""),
            "legit_p99_ratio": "<= 1.5",
        },
        met,
    )
    assert cycles >= pick(20, 4000), cycles  # the churn ran, at about its usual pace
    assert growth <= 200, sizes
    assert rss_after - rss_before <= rss_bound, (rss_before, rss_after)
    check_ratio(ratio, q, loud_p99)
