"""The ladder of issue 18, the pieces of ``run.py ladder``: one request, six ways, measured in
one interleaved run, from the physical floor of a hop up to the seed-style gateway.

The rungs (``RUNGS``), each a server started by ``stack`` (gateways and nginx on the gateway
core, the trivial agent and wrk on the load core):

- ``direct``: straight to the trivial agent (``trivial_agent.py``), the request object a
  gateway delivers, POSTed to its URL: no hop at all;
- ``nginx``: the same POST through Debian's nginx (``harness.nginx_hop``: one process, access
  log off, an upstream with a keep-alive pool): what any proxy hop costs on this machine;
- ``lean``: ``POST /v1/send`` through the lean forwarder (``lean_forwarder.py``: raw ASGI on
  uvicorn + httptools + uvloop, msgspec, one aiohttp session, an intent index, round robin;
  no retries, traces, metrics or health rules);
- ``agent_reach``: ``POST /v1/send`` through the gateway as ``make bench`` runs it elsewhere
  (``agent-reach serve --port 0 --heartbeat-interval 3600 --log-level WARNING``: every feature
  on, open mode);
- ``agent_reach_tokens``: the same in token mode (``harness.token_mode``: a client token sent as
  ``Authorization: Bearer``, a one-rule policy, every delivery signed; the agent registered
  with an enrollment token);
- ``seed``: ``POST /v1/send`` through the seed-style gateway (``seed_gateway.py``).

The loads (``KINDS``), each measured by ``run.py``'s ``_rotate`` (an unmeasured 1 s warm-up of
every rung, then ``--runs`` rounds in rotating order): 1 caller (p50, p99, added p50 over
direct run by run), 32 and 128 callers (good answers/s, p50/p99, CPU per request of the process
serving the rung, errors), and ``POST /v1/heartbeat`` at 32 callers through the three that
ingest heartbeats (``BEATERS``).

Invariants:
- Every rung's answer is checked, not assumed, when the stack is up and again after the rounds
  (``check_answers``): the agent's answer straight or through nginx, and through each gateway a
  200 with ``"ok": true``, the agent's id and the agent's answer as ``result``; a heartbeat at
  each of ``BEATERS`` is a 200 with ``"ok": true``.
- Errors (a non-200, a body without ``"ok":true``, a socket error: wrk_post.lua) are counted,
  never taken for throughput; a ratio is taken run by run (the rungs of one round paired), then
  its median.
- Bounded: readiness polls ``READY_TIMEOUT_S``, a wrk run its duration + 30 s, a checked request
  10 s, the rounds by ``--runs``; every child is stopped on the way out of ``stack``, whatever
  happens.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import (
    AGENT_ID,
    DIRECT_BODY,
    HERE,
    INTENT,
    PY,
    SEND_BODY,
    Child,
    Cores,
    Rows,
    Run,
    Runs,
    agent_reach_cli,
    fmt,
    fmt_col,
    fmt_ms,
    fmt_ratio,
    fmt_signed,
    nginx_hop,
    nginx_path,
    paired,
    post,
    register_with_token,
    start,
    token_mode,
    wait_http,
    wrk,
)
from trivial_agent import BODY as AGENT_BODY

HEARTBEAT_BODY = json.dumps({"endpoint_id": AGENT_ID})
AGENT_ANSWER: dict[str, Any] = json.loads(AGENT_BODY)
RUNGS = ("direct", "nginx", "lean", "agent_reach", "agent_reach_tokens", "seed")
GATEWAYS = ("lean", "agent_reach", "agent_reach_tokens", "seed")  # the rungs with /v1/send
BEATERS = ("agent_reach", "lean", "seed")  # the rungs whose heartbeats are measured
LABELS = {
    "direct": "direct to the agent",
    "nginx": "nginx hop",
    "lean": "lean forwarder",
    "agent_reach": "Agent-Reach, open mode",
    "agent_reach_tokens": "Agent-Reach, token mode",
    "seed": "seed-style gateway",
}
KINDS = {"c1": 1, "c32": 32, "c128": 128, "heartbeat": 32}  # load -> callers; latency first
TARGETS = {
    "rps_vs_lean": 1.0,  # at least, at 32 and 128 callers
    "rps_vs_seed": 10.0,  # at least, at 32 and 128 callers
    "added_ms": 0.45,  # at most, p50 over direct at 1 caller (and at most the lean's)
    "p99_vs_lean": 1.2,  # at most, at 32 callers
    "heartbeat_vs_seed": 5.0,  # at least
    "tokens_cpu_pct": 20.0,  # at most, CPU per request over open mode
}
CPU = "gw_cpu_us_per_req"
One = Callable[[str, int, bool], dict[str, Any]]  # (rung, seconds, measured) -> figures


# --- the stack ----------------------------------------------------------------------------------


@dataclass
class LadderStack:
    """The server behind each rung, every child started (to stop and to leave out of the
    foreign CPU), the client token of token mode, and the checked answers."""

    servers: dict[str, Child]
    children: list[Child]
    client_token: str
    nginx_version: str
    samples: list[dict[str, Any]] = field(default_factory=list)

    def pids(self) -> set[int]:
        """The benchmark's own processes (not counted as foreign CPU)."""
        return {c.pid for c in self.children}

    def url(self, rung: str, heartbeat: bool = False) -> str:
        if rung in ("direct", "nginx"):
            return self.servers[rung].url
        return self.servers[rung].url + ("/v1/heartbeat" if heartbeat else "/v1/send")

    def body(self, rung: str, heartbeat: bool = False) -> str:
        if heartbeat:
            return HEARTBEAT_BODY
        return DIRECT_BODY if rung in ("direct", "nginx") else SEND_BODY

    def headers(self, rung: str) -> dict[str, str]:
        if rung == "agent_reach_tokens":
            return {"Authorization": f"Bearer {self.client_token}"}
        return {}

    def pid(self, rung: str) -> int | None:
        """The process whose CPU per request is reported (none for the agent itself)."""
        return None if rung == "direct" else self.servers[rung].pid


def _problem(rung: str, status: int, raw: bytes, heartbeat: bool) -> str | None:
    """Why an answer is not the expected one (None: it is)."""
    if status != 200:
        return f"HTTP {status}"
    ans = json.loads(raw)
    if rung in ("direct", "nginx"):
        return None if ans == AGENT_ANSWER else "not the agent's answer"
    if ans.get("ok") is not True:
        return "no ok: true"
    if heartbeat:
        return None
    if ans.get("endpoint_id") != AGENT_ID:
        return f"reached {ans.get('endpoint_id')}"
    return None if ans.get("result") == AGENT_ANSWER else "the result is not the agent's answer"


def check_answers(st: LadderStack, when: str) -> dict[str, Any]:
    """One answer of each rung (and one heartbeat of each of ``BEATERS``), parsed and checked;
    RuntimeError on the first that is not the expected one. Returns the answers."""
    kept: dict[str, Any] = {"when": when}
    checks = [(rung, False) for rung in RUNGS] + [(rung, True) for rung in BEATERS]
    for rung, beat in checks:
        headers = {"Content-Type": "application/json", **st.headers(rung)}
        status, raw = post(st.url(rung, beat), st.body(rung, beat), headers)
        try:
            why = _problem(rung, status, raw, beat)
        except (ValueError, AttributeError) as exc:
            why = f"unreadable: {exc!r}"
        what = f"{rung} {'heartbeat' if beat else 'answer'}"
        if why is not None:
            raise RuntimeError(f"{what} {when} the rounds: {why}: {raw[:600]!r}")
        kept[what] = json.loads(raw)
    return kept


def _nginx_version(nginx: str) -> str:
    proc = subprocess.run([nginx, "-v"], capture_output=True, text=True, timeout=10)
    return (proc.stderr or proc.stdout).strip().removeprefix("nginx version: ")


def _stop_all(children: list[Child]) -> None:
    for child in reversed(children):
        child.stop()


@contextlib.contextmanager
def stack(cores: Cores, *, seed_as_installed: bool = False) -> Iterator[LadderStack]:
    """Start every rung's server (bounded readiness polls), check every answer (the caller
    checks them again after the rounds: ``check_answers``); stop every child on the way out,
    whatever happens."""
    gw_core, load_core = cores
    nginx = nginx_path()
    if nginx is None:
        raise RuntimeError("nginx is not installed (apt-get install -y nginx-light)")
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="bench-ladder-") as tmp, contextlib.ExitStack() as ex:
        ex.callback(_stop_all, children)
        tm = token_mode(Path(tmp))
        serve = [*agent_reach_cli(), "serve", "--port", "0", "--log-level", "WARNING"]
        serve += ["--heartbeat-interval", "3600"]
        seed = [PY, str(HERE / "seed_gateway.py"), "--port", "0", "--heartbeat-interval", "3600"]
        lean = [PY, str(HERE / "lean_forwarder.py"), "--port", "0"]
        commands = {
            "agent_reach": serve,
            "agent_reach_tokens": [*serve, *tm.flags],
            "seed": seed + (["--as-installed"] if seed_as_installed else []),
            "lean": [*lean, "--heartbeat-interval", "3600"],
        }
        servers: dict[str, Child] = {}
        for rung, cmd in commands.items():  # all started first: they boot side by side
            servers[rung] = start(f"ladder-{rung}", cmd, gw_core)
            children.append(servers[rung])
        for rung in commands:
            servers[rung].url = servers[rung].wait_line(r"listening on (http://\S+)")
        for rung in ("agent_reach", "agent_reach_tokens"):
            wait_http(servers[rung].url + "/healthz", child=servers[rung])
        wait_http(servers["seed"].url + "/openapi.json", child=servers["seed"])
        # the lean forwarder listens before it prints its line: nothing more to wait for
        agent_cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        for rung in ("agent_reach", "seed", "lean"):
            agent_cmd += ["--register", servers[rung].url]
        agent = start("ladder-agent", agent_cmd, load_core)
        children.append(agent)
        agent.url = agent.wait_line(r"listening on (http://\S+)")
        servers["direct"] = agent
        register_with_token(
            servers["agent_reach_tokens"].url, tm.enroll, AGENT_ID, [INTENT], agent.url
        )
        servers["nginx"] = ex.enter_context(nginx_hop("ladder-nginx", agent.url, gw_core))
        children.append(servers["nginx"])
        st = LadderStack(servers, children, tm.client, _nginx_version(nginx))
        st.samples.append(check_answers(st, "before"))
        yield st


# --- measured runs ------------------------------------------------------------------------------


def targets(kind: str, st: LadderStack, cores: Cores) -> tuple[list[str], One]:
    """The rungs measured under load ``kind`` (a key of ``KINDS``) and how to run one, for
    ``_rotate``."""
    conns, beat = KINDS[kind], kind == "heartbeat"

    def one(rung: str, seconds: int, measured: bool) -> dict[str, Any]:
        return wrk(
            st.url(rung, beat),
            st.body(rung, beat),
            conns,
            seconds,
            core=cores[1],
            gateway_pid=st.pid(rung),
            ours=st.pids(),
            measured=measured,
            headers=st.headers(rung) or None,
        )

    return list(BEATERS if beat else RUNGS), one


# --- the report ---------------------------------------------------------------------------------


def _errors(runs: list[Run]) -> int:
    return sum(r["errors"] for r in runs)


def _added(data: Runs, rung: str) -> dict[str, float]:
    """p50 of ``rung`` minus direct's at 1 caller, in ms, run by run."""
    return paired(data[rung], data["direct"], lambda x, d: (x["p50_us"] - d["p50_us"]) / 1000)


def _pct(a: Run, b: Run) -> float:
    """How much more CPU per request ``a`` took than ``b``, in %."""
    return 100 * (float(a[CPU]) / max(float(b[CPU]), 1e-9) - 1)


def report(rep: Rows, data: dict[str, Runs], st: LadderStack) -> None:
    """Rows, verdicts and notes of ``run.py ladder``."""
    t = TARGETS

    def row(metric: str, figure: str, ratio: str = "", target: str = "info") -> None:
        rep.row("ladder", metric, figure, ratio=ratio, target=target)

    def ratio(runs: Runs, a: str, b: str, key: str = "rps") -> dict[str, float]:
        return paired(runs[a], runs[b], lambda x, y: x[key] / max(y[key], 1e-9))

    c1 = data["c1"]
    for rung in RUNGS:
        figure = f"{fmt_ms(c1[rung], digits=3)} / {fmt_ms(c1[rung], 'p99_us')}"
        if rung != "direct":
            figure += f"; {fmt_signed(_added(c1, rung), ' ms', 3)}"
        row(
            f"1 caller (wrk -c1), {LABELS[rung]}: p50 / p99; added p50 over direct (run by run)",
            figure,
            target=f"added ≤ the lean's, ≤ {t['added_ms']} ms" if rung == "agent_reach" else "info",
        )
    ar_added = _added(c1, "agent_reach")
    over_lean = paired(
        c1["agent_reach"], c1["lean"], lambda a, b: (a["p50_us"] - b["p50_us"]) / 1000
    )
    row(
        "  Agent-Reach's added p50 minus the lean forwarder's (run by run)",
        fmt_signed(over_lean, " ms", 3),
        target="≤ 0",
    )
    rep.noise("ladder at 1 caller", [r for v in c1.values() for r in v])
    rep.verdict(
        "ladder: Agent-Reach's added p50 at 1 caller ≤ the lean forwarder's",
        over_lean["median"] <= 0,
        fmt_signed(over_lean, " ms", 3),
    )
    rep.verdict(
        f"ladder: Agent-Reach's added p50 at 1 caller ≤ {t['added_ms']} ms",
        ar_added["median"] <= t["added_ms"],
        fmt(ar_added, " ms", 3),
    )

    for kind in ("c32", "c128"):
        runs, n = data[kind], KINDS[kind]
        for rung in RUNGS:
            rs = runs[rung]
            figure = (
                f"{fmt_col(rs, 'rps')}; {fmt_col(rs, CPU, ' µs')}; "
                f"{fmt_ms(rs, digits=1)} / {fmt_ms(rs, 'p99_us', 1)}; {_errors(rs)}"
            )
            ratios, target = "", "0 errors"
            if rung == "agent_reach":
                ratios = f"{fmt_ratio(rs, runs['lean'])} lean, {fmt_ratio(rs, runs['seed'])} seed"
                target = f"≥ lean, ≥ {t['rps_vs_seed']:.0f}x seed, 0 errors"
            elif rung == "agent_reach_tokens":
                ratios = f"{fmt_ratio(rs, runs['agent_reach'])} open"
            row(
                f"{n} callers, {LABELS[rung]}: good answers/s; CPU per request; p50 / p99; errors",
                figure,
                ratios,
                target,
            )
        ar = runs["agent_reach"]
        vs_lean, vs_seed = ratio(runs, "agent_reach", "lean"), ratio(runs, "agent_reach", "seed")
        rep.verdict(
            f"ladder: Agent-Reach's good answers/s ≥ the lean forwarder's at {n} callers",
            vs_lean["median"] >= t["rps_vs_lean"],
            fmt(vs_lean, "x", 2),
        )
        rep.verdict(
            f"ladder: Agent-Reach's good answers/s ≥ {t['rps_vs_seed']:.0f}x the seed's at {n} "
            "callers",
            vs_seed["median"] >= t["rps_vs_seed"],
            fmt(vs_seed, "x", 1),
        )
        if kind == "c32":
            p99 = ratio(runs, "agent_reach", "lean", "p99_us")
            row(
                "  p99 at 32 callers, Agent-Reach / the lean forwarder (run by run)",
                fmt(p99, "x", 2),
                target=f"≤ {t['p99_vs_lean']}x",
            )
            rep.verdict(
                f"ladder: Agent-Reach's p99 at 32 callers ≤ {t['p99_vs_lean']}x the lean "
                "forwarder's",
                p99["median"] <= t["p99_vs_lean"],
                fmt(p99, "x", 2),
            )
        tok = runs["agent_reach_tokens"]
        added = paired(tok, ar, lambda a, o: a[CPU] - o[CPU])
        pct = paired(tok, ar, _pct)
        row(
            f"  token mode's CPU per request over open mode at {n} callers (run by run)",
            f"{fmt_signed(added, ' µs')} ({fmt_signed(pct, ' %', 1)})",
            target=f"≤ +{t['tokens_cpu_pct']:.0f} %",
        )
        rep.verdict(
            f"ladder: token mode's CPU per request ≤ +{t['tokens_cpu_pct']:.0f} % over open mode "
            f"at {n} callers",
            pct["median"] <= t["tokens_cpu_pct"],
            fmt_signed(pct, " %", 1),
        )
        rep.noise(f"ladder at {n} callers", [r for v in runs.values() for r in v])

    beats = data["heartbeat"]
    for rung in BEATERS:
        rs = beats[rung]
        row(
            f"heartbeats/s ingested, 32 callers, {LABELS[rung]}; CPU per heartbeat; errors",
            f"{fmt_col(rs, 'rps')}; {fmt_col(rs, CPU, ' µs')}; {_errors(rs)}",
            f"{fmt_ratio(rs, beats['seed'])} seed" if rung == "agent_reach" else "",
            f"≥ {t['heartbeat_vs_seed']:.0f}x seed" if rung == "agent_reach" else "0 errors",
        )
    hb = ratio(beats, "agent_reach", "seed")
    rep.verdict(
        f"ladder: Agent-Reach's heartbeats/s ≥ {t['heartbeat_vs_seed']:.0f}x the seed's",
        hb["median"] >= t["heartbeat_vs_seed"],
        fmt(hb, "x", 1),
    )
    rep.noise("ladder heartbeats", [r for v in beats.values() for r in v])

    total = sum(_errors(rs) for runs in data.values() for rs in runs.values())
    checked = ", ".join(f"{len(s) - 1} {s['when']}" for s in st.samples)
    row(
        "answers parsed and checked before and after the rounds (every rung, and a heartbeat "
        "at each gateway that takes them)",
        f"{checked} the rounds, all as expected",
        target="all",
    )
    rep.verdict(
        "ladder: zero errors (every rung, every load: non-200, bad body, socket)",
        total == 0,
        f"{total} errors",
    )
    rep.notes.append(
        "ladder: one interleaved run (each load: every rung warmed 1 s, then the rounds in "
        "rotating order); the gateways and nginx on the gateway core, the trivial agent and wrk "
        "on the load core. direct and nginx POST the request object a gateway delivers "
        f"({len(DIRECT_BODY)} B) to the agent; the gateways get POST /v1/send ({len(SEND_BODY)} "
        f"B). nginx: {st.nginx_version}, Debian's build, one process (master_process off, so "
        "its CPU is one pid's), access log off, an upstream keep-alive pool of 512 "
        "connections, HTTP/1.1 to the agent. CPU per request is the process serving the rung "
        "(none for direct); token mode: one client token for every request (verified once, "
        "then cached), a one-rule policy, every delivery signed, the agent not verifying. "
        "Each row's figure is the rung it names (in the Agent-Reach column whatever the rung)."
    )
