"""A2A against v1 through one gateway, the pieces of ``run.py a2a``: the added cost of the protocol.

The stack (``stack``): one Agent-Reach gateway on the gateway core (``python -m agent_reach serve
--port 0 --matcher none --heartbeat-interval 3600 --log-level WARNING``, memory registry) and one
trivial agent (``trivial_agent.py``) on the load core, registered for ``bench.echo``. The same
reach two ways, measured alternately by ``run.py``'s ``_rotate`` at 1 and at 32 connections:

- ``v1``: ``POST /v1/send`` ``{"intent": "bench.echo", "payload": {"n": 1}}`` (wrk_post.lua);
- ``a2a``: ``POST /a2a`` with ``A2A-Version: 1.0``, a JSON-RPC ``SendMessage`` whose message
  carries the intent in ``metadata.intent`` and ``{"n": 1}`` as its one data part
  (wrk_a2a.lua); the gateway routes it by the same send and wraps the agent's JSON answer into
  an A2A Message.

Invariants:
- Both sides go through the same runner (``harness.wrk``, each with its own wrk script): good
  answers/s, p50/p99, errors, the gateway's CPU per request from /proc and its busy share, the
  CPU of processes outside the benchmark and steal time over the run, plus the gateway's RSS
  before and after.
- Errors: a non-200, a socket error, a body that is not the expected answer, and on the A2A side
  a JSON-RPC error (``rpcerror``) are all counted as errors, never as throughput.
- The answers are checked, not assumed: ``SAMPLES`` requests of each kind are sent and parsed
  when the stack is up and again after the rounds (``check_answers``); any one that is not a
  result holding the agent's answer stops the benchmark with the body it got.
- A measured run waits for quiet and is measured once more when noisy (``harness.quiet_run``).
- Bounded: readiness polls ``READY_TIMEOUT_S``, a wrk run its duration + 30 s, a sampled request
  10 s; both children are stopped on the way out of ``stack``, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harness import (
    AGENT_ID,
    HERE,
    INTENT,
    PY,
    Child,
    Cores,
    Rows,
    Run,
    Runs,
    fmt_col,
    fmt_ms,
    fmt_ratio,
    fmt_signed,
    paired,
    post,
    quiet_run,
    start_listening,
    wait_http,
    wrk,
)
from trivial_agent import BODY as AGENT_BODY

CONNS = (1, 32)  # one caller first: latency before load, as run.py orders its benchmarks
SAMPLES = 3  # answers of each kind parsed and checked before and after the rounds
AGENT_ANSWER: dict[str, Any] = json.loads(AGENT_BODY)
V1_BODY = json.dumps({"intent": INTENT, "payload": {"n": 1}})
A2A_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "m1",
                "role": "ROLE_USER",
                "parts": [{"data": {"n": 1}}],
                "metadata": {"intent": INTENT},
            }
        },
    },
    separators=(",", ":"),
)
A2A_HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}
# what wrk_a2a.lua takes for a result: checked here on the sampled answers, so that a change
# of the gateway's key order shows as a clear failure rather than as every request an error
A2A_RESULT_PREFIX = b'{"jsonrpc":"2.0","id":1,"result":{"message":'
LUA = {"v1": HERE / "wrk_post.lua", "a2a": HERE / "wrk_a2a.lua"}
PATHS = {"v1": "/v1/send", "a2a": "/a2a"}
BODIES = {"v1": V1_BODY, "a2a": A2A_BODY}
One = Callable[[str, int, bool], dict[str, Any]]  # (target, seconds, measured) -> figures


# --- the stack ----------------------------------------------------------------------------------


@dataclass
class A2aStack:
    """The gateway and the trivial agent (both started by ``stack``), and the sampled answers."""

    gateway: Child
    agent: Child
    samples: list[dict[str, Any]] = field(default_factory=list)

    def pids(self) -> set[int]:
        """The benchmark's own processes (not counted as foreign CPU)."""
        return {self.gateway.pid, self.agent.pid}


def _v1_problem(status: int, raw: bytes) -> str | None:
    """Why a ``/v1/send`` answer is not the agent's answer routed by intent (None: it is)."""
    if status != 200:
        return f"HTTP {status}"
    ans = json.loads(raw)
    if ans.get("ok") is not True:
        return "no ok: true"
    if (ans.get("endpoint_id"), ans.get("intent")) != (AGENT_ID, INTENT):
        return f"reached {ans.get('endpoint_id')} for {ans.get('intent')}"
    if ans.get("result") != AGENT_ANSWER:
        return "the result is not the agent's answer"
    return None


def _a2a_problem(status: int, raw: bytes) -> str | None:
    """Why a ``/a2a`` answer is not a JSON-RPC result, a Message holding the agent's answer."""
    if status != 200:
        return f"HTTP {status}"
    ans = json.loads(raw)
    if "error" in ans:
        return f"JSON-RPC error {ans['error'].get('code')}"
    if ans.get("jsonrpc") != "2.0" or ans.get("id") != 1:
        return "not the JSON-RPC answer of request id 1"
    message = (ans.get("result") or {}).get("message") or {}
    if message.get("role") != "ROLE_AGENT":
        return "the result is not an agent's Message"
    parts, meta = message.get("parts") or [{}], message.get("metadata") or {}
    if parts[0].get("data") != AGENT_ANSWER:
        return "the Message's data part is not the agent's answer"
    if (meta.get("endpoint_id"), meta.get("intent")) != (AGENT_ID, INTENT):
        return f"reached {meta.get('endpoint_id')} for {meta.get('intent')}"
    if not raw.startswith(A2A_RESULT_PREFIX):
        return f"the body does not start as wrk_a2a.lua expects ({A2A_RESULT_PREFIX!r})"
    return None


def check_answers(st: A2aStack, when: str) -> dict[str, Any]:
    """``SAMPLES`` answers of each kind, parsed and checked; RuntimeError on the first that is
    not a result. Returns what was checked (one answer of each kind kept for the report)."""
    checks = {"v1": _v1_problem, "a2a": _a2a_problem}
    headers = {"v1": {"Content-Type": "application/json"}, "a2a": A2A_HEADERS}
    kept: dict[str, Any] = {"when": when}
    for kind, problem in checks.items():
        for _ in range(SAMPLES):
            status, raw = post(st.gateway.url + PATHS[kind], BODIES[kind], headers[kind])
            try:
                why = problem(status, raw)
            except (ValueError, AttributeError, IndexError, TypeError) as exc:
                why = f"unreadable: {exc!r}"
            if why is not None:
                raise RuntimeError(f"{kind} answer {when} the rounds: {why}: {raw[:600]!r}")
        kept[kind] = {"checked": SAMPLES, "answer": json.loads(raw)}
    return kept


@contextlib.contextmanager
def stack(cores: Cores) -> Iterator[A2aStack]:
    """Start the gateway and the agent (bounded readiness polls), check answers of both kinds;
    on a normal exit check them again; stop both on the way out, whatever happens."""
    gw_core, load_core = cores
    children: list[Child] = []
    try:
        serve = [PY, "-m", "agent_reach", "serve", "--port", "0", "--matcher", "none"]
        serve += ["--heartbeat-interval", "3600", "--log-level", "WARNING"]
        gateway = start_listening("agent-reach-a2a", serve, gw_core, children)
        wait_http(gateway.url + "/healthz")
        cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        cmd += ["--register", gateway.url]
        agent = start_listening("agent-a2a", cmd, load_core, children)
        st = A2aStack(gateway, agent)
        st.samples.append(check_answers(st, "before"))
        yield st
        st.samples.append(check_answers(st, "after"))
    finally:
        for child in reversed(children):
            child.stop()


# --- measured runs ------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` in kB (VmRSS); 0 once it is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _wrk(st: A2aStack, cores: Cores, kind: str, conns: int, seconds: int) -> Run:
    """One wrk run of ``kind`` (v1, a2a): ``harness.wrk``'s figures with this kind's script and
    the gateway's busy share, plus its RSS growth over the run."""
    gw = st.gateway.pid
    rss0 = rss_kb(gw)
    r = wrk(
        st.gateway.url + PATHS[kind],
        BODIES[kind],
        conns,
        seconds,
        core=cores[1],
        gateway_pid=gw,
        ours=st.pids(),
        measured=False,  # the quiet wait is ``targets``' (quiet_run): RSS spans one run
        script=LUA[kind],
        busy=True,
    )
    rss1 = rss_kb(gw)
    r.setdefault("rpcerror", 0)  # wrk_post.lua has no JSON-RPC to count
    if r["requests"]:
        r["rss_kb_per_1k_req"] = round((rss1 - rss0) * 1000 / r["requests"], 2)
    r["rss_kb_after"] = rss1
    return r


def targets(conns: int, st: A2aStack, cores: Cores) -> tuple[list[str], One]:
    """The target names (v1, a2a) at ``conns`` connections and how to run one, for ``_rotate``."""

    def one(name: str, seconds: int, measured: bool) -> dict[str, Any]:
        return quiet_run(lambda: _wrk(st, cores, name, conns, seconds), st.pids(), measured)

    return ["v1", "a2a"], one


# --- the report ---------------------------------------------------------------------------------


def _errors(runs: list[Run]) -> str:
    total = sum(r["errors"] for r in runs)
    rpc = sum(r["rpcerror"] for r in runs)
    return f"{total} ({rpc} JSON-RPC)" if rpc else str(total)


def report(rep: Rows, data: dict[str, Runs], st: A2aStack) -> None:
    """Rows, notes and the zero-errors verdict of ``run.py a2a``."""

    def row(metric: str, figure: str, ratio: str = "", target: str = "info") -> None:
        rep.row("a2a", metric, figure, ratio=ratio, target=target)

    cpu, rss = "gw_cpu_us_per_req", "rss_kb_per_1k_req"
    for conns in CONNS:
        v1, a2a = data[f"c{conns}"]["v1"], data[f"c{conns}"]["a2a"]
        at = f"{conns} connection{'s' if conns > 1 else ''}"
        p50_digits = 3 if conns == 1 else 2
        row(f"POST /v1/send good answers/s, {at}", fmt_col(v1, "rps"))
        row(
            "  latency p50 / p99; errors; gateway CPU per request",
            f"{fmt_ms(v1, digits=p50_digits)} / {fmt_ms(v1, 'p99_us')}; {_errors(v1)}; "
            f"{fmt_col(v1, cpu, ' µs')}",
            target="0 errors",
        )
        row(
            f"POST /a2a SendMessage good answers/s, {at}; ratio a2a / v1",
            fmt_col(a2a, "rps"),
            fmt_ratio(a2a, v1, "rps"),
        )
        row(
            "  latency p50 / p99; errors (non-200, JSON-RPC error, bad body, socket); "
            "gateway CPU per request",
            f"{fmt_ms(a2a, digits=p50_digits)} / {fmt_ms(a2a, 'p99_us')}; {_errors(a2a)}; "
            f"{fmt_col(a2a, cpu, ' µs')}",
            target="0 errors",
        )
        p50 = paired(a2a, v1, lambda x, y: (x["p50_us"] - y["p50_us"]) / 1000)
        row(
            "  p50, a2a minus v1 (run by run); ratio a2a / v1",
            fmt_signed(p50, " ms", 3),
            fmt_ratio(a2a, v1, "p50_us"),
        )
        added = paired(a2a, v1, lambda x, y: x[cpu] - y[cpu])
        row(
            "  gateway CPU per request, a2a minus v1 (run by run); ratio a2a / v1",
            fmt_signed(added, " µs"),
            fmt_ratio(a2a, v1, cpu),
        )
        row(
            "  gateway RSS growth per 1,000 requests, v1 / a2a; gateway core busy, v1 / a2a",
            f"{fmt_col(v1, rss, ' kB', 1)} / {fmt_col(a2a, rss, ' kB', 1)}; "
            f"{fmt_col(v1, 'gw_busy_pct', ' %')} / {fmt_col(a2a, 'gw_busy_pct', ' %')}",
        )
        rep.noise(f"a2a at {at}", [*v1, *a2a])
    checked = sum(s[k]["checked"] for s in st.samples for k in ("v1", "a2a"))
    row(
        "answers parsed and checked before and after the rounds: v1 (the agent's answer, routed "
        "by intent) / a2a (a JSON-RPC result, a Message holding it)",
        f"{checked // 2} / {checked // 2}, all results",
        target="results",
    )
    total = sum(r["errors"] for runs in data.values() for side in runs.values() for r in side)
    rep.verdict(
        "a2a: zero errors (v1 and a2a, 1 and 32 connections; non-200, JSON-RPC errors, bad "
        "bodies, socket errors)",
        total == 0,
        f"{total} errors",
    )
    rss = max(r["rss_kb_after"] for runs in data.values() for side in runs.values() for r in side)
    rep.notes.append(
        "a2a: one gateway on the gateway core (--matcher none, memory registry), the trivial "
        "agent and wrk on the load core; the same reach measured alternately as POST /v1/send "
        f'({len(V1_BODY)} B body, wrk_post.lua: good = 200 with "ok":true) and as POST /a2a '
        f"SendMessage with A2A-Version: 1.0 ({len(A2A_BODY)} B body, the intent in "
        "message.metadata, wrk_a2a.lua: good = 200 whose body is the JSON-RPC result of id 1, "
        "a Message holding the agent's answer; a JSON-RPC error counts as an error). Every "
        "request has the same messageId (the gateway does not deduplicate). A one-off message "
        "(no task, no contextId) writes nothing to the gateway's a2a-owners map "
        f"(the RSS row; the gateway's RSS at the end: {rss / 1024:,.0f} MiB)."
    )
