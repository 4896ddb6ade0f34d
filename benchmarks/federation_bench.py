"""Federation's costs, the pieces of ``run.py federation``: what a forward adds to a request, and
what a domain's summary of 1,000 intents weighs and costs to publish.

The stack (``stack``): a directory (``python -m agent_reach directory --port 0``) on the load
core; two gateways on the gateway core, both ``serve --port 0 --matcher none
--heartbeat-interval 3600 --log-level WARNING --directory URL --summary-interval 2``: A
(``--domain a``, no agents) and B (``--domain b``); the trivial agent (``trivial_agent.py``) on
the load core, registered at B only, for ``bench.echo``. The stack is up once A holds a fresh,
reachable summary of b offering the tag. The same send, ``POST /v1/send {"intent":
"bench.echo", "payload": {"n": 1}}``, two ways, measured alternately by ``run.py``'s ``_rotate``
at 1 and at 32 connections:

- ``local``: to B, which delivers to its agent;
- ``forwarded``: to A, which has no agent for the tag and forwards to B (``POST {B}/v1/send``,
  ``X-Reach-Hops: 1``); the answer names ``agent://bench-agent@b``.

The summary's costs (``summary_costs``, after the rounds, with processes of its own: a
directory answer carrying 1,000 tags never reaches A or B):

- in process, pinned to the gateway core: a ``Router`` with 1,000 endpoints registered through
  ``Router.register`` (bodies decoded as the HTTP edge does), one tag each, each with
  ``HISTORY`` answered deliveries recorded through ``attempt_started`` / ``attempt_finished``
  (so that every tag has a p95, as a domain that serves has); ``build_summary`` over it as the
  gateway calls it (``Node._summary``): its first call (tier caches cold), then ``timeit``
  (``BUILD_NUMBER`` calls a repeat, ``BUILD_REPEATS`` repeats, the median of the repeats); the
  msgspec encoding (as ``Membership.publish`` does) and its bytes;
- ``PUT /v1/summaries/bench`` of that body to a directory process that holds nothing else:
  ``PUT_TRIALS`` round trips on one keep-alive connection (http.client, after one unmeasured),
  median and p99; the answer is an empty list;
- through a real gateway: S (``--domain s``, ``--summary-interval 0.5``,
  ``--register-rate-limit 0``) joined to another empty directory, 1,000 endpoints registered
  at it over HTTP (``POST /v1/register``, one tag each, no deliveries: p95 null), then
  ``GET /v1/federation``'s ``summary.bytes`` and ``summary.publish_ms`` (building, encoding,
  the PUT and reading the answer, as the gateway times it) of ``PUBLICATIONS`` publications
  begun after the last registration; then the same ``PUT_TRIALS`` PUTs to that directory,
  whose answer now carries S's 1,000 tags.

Invariants:
- CPU per request from /proc deltas: B's for local, A's + B's for forwarded (each kept alone
  too), and how busy the gateway core was (A + B over the run's wall time).
- Errors: a non-200, a socket error or a body without ``"ok":true`` (wrk_post.lua) is an error,
  never throughput. ``SAMPLES`` answers of each path are parsed and checked when the stack is up
  and again after the rounds: local names ``agent://bench-agent`` with one attempt in no
  domain, forwarded ``agent://bench-agent@b`` with one attempt in domain b, both carry the
  agent's answer. The summaries are checked too (1,000 tags, each one healthy endpoint).
- A measured run waits for quiet and is measured once more when noisy (``harness.quiet_run``);
  so are the in-process timings and each batch of PUTs.
- Bounded: readiness polls ``READY_TIMEOUT_S``, a wrk run its duration + 30 s, each request
  10 s, every loop by count; every child is stopped on the way out of ``stack``, whatever
  happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import statistics
import time
import timeit
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from agent_reach.clock import SystemClock
from agent_reach.core.model import Outcome
from agent_reach.federation.summary import build_summary
from agent_reach.gateway.router import Router
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.wire.bodies import RegisterBody, decode
from agent_reach.wire.federation import DirectoryAnswer, DomainSummary
from harness import (
    CLK_TCK,
    HERE,
    PY,
    READY_TIMEOUT_S,
    Child,
    Cores,
    Rows,
    Run,
    Runs,
    all_jiffies,
    fmt,
    fmt_col,
    fmt_ms,
    fmt_ratio,
    fmt_signed,
    foreign_cpu,
    jiffies,
    med,
    paired,
    quiet_run,
    start_listening,
    steal_jiffies,
    wait_http,
    wrk,
)
from trivial_agent import BODY as AGENT_BODY

INTENT = "bench.echo"
AGENT_ID = "agent://bench-agent"
A, B = "a", "b"  # the forwarding domain (no agents) and the serving one
CONNS = (1, 32)  # one caller first: latency before load, as run.py orders its benchmarks
SUMMARY_INTERVAL_S = 2.0  # A's and B's --summary-interval: stale after 6 s
S_INTERVAL_S = 0.5  # S's: publications come quickly
SAMPLES = 3  # answers of each path parsed and checked before and after the rounds
N_TAGS = 1_000
HISTORY = 20  # answered deliveries recorded per endpoint of the in-process router
BUILD_NUMBER, BUILD_REPEATS = 20, 7  # timeit of build_summary and of its encoding
PUT_TRIALS = 200
PUT_DOMAIN = "bench"
NO_AGENT = "http://127.0.0.1:9/reach"  # the URL of the summaries' endpoints: never delivered to
PUBLICATIONS = 5  # S's publications read
POLL_S = 0.2  # the polling interval of S's /v1/federation, not a settle delay
AGENT_ANSWER: dict[str, Any] = json.loads(AGENT_BODY)
SEND_BODY = json.dumps({"intent": INTENT, "payload": {"n": 1}})
PATHS = ("local", "forwarded")
One = Callable[[str, int, bool], dict[str, Any]]  # (target, seconds, measured) -> figures
_encode = msgspec.json.Encoder().encode  # as Membership.publish encodes a summary
_answer = msgspec.json.Decoder(DirectoryAnswer)


def tags() -> list[str]:
    """The summary's 1,000 tags (the route benchmark's naming)."""
    return [f"svc{i // 10:03d}.op{i % 10}" for i in range(N_TAGS)]


# --- HTTP, from the runner ----------------------------------------------------------------------


class _Conn:
    """One keep-alive HTTP/1.1 connection to ``url``'s host and port, 10 s a request."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(
            parts.hostname or "127.0.0.1", parts.port, timeout=10
        )

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        self.conn.close()


def _get_json(url: str) -> Any:
    parts = urllib.parse.urlsplit(url)
    with contextlib.closing(_Conn(url)) as conn:
        status, raw = conn.request("GET", parts.path)
    if status != 200:
        raise RuntimeError(f"GET {url} answered HTTP {status}: {raw[:300]!r}")
    return json.loads(raw)


def _wait(what: str, ready: Callable[[], bool], timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``ready()`` until true, for at most ``timeout`` s; RuntimeError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.05)  # polling interval, not a settle delay
    raise RuntimeError(f"{what}: not within {timeout:g} s")


# --- the stack ----------------------------------------------------------------------------------


@dataclass
class FedStack:
    """The directory, gateways A and B, the agent at B (all started by ``stack``), the answers
    checked."""

    directory: Child
    a: Child
    b: Child
    agent: Child
    children: list[Child]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def pids(self) -> set[int]:
        """The benchmark's own processes (not counted as foreign CPU)."""
        return {c.pid for c in self.children}


def _serve(domain: str, directory: str, interval: float, *more: str) -> list[str]:
    cmd = [PY, "-m", "agent_reach", "serve", "--port", "0", "--matcher", "none"]
    cmd += ["--heartbeat-interval", "3600", "--log-level", "WARNING", "--domain", domain]
    return [*cmd, "--directory", directory, "--summary-interval", f"{interval:g}", *more]


def _directory(name: str, core: int | None, children: list[Child]) -> Child:
    cmd = [PY, "-m", "agent_reach", "directory", "--port", "0", "--log-level", "WARNING"]
    directory = start_listening(name, cmd, core, children)
    wait_http(directory.url + "/healthz")
    return directory


def _offers(gateway: Child, domain: str, tag: str) -> bool:
    """Whether ``gateway`` holds a fresh, reachable summary of ``domain`` offering ``tag``."""
    for peer in _get_json(gateway.url + "/v1/federation")["peers"]:
        if peer["domain"] == domain and not peer["stale"] and peer["reachable"]:
            counts = peer["intents"].get(tag) or {}
            return bool(counts.get("healthy", 0) + counts.get("degraded", 0) > 0)
    return False


def _problem(path: str, status: int, raw: bytes) -> str | None:
    """Why an answer of ``path`` (local, forwarded) is not the agent's answer reached that way."""
    if status != 200:
        return f"HTTP {status}"
    ans = json.loads(raw)
    if ans.get("ok") is not True:
        return "no ok: true"
    want = AGENT_ID if path == "local" else f"{AGENT_ID}@{B}"
    if ans.get("endpoint_id") != want:
        return f"reached {ans.get('endpoint_id')}, not {want}"
    if ans.get("result") != AGENT_ANSWER:
        return "the result is not the agent's answer"
    domains = [a.get("domain") for a in ans.get("attempts") or []]
    if domains != ([None] if path == "local" else [B]):
        return f"attempts in domains {domains}"
    return None


def check_answers(st: FedStack, when: str) -> dict[str, Any]:
    """``SAMPLES`` answers of each path, parsed and checked; RuntimeError on the first that is
    not right. Returns what was checked (one answer of each path kept for the report)."""
    kept: dict[str, Any] = {"when": when}
    for path in PATHS:
        gateway = st.b if path == "local" else st.a
        with contextlib.closing(_Conn(gateway.url)) as conn:
            for _ in range(SAMPLES):
                status, raw = conn.request("POST", "/v1/send", SEND_BODY.encode())
                try:
                    why = _problem(path, status, raw)
                except (ValueError, AttributeError, TypeError) as exc:
                    why = f"unreadable: {exc!r}"
                if why is not None:
                    raise RuntimeError(f"{path} answer {when} the rounds: {why}: {raw[:600]!r}")
        kept[path] = {"checked": SAMPLES, "answer": json.loads(raw)}
    return kept


@contextlib.contextmanager
def stack(cores: Cores) -> Iterator[FedStack]:
    """Start the directory, B, A and the agent (bounded readiness polls), wait until A knows
    that b offers the tag, check answers of both paths; on a normal exit check them again;
    stop every child on the way out, whatever happens."""
    gw_core, load_core = cores
    children: list[Child] = []
    try:
        directory = _directory("fed-directory", load_core, children)
        gws = {}
        for domain in (B, A):
            cmd = _serve(domain, directory.url, SUMMARY_INTERVAL_S)
            gws[domain] = start_listening(f"fed-gateway-{domain}", cmd, gw_core, children)
            wait_http(gws[domain].url + "/healthz")
        cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        cmd += ["--register", gws[B].url]
        agent = start_listening("agent-fed", cmd, load_core, children)
        _wait(f"gateway {A} learning that {B} offers {INTENT}", lambda: _offers(gws[A], B, INTENT))
        st = FedStack(directory, gws[A], gws[B], agent, children)
        st.samples.append(check_answers(st, "before"))
        yield st
        st.samples.append(check_answers(st, "after"))
    finally:
        for child in reversed(children):
            child.stop()


# --- measured runs ------------------------------------------------------------------------------


def _per_req(j0: int, j1: int, requests: int) -> float:
    return round((j1 - j0) / CLK_TCK * 1e6 / requests, 1)


def _wrk_once(st: FedStack, cores: Cores, path: str, conns: int) -> Callable[[int], Run]:
    """A wrk run of ``path`` that accounts A's and B's CPU: the gateways' CPU per request is
    B's (local) or A's + B's (forwarded)."""
    url = (st.b if path == "local" else st.a).url + "/v1/send"

    def once(seconds: int) -> Run:
        a0, b0 = jiffies(st.a.pid), jiffies(st.b.pid)
        r = wrk(
            url,
            SEND_BODY,
            conns,
            seconds,
            core=cores[1],
            gateway_pid=None,  # both gateways accounted here
            ours=st.pids(),
            measured=False,  # the quiet wait is ``targets``' (quiet_run)
        )
        a1, b1 = jiffies(st.a.pid), jiffies(st.b.pid)
        if r["requests"]:
            r["a_cpu_us_per_req"] = _per_req(a0, a1, r["requests"])
            r["b_cpu_us_per_req"] = _per_req(b0, b1, r["requests"])
            own = r["b_cpu_us_per_req"] + (r["a_cpu_us_per_req"] if path == "forwarded" else 0)
            r["gw_cpu_us_per_req"] = round(own, 1)
        r["core_busy_pct"] = round(
            (a1 - a0 + b1 - b0) * 100 / CLK_TCK / (r["duration_us"] / 1e6), 1
        )
        return r

    return once


def targets(conns: int, st: FedStack, cores: Cores) -> tuple[list[str], One]:
    """The target names (local, forwarded) at ``conns`` connections and how to run one, for
    ``_rotate``."""
    runs = {path: _wrk_once(st, cores, path, conns) for path in PATHS}

    def one(name: str, seconds: int, measured: bool) -> dict[str, Any]:
        return quiet_run(lambda: runs[name](seconds), st.pids(), measured)

    return list(PATHS), one


# --- the summary's costs ------------------------------------------------------------------------


def _window(ours: set[int], fn: Callable[[], Run]) -> Run:
    """``fn()``'s figures, plus the CPU that other processes and the hypervisor took meanwhile."""
    snap0, steal0, t0 = all_jiffies(), steal_jiffies(), time.monotonic()
    r = fn()
    elapsed = max(time.monotonic() - t0, 1e-9)
    snap1, steal1 = all_jiffies(), steal_jiffies()
    r["steal_pct"] = round((steal1 - steal0) * 100 / CLK_TCK / elapsed, 1)
    r["foreign_cpu_pct"], r["foreign_top"] = foreign_cpu(
        snap0, snap1, ours | {os.getpid()}, elapsed
    )
    return r


@contextlib.contextmanager
def _pinned(core: int | None) -> Iterator[None]:
    """This process on ``core`` only, meanwhile (None: left where it is)."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _register_body(i: int, tag: str, url: str) -> bytes:
    body = {"endpoint_id": f"agent://ep-{i:04d}", "capabilities": [tag], "endpoint_url": url}
    return json.dumps(body).encode()


def _check_summary(summary: DomainSummary, with_p95: bool) -> None:
    """RuntimeError unless ``summary`` holds the 1,000 tags, each one healthy endpoint (and a
    p95 when ``with_p95``): otherwise the figures would be of another summary."""
    wrong = [
        tag
        for tag in tags()
        if (c := summary.intents.get(tag)) is None
        or (c.healthy, c.degraded) != (1, 0)
        or (c.p95_ms is None) == with_p95
    ]
    if wrong or len(summary.intents) != N_TAGS:
        raise RuntimeError(
            f"the summary has {len(summary.intents)} tags, {len(wrong)} of the expected ones "
            f"missing or not one healthy endpoint{' with a p95' if with_p95 else ''}: {wrong[:3]}"
        )


async def _router_with_history(rng: random.Random) -> Router:
    """A router with 1,000 endpoints, one tag each, each with ``HISTORY`` answered deliveries."""
    router = Router(
        GatewaySettings(heartbeat_interval=3600), MemoryRegistry(), SystemClock(), rng=rng
    )
    for i, tag in enumerate(tags()):
        record = await router.register(decode(_register_body(i, tag, NO_AGENT), RegisterBody))
        for _ in range(HISTORY):
            stats = router.attempt_started(record.endpoint_id)
            latency_ms = rng.uniform(2.0, 40.0)
            router.attempt_finished(
                record.endpoint_id, stats, Outcome.OK, latency_ms, reached=True, eject=False
            )
    return router


def _timeit_us(fn: Callable[[], object]) -> list[float]:
    """µs per call of ``fn``, one figure per repeat (timeit: the garbage collector off)."""
    totals = timeit.repeat(fn, number=BUILD_NUMBER, repeat=BUILD_REPEATS)
    return [round(t / BUILD_NUMBER * 1e6, 2) for t in totals]


def _in_process(ours: set[int], core: int | None) -> tuple[Run, bytes]:
    """The in-process figures of the 1,000-tag summary, and its body (domain ``PUT_DOMAIN``)."""

    async def measure() -> tuple[Run, bytes]:
        router = await _router_with_history(random.Random(7))
        registry = router.registry

        def summarize() -> DomainSummary:
            # what Node._summary does, every --summary-interval
            return build_summary(
                PUT_DOMAIN,
                "http://127.0.0.1:9",
                time.time(),
                list(registry.intents()),
                router.tiers_of,
                router.stats,
            )

        t0 = time.perf_counter_ns()
        first = summarize()
        first_us = (time.perf_counter_ns() - t0) / 1000
        _check_summary(first, with_p95=True)
        body = _encode(first)

        def once() -> Run:
            build = _timeit_us(summarize)
            encode = _timeit_us(lambda: _encode(first))
            return {
                "build_us": statistics.median(build),
                "encode_us": statistics.median(encode),
                "build_repeats_us": build,
                "encode_repeats_us": encode,
            }

        with _pinned(core):
            r = quiet_run(lambda: _window(ours, once), ours, True)
        r |= {"first_build_us": round(first_us, 1), "bytes": len(body), "tags": N_TAGS}
        return r, body

    return asyncio.run(measure())


def _puts(ours: set[int], directory: Child, body: bytes, expect: set[str]) -> Run:
    """``PUT_TRIALS`` round trips of ``PUT /v1/summaries/PUT_DOMAIN`` with ``body`` on one
    keep-alive connection (after one unmeasured); the last answer must be a directory answer
    of the domains ``expect``."""
    path = f"/v1/summaries/{PUT_DOMAIN}"

    def once() -> Run:
        samples: list[float] = []
        with contextlib.closing(_Conn(directory.url)) as conn:
            status, raw = conn.request("PUT", path, body)  # the connection opened, unmeasured
            for _ in range(PUT_TRIALS):
                t0 = time.perf_counter_ns()
                status, raw = conn.request("PUT", path, body)
                samples.append((time.perf_counter_ns() - t0) / 1e6)
                if status != 200:
                    raise RuntimeError(f"PUT {path} answered HTTP {status}: {raw[:300]!r}")
        domains = {s.domain for s in _answer.decode(raw).summaries}
        if domains != expect:
            raise RuntimeError(f"the directory answered summaries of {domains}, not {expect}")
        samples.sort()
        return {
            "p50_ms": round(statistics.median(samples), 3),
            "p99_ms": round(samples[min(len(samples) - 1, int(0.99 * len(samples)))], 3),
            "min_ms": round(samples[0], 3),
            "trials": len(samples),
            "answer_bytes": len(raw),
        }

    return quiet_run(lambda: _window(ours, once), ours, True)


def _through_gateway(cores: Cores, children: list[Child]) -> tuple[Run, Child]:
    """Gateway S with 1,000 registrations, joined to a directory of its own (empty): the bytes
    and publish_ms of ``PUBLICATIONS`` publications begun after the last registration, as its
    ``GET /v1/federation`` says. Returns them and S's directory (both added to ``children``)."""
    directory = _directory("fed-directory-s", cores[1], children)
    # 1,000 registrations from one address in a second or two: over the default rate limit
    cmd = _serve("s", directory.url, S_INTERVAL_S, "--register-rate-limit", "0")
    s = start_listening("fed-gateway-s", cmd, cores[0], children)
    wait_http(s.url + "/healthz")
    with contextlib.closing(_Conn(s.url)) as conn:
        for i, tag in enumerate(tags()):
            status, raw = conn.request("POST", "/v1/register", _register_body(i, tag, NO_AGENT))
            if status != 200:
                raise RuntimeError(f"register at S answered HTTP {status}: {raw[:300]!r}")
    registered = time.monotonic()
    seen: list[tuple[float, int, float]] = []  # (when it ended, bytes, publish_ms)
    own: dict[str, Any] = {}
    deadline = registered + READY_TIMEOUT_S
    while len(seen) < PUBLICATIONS and time.monotonic() < deadline:
        now = time.monotonic()
        fed = _get_json(s.url + "/v1/federation")
        own = fed["summary"] or {}
        if fed["directory_ok"] and own.get("age_s") is not None and own["publish_ms"]:
            ended = now - own["age_s"]
            began = ended - own["publish_ms"] / 1000
            fresh = not seen or ended > seen[-1][0] + S_INTERVAL_S / 2
            if began > registered and fresh:
                if len(own["intents"]) != N_TAGS:
                    raise RuntimeError(f"S published {len(own['intents'])} tags, not {N_TAGS}")
                seen.append((ended, own["bytes"], own["publish_ms"]))
        time.sleep(POLL_S)
    if len(seen) < PUBLICATIONS:
        raise RuntimeError(
            f"S made {len(seen)} publications of {N_TAGS} tags in {READY_TIMEOUT_S} s"
        )
    summary = msgspec.convert(
        {k: own[k] for k in ("domain", "gateway_url", "at", "intents")}, DomainSummary
    )
    _check_summary(summary, with_p95=False)
    return {"bytes": [b for _, b, _ in seen], "publish_ms": [p for _, _, p in seen]}, directory


def summary_costs(cores: Cores) -> dict[str, Any]:
    """The summary's figures (see the module's docstring), in this order: in process, PUTs to
    an empty directory, S's publications, PUTs to S's directory. Its own processes (two
    directories and S), none of the send rounds': a directory answer carrying 1,000 tags must
    not reach A or B (their check after the rounds would depend on it). Every child is stopped
    on the way out, whatever happens."""
    print("== federation summary of 1,000 tags", flush=True)
    children: list[Child] = []
    try:
        built, body = _in_process(set(), cores[0])
        empty = _directory("fed-directory-put", cores[1], children)
        put = _puts({c.pid for c in children}, empty, body, set())
        gateway, s_directory = _through_gateway(cores, children)
        put_s = _puts({c.pid for c in children}, s_directory, body, {"s"})
    finally:
        for child in reversed(children):
            child.stop()
    return {"in_process": built, "put": put, "gateway": gateway, "put_with_s": put_s}


# --- the report ---------------------------------------------------------------------------------


def _errors(runs: list[Run]) -> int:
    return sum(r["errors"] for r in runs)


def table(data: dict[str, Runs], costs: dict[str, Any]) -> str:
    """The short table of the results (printed by ``run.py federation`` as they come)."""
    cpu = "gw_cpu_us_per_req"
    lines = [
        "| connections | p50 local | p50 forwarded | added p50 | req/s local | req/s forwarded "
        "| CPU/req local (B) | CPU/req forwarded (A + B) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for conns in CONNS:
        local, fwd = data[f"c{conns}"]["local"], data[f"c{conns}"]["forwarded"]
        added = paired(fwd, local, lambda x, y: x["p50_us"] - y["p50_us"])
        cells = [
            str(conns),
            fmt_col(local, "p50_us", " µs"),
            fmt_col(fwd, "p50_us", " µs"),
            fmt_signed(added, " µs"),
            fmt_col(local, "rps"),
            fmt_col(fwd, "rps"),
            fmt_col(local, cpu, " µs"),
            fmt_col(fwd, cpu, " µs"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ip, put, gw, put_s = (costs[k] for k in ("in_process", "put", "gateway", "put_with_s"))
    lines += [
        "",
        f"summary of {N_TAGS:,} tags: {ip['bytes']:,} B; build_summary {ip['build_us']:,.0f} µs "
        f"(first call {ip['first_build_us']:,.0f} µs), encode {ip['encode_us']:,.0f} µs; "
        f"PUT round trip p50 {put['p50_ms']:.3f} ms (p99 {put['p99_ms']:.3f}), "
        f"{put_s['p50_ms']:.3f} ms when the answer carries another {N_TAGS:,}-tag domain; "
        f"through gateway s: {fmt(med(gw['bytes']), ' B')}, "
        f"publish_ms {fmt(med(gw['publish_ms']), ' ms', 2)}",
    ]
    return "\n".join(lines)


def report(rep: Rows, data: dict[str, Runs], costs: dict[str, Any], st: FedStack) -> None:
    """Rows, notes and the zero-errors verdict of ``run.py federation``."""

    def row(metric: str, figure: str, ratio: str = "", target: str = "info") -> None:
        rep.row("federation", metric, figure, ratio=ratio, target=target)

    cpu = "gw_cpu_us_per_req"
    for conns in CONNS:
        local, fwd = data[f"c{conns}"]["local"], data[f"c{conns}"]["forwarded"]
        at = f"{conns} connection{'s' if conns > 1 else ''}"
        digits = 3 if conns == 1 else 2
        added = paired(fwd, local, lambda x, y: x["p50_us"] - y["p50_us"])
        row(
            f"p50 at {at}: local (POST B/v1/send) -> forwarded (POST A/v1/send, A forwards to "
            "B); added by the forward, run by run; ratio forwarded / local",
            f"{fmt_ms(local, digits=digits)} -> {fmt_ms(fwd, digits=digits)}; "
            f"{fmt_signed(added, ' µs')}",
            fmt_ratio(fwd, local, "p50_us"),
        )
        row(
            "  p99 local -> forwarded; errors local / forwarded",
            f"{fmt_ms(local, 'p99_us')} -> {fmt_ms(fwd, 'p99_us')}; "
            f"{_errors(local)} / {_errors(fwd)}",
            target="0 errors",
        )
        row(
            "  good answers/s local / forwarded; ratio forwarded / local",
            f"{fmt_col(local, 'rps')} / {fmt_col(fwd, 'rps')}",
            fmt_ratio(fwd, local),
        )
        cpu_added = paired(fwd, local, lambda x, y: x[cpu] - y[cpu])
        row(
            "  gateways' CPU per request: local (B) / forwarded (A + B; A alone, B alone); "
            "added by the forward, run by run; ratio",
            f"{fmt_col(local, cpu, ' µs')} / {fmt_col(fwd, cpu, ' µs')} "
            f"(A {fmt_col(fwd, 'a_cpu_us_per_req', ' µs')}, "
            f"B {fmt_col(fwd, 'b_cpu_us_per_req', ' µs')}); {fmt_signed(cpu_added, ' µs')}",
            fmt_ratio(fwd, local, cpu),
        )
        row(
            "  the gateway core busy (A + B over the run), local / forwarded",
            f"{fmt_col(local, 'core_busy_pct', ' %')} / {fmt_col(fwd, 'core_busy_pct', ' %')}",
        )
        rep.noise(f"federation at {at}", [*local, *fwd])
    ip, put, gw, put_s = (costs[k] for k in ("in_process", "put", "gateway", "put_with_s"))
    row(
        f"summary of {N_TAGS:,} tags (one endpoint each, each with a p95): bytes (msgspec JSON, "
        f"as published); build_summary, median of {BUILD_REPEATS} x {BUILD_NUMBER} calls "
        "(first call: tier caches cold); encoding",
        f"{ip['bytes']:,} B; {ip['build_us']:,.0f} µs ({ip['first_build_us']:,.0f} µs); "
        f"{ip['encode_us']:,.0f} µs",
    )
    row(
        f"  PUT /v1/summaries/DOMAIN of it to a directory process, p50 / p99 of {PUT_TRIALS} "
        "(one keep-alive connection): to an empty directory; to one whose answer carries a "
        f"{N_TAGS:,}-tag domain",
        f"{put['p50_ms']:.3f} / {put['p99_ms']:.3f} ms ({put['answer_bytes']:,} B); "
        f"{put_s['p50_ms']:.3f} / {put_s['p99_ms']:.3f} ms ({put_s['answer_bytes']:,} B)",
    )
    row(
        f"  through a gateway with {N_TAGS:,} registrations (no deliveries: p95 null), "
        f"GET /v1/federation of {PUBLICATIONS} publications: summary.bytes; summary.publish_ms "
        "(build, encode, PUT, answer)",
        f"{fmt(med(gw['bytes']), ' B')}; {fmt(med(gw['publish_ms']), ' ms', 2)}",
    )
    rep.noise("federation summary", [ip, put, put_s])
    checked = sum(s[p]["checked"] for s in st.samples for p in PATHS)
    row(
        "answers parsed and checked before and after the rounds: local (agent://bench-agent) / "
        "forwarded (agent://bench-agent@b, one attempt in domain b), the agent's answer",
        f"{checked // 2} / {checked // 2}, all right",
        target="right",
    )
    total = sum(_errors(side) for runs in data.values() for side in runs.values())
    rep.verdict(
        "federation: zero errors (local and forwarded, 1 and 32 connections; non-200, bad "
        "bodies, socket errors)",
        total == 0,
        f"{total} errors",
    )
    rep.notes.append(
        f"federation: a directory, the trivial agent and wrk on the load core; gateways A "
        f"(domain {A}, no agents) and B (domain {B}, the agent registered there) on the gateway "
        f"core (--matcher none, memory registry, --summary-interval {SUMMARY_INTERVAL_S:g}: "
        "each publishes and probes the other's /healthz every interval, counted in their CPU). "
        "The same send measured alternately at B (local) and at A, which forwards it to B "
        "(forwarded): A and B share one core, so at 32 connections the forwarded path's "
        "answers/s are bounded by A's + B's CPU per request. CPU per request from /proc "
        "(10 ms ticks). The summary's in-process figures are the runner's own process, pinned "
        "to the gateway core while timed."
    )
