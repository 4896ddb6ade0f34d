"""NATS vs HTTP, the pieces of ``run.py nats``: the stack, the measured runs, the rows.

The stack (``stack``): a private ``nats-server`` on a free port, pinned with the load (core 1);
one Agent-Reach gateway on core 0 with ``--nats`` to it, a random ``--nats-prefix``,
``--heartbeat-interval 3600 --log-level WARNING``; two trivial agents on core 1 declaring the
same intent: the HTTP one (``trivial_agent.py``) and the NATS one (``trivial_nats_agent.py``,
registered over HTTP with ``endpoint_url = nats:SUBJECT``). Each send names its agent with
``recipient_hint``, so nothing is delivered to the other.

Three measures, each a set of targets measured alternately by ``run.py``'s ``_rotate``:

- ``send_c32``: ``POST /v1/send`` (wrk -c32) to the HTTP agent vs the NATS agent;
- ``send_c1``: the same at one connection (wrk -c1), and straight to the HTTP agent (direct);
- ``heartbeat``: ``POST /v1/heartbeat`` (wrk -c32) vs requests to ``PREFIX.v1.heartbeat`` from
  the load generator (``nats_load.py`` on the load core: 32 requests always in flight, bounded
  by ``--duration``).

Invariants:
- Every run reports what ``harness.wrk`` reports (good answers/s, errors, the gateway's CPU per
  request from /proc, the CPU of processes outside the benchmark and steal time over the run),
  plus the CPU per request of nats-server and of the agent, and the generator's CPU.
- A measured run waits for quiet and is measured once more when noisy (``harness.quiet_run``).
- Bounded: readiness polls ``READY_TIMEOUT_S``; a generator run its duration + 30 s, then it
  is killed; every child is stopped on the way out of ``stack``, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    CLK_TCK,
    HERE,
    OUT,
    PY,
    READY_TIMEOUT_S,
    Child,
    Cores,
    Rows,
    Run,
    Runs,
    all_jiffies,
    die_with_parent,
    fmt,
    fmt_col,
    fmt_ms,
    fmt_ratio,
    fmt_signed,
    foreign_cpu,
    jiffies,
    med,
    paired,
    pin,
    quiet_run,
    start,
    start_listening,
    steal_jiffies,
    wait_http,
    wrk,
)

NATS_SERVER = "/usr/sbin/nats-server"
INTENT = "bench.echo"
HTTP_AGENT = "agent://bench-http"
NATS_AGENT = "agent://bench-nats"
CONNS = 32
PAYLOAD = {"city": "Chengdu", "n": 1}
SATURATED_PCT = 85.0  # CPU of one core above which a process is taken as the bottleneck
One = Callable[[str, int, bool], dict[str, Any]]  # (target, seconds, measured) -> figures


def server_path() -> str | None:
    """The nats-server binary: /usr/sbin/nats-server, else one on PATH (None: not installed)."""
    return NATS_SERVER if os.access(NATS_SERVER, os.X_OK) else shutil.which("nats-server")


def send_body(recipient: str) -> str:
    return json.dumps({"intent": INTENT, "recipient_hint": recipient, "payload": PAYLOAD})


DIRECT_BODY = json.dumps(  # what the gateway delivers to the HTTP agent
    {
        "msg_id": "msg_bench",
        "trace_id": "trace_bench",
        "sender": None,
        "recipient_hint": HTTP_AGENT,
        "intent": INTENT,
        "payload": PAYLOAD,
        "priority": "normal",
        "timeout_ms": 8000,
    }
)


# --- the stack ----------------------------------------------------------------------------------


@dataclass
class NatsStack:
    """nats-server, the gateway, the HTTP agent and the NATS agent (all started by ``stack``)."""

    server: Child
    gateway: Child
    http_agent: Child
    nats_agent: Child
    nats_url: str
    prefix: str
    subject: str

    def pids(self) -> set[int]:
        return {c.pid for c in (self.server, self.gateway, self.http_agent, self.nats_agent)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_nats(child: Child, port: int, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll until the server on ``port`` greets with its INFO line, for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as c:
            if c.recv(5) == b"INFO ":
                return
        if child.proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {child.proc.returncode}")
        time.sleep(0.02)  # polling interval, not a settle delay
    raise RuntimeError(f"nats-server not ready on port {port} within {timeout} s")


def _cli() -> list[str]:
    script = Path(PY).parent / "agent-reach"
    return [str(script)] if script.exists() else [PY, "-m", "agent_reach"]


@contextlib.contextmanager
def stack(cores: Cores) -> Iterator[NatsStack]:
    """Start everything (bounded readiness polls); stop it all on the way out, whatever happens."""
    binary = server_path()
    if binary is None:
        raise RuntimeError("nats-server is not installed (apt-get install -y nats-server)")
    gw_core, load_core = cores
    children: list[Child] = []
    try:
        port = _free_port()
        server = start("nats-server", [binary, "-a", "127.0.0.1", "-p", str(port)], load_core)
        children.append(server)
        _wait_nats(server, port)
        nats_url = f"nats://127.0.0.1:{port}"
        prefix = f"bench-{secrets.token_hex(3)}"
        serve = [*_cli(), "serve", "--port", "0", "--log-level", "WARNING"]
        serve += ["--heartbeat-interval", "3600", "--nats", nats_url, "--nats-prefix", prefix]
        gateway = start_listening("agent-reach-nats", serve, gw_core, children)
        wait_http(gateway.url + "/healthz")
        cmd = [PY, str(HERE / "trivial_agent.py"), "--id", HTTP_AGENT, "--intent", INTENT]
        cmd += ["--register", gateway.url]
        http_agent = start_listening("agent-http", cmd, load_core, children)
        subject = f"bench.{secrets.token_hex(3)}.echo"
        cmd = [PY, str(HERE / "trivial_nats_agent.py"), "--nats", nats_url, "--subject", subject]
        cmd += ["--id", NATS_AGENT, "--intent", INTENT, "--register", gateway.url]
        nats_agent = start_listening("agent-nats", cmd, load_core, children, r"serving (nats:\S+)")
        yield NatsStack(server, gateway, http_agent, nats_agent, nats_url, prefix, subject)
    finally:
        for child in reversed(children):
            child.stop()


def server_version() -> str:
    binary = server_path()
    if binary is None:
        return "not installed"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout or out.stderr).strip().removeprefix("nats-server: ")


# --- measured runs ------------------------------------------------------------------------------


def _per_request(r: dict[str, Any], key: str, j0: int, j1: int) -> None:
    if r["requests"]:
        r[f"{key}_cpu_us_per_req"] = round((j1 - j0) / CLK_TCK * 1e6 / r["requests"], 1)


def _wrk_once(
    st: NatsStack, cores: Cores, url: str, body: str, conns: int, agent: Child | None
) -> Callable[[int], dict[str, Any]]:
    """A wrk run that also accounts nats-server's (and the agent's) CPU per request."""
    extra = {"nats": st.server.pid} | ({"agent": agent.pid} if agent else {})

    def once(seconds: int) -> dict[str, Any]:
        before = {k: jiffies(pid) for k, pid in extra.items()}
        r = wrk(
            url,
            body,
            conns,
            seconds,
            core=cores[1],
            gateway_pid=st.gateway.pid,
            ours=st.pids(),
            measured=False,
        )
        for k, pid in extra.items():
            _per_request(r, k, before[k], jiffies(pid))
        r["gw_busy_pct"] = round(
            r.get("gw_cpu_us_per_req", 0) * r["requests"] / r["duration_us"] * 100, 1
        )
        return r

    return once


def _read_line(
    proc: subprocess.Popen[bytes], prefix: bytes, deadline: float, buf: bytearray
) -> bytes:
    """The rest of the child's next stdout line that starts with ``prefix``, by ``deadline``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                if line.startswith(prefix):
                    return line[len(prefix) :]
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the NATS load generator printed no {prefix!r} line in time")
            if sel.select(left):
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(
                        f"the NATS load generator exited ({proc.wait(10)}); "
                        f"see {OUT / 'logs' / 'nats-load.err'}"
                    )
                buf += chunk


def _generator_once(
    st: NatsStack, cores: Cores, subject: str, body: str, conns: int
) -> Callable[[int], dict[str, Any]]:
    """A run of the load generator (this file, ``load``, on the load core): started and connected
    first, then told to go, so the window accounted covers its requests only."""

    def once(seconds: int) -> dict[str, Any]:
        cmd = [*pin(cores[1]), PY, str(HERE / "nats_load.py"), "--nats", st.nats_url]
        cmd += ["--subject", subject, "--body", body, "--concurrency", str(conns)]
        cmd += ["--duration", str(seconds)]
        (OUT / "logs").mkdir(parents=True, exist_ok=True)
        with (OUT / "logs" / "nats-load.err").open("ab") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                bufsize=0,
                cwd=HERE.parent,
                preexec_fn=die_with_parent,
            )
        try:
            assert proc.stdin is not None
            buf = bytearray()
            _read_line(proc, b"READY", time.monotonic() + READY_TIMEOUT_S, buf)
            ours = st.pids() | {proc.pid, os.getpid()}
            snap0, steal0, t0 = all_jiffies(), steal_jiffies(), time.monotonic()
            pids = {"gw": st.gateway.pid, "nats": st.server.pid, "gen": proc.pid}
            j0 = {k: jiffies(pid) for k, pid in pids.items()}
            proc.stdin.write(b"go\n")
            line = _read_line(proc, b"RESULT ", time.monotonic() + seconds + 30, buf)
            j1 = {k: jiffies(pid) for k, pid in pids.items()}
            elapsed = time.monotonic() - t0
            snap1, steal1 = all_jiffies(), steal_jiffies()
            proc.stdin.close()
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        r: dict[str, Any] = json.loads(line)
        _per_request(r, "gw", j0["gw"], j1["gw"])
        _per_request(r, "nats", j0["nats"], j1["nats"])
        if "gw_cpu_us_per_req" in r:
            r["gw_busy_pct"] = round(
                r["gw_cpu_us_per_req"] * r["requests"] / r["duration_us"] * 100, 1
            )
        r["gen_cpu_pct"] = round((j1["gen"] - j0["gen"]) * 100 / CLK_TCK / elapsed, 1)
        r["nats_busy_pct"] = round((j1["nats"] - j0["nats"]) * 100 / CLK_TCK / elapsed, 1)
        r["steal_pct"] = round((steal1 - steal0) * 100 / CLK_TCK / elapsed, 1)
        r["foreign_cpu_pct"], r["foreign_top"] = foreign_cpu(snap0, snap1, ours, elapsed)
        return r

    return once


def targets(kind: str, st: NatsStack, cores: Cores) -> tuple[list[str], One]:
    """The target names of measure ``kind`` (send_c32, send_c1, heartbeat) and how to run one."""
    send = st.gateway.url + "/v1/send"
    runs: dict[str, Callable[[int], dict[str, Any]]]
    if kind in ("send_c32", "send_c1"):
        conns = CONNS if kind == "send_c32" else 1
        runs = {
            "http": _wrk_once(st, cores, send, send_body(HTTP_AGENT), conns, st.http_agent),
            "nats": _wrk_once(st, cores, send, send_body(NATS_AGENT), conns, st.nats_agent),
        }
        if conns == 1:
            runs["direct"] = _wrk_once(st, cores, st.http_agent.url, DIRECT_BODY, 1, st.http_agent)
    elif kind == "heartbeat":
        runs = {
            "http": _wrk_once(
                st,
                cores,
                st.gateway.url + "/v1/heartbeat",
                json.dumps({"endpoint_id": HTTP_AGENT}),
                CONNS,
                None,
            ),
            "nats": _generator_once(
                st,
                cores,
                f"{st.prefix}.v1.heartbeat",
                json.dumps({"endpoint_id": NATS_AGENT}),
                CONNS,
            ),
        }
    else:
        raise ValueError(f"unknown NATS measure {kind!r}")

    def one(name: str, seconds: int, measured: bool) -> dict[str, Any]:
        return quiet_run(lambda: runs[name](seconds), st.pids(), measured)

    return list(runs), one


# --- the report ---------------------------------------------------------------------------------


def _us(runs: list[Run], key: str) -> str:
    return fmt_col(runs, f"{key}_cpu_us_per_req", " µs")


def _errors(*runs: list[Run]) -> int:
    return sum(r["errors"] for rs in runs for r in rs)


def _cpu_added(nats: list[Run], http: list[Run]) -> str:
    k = "gw_cpu_us_per_req"
    added = paired(nats, http, lambda n, h: n[k] - h[k])
    pct = paired(nats, http, lambda n, h: 100 * (n[k] / max(h[k], 1e-9) - 1))
    return f"{fmt_signed(added, ' µs')}, {fmt_signed(pct, ' %')}"


def _p50_added(a: list[Run], b: list[Run]) -> str:
    return fmt_signed(paired(a, b, lambda x, y: (x["p50_us"] - y["p50_us"]) / 1000), " ms", 3)


def report(rep: Rows, data: dict[str, Runs], prefix: str, subject: str) -> None:
    """Rows, notes and the zero-errors verdict of ``run.py nats``."""
    s32, s1, hb = data["send_c32"], data["send_c1"], data["heartbeat"]
    h, n = s32["http"], s32["nats"]

    def row(metric: str, figure: str, ratio: str = "", target: str = "info") -> None:
        rep.row("nats", metric, figure, ratio=ratio, target=target)

    send = f"POST /v1/send good answers/s, {CONNS} connections"
    row(f"{send}, to the HTTP agent", fmt_col(h, "rps"))
    row(
        "  latency p50 / p99; errors; gateway CPU per request",
        f"{fmt_ms(h)} / {fmt_ms(h, 'p99_us')}; {_errors(h)}; {_us(h, 'gw')}",
        target="0 errors",
    )
    row(f"{send}, to the NATS agent; ratio to HTTP", fmt_col(n, "rps"), fmt_ratio(n, h))
    row(
        "  latency p50 / p99; errors; gateway CPU per request, NATS minus HTTP (run by run)",
        f"{fmt_ms(n)} / {fmt_ms(n, 'p99_us')}; {_errors(n)}; {_us(n, 'gw')}, {_cpu_added(n, h)}",
        target="0 errors",
    )
    row(
        "  load core, CPU per request: nats-server (NATS / HTTP runs); agent (NATS / HTTP)",
        f"{_us(n, 'nats')} / {_us(h, 'nats')}; {_us(n, 'agent')} / {_us(h, 'agent')}",
    )

    h1, n1, d1 = s1["http"], s1["nats"], s1["direct"]
    row(
        "p50 at 1 caller (wrk -c1), to the HTTP agent; added over direct",
        f"{fmt_ms(h1, digits=3)}; {_p50_added(h1, d1)}",
    )
    row(
        "p50 at 1 caller (wrk -c1), to the NATS agent; added over direct; ratio to HTTP",
        f"{fmt_ms(n1, digits=3)}; {_p50_added(n1, d1)}",
        fmt_ratio(n1, h1, "p50_us"),
    )
    row(
        "  p50 NATS minus HTTP (run by run); p50 direct to the HTTP agent",
        f"{_p50_added(n1, h1)}; {fmt_ms(d1, digits=3)}",
    )
    row(
        "  p99 HTTP / NATS; gateway CPU per request HTTP / NATS; errors",
        f"{fmt_ms(h1, 'p99_us')} / {fmt_ms(n1, 'p99_us')}; {_us(h1, 'gw')} / {_us(n1, 'gw')}; "
        f"{_errors(h1, n1)}",
        target="0 errors",
    )

    hh, hn = hb["http"], hb["nats"]
    row(f"POST /v1/heartbeat answered/s over HTTP, {CONNS} connections (wrk)", fmt_col(hh, "rps"))
    row(
        "  gateway CPU per heartbeat; gateway core busy; errors",
        f"{_us(hh, 'gw')}; {fmt_col(hh, 'gw_busy_pct', ' %')}; {_errors(hh)}",
        target="0 errors",
    )
    row(
        f"heartbeats answered/s over NATS ({prefix}.v1.heartbeat), {CONNS} requests in flight "
        "(nats-py generator); ratio to HTTP",
        fmt_col(hn, "rps"),
        fmt_ratio(hn, hh),
    )
    row(
        "  gateway CPU per heartbeat, NATS minus HTTP (run by run); gateway core busy; errors",
        f"{_us(hn, 'gw')}, {_cpu_added(hn, hh)}; {fmt_col(hn, 'gw_busy_pct', ' %')}; {_errors(hn)}",
        target="0 errors",
    )
    row(
        "  load core: generator busy; nats-server CPU per heartbeat, busy; latency p50 / p99",
        f"{fmt_col(hn, 'gen_cpu_pct', ' %')}; {_us(hn, 'nats')}, "
        f"{fmt_col(hn, 'nats_busy_pct', ' %')}; {fmt_ms(hn)} / {fmt_ms(hn, 'p99_us')}",
    )

    for name, runs in (("send at 32", s32), ("send at 1", s1), ("heartbeats", hb)):
        rep.noise(f"nats {name}", [r for v in runs.values() for r in v])
    total = sum(_errors(v) for runs in data.values() for v in runs.values())
    rep.verdict(
        "nats: zero errors (sends and heartbeats, both ways)", total == 0, f"{total} errors"
    )
    rep.notes.append(
        f"nats: a private nats-server {server_version()}, both trivial agents, wrk and the NATS "
        "load generator on the load core (CPU 1), one gateway on CPU 0 (--nats, --nats-prefix "
        f"{prefix}); the NATS agent serves {subject} (nats-py, a task per request), the HTTP "
        "agent is trivial_agent.py; each send names its agent in recipient_hint. Heartbeats "
        f"over NATS come from one nats-py process keeping {CONNS} requests in flight (one reply "
        "inbox, a reply fires its slot's next request)."
    )
    gen = med([r["gen_cpu_pct"] for r in hn])
    load = med([r["gen_cpu_pct"] + r["nats_busy_pct"] for r in hn])
    busy = med([r.get("gw_busy_pct", 0.0) for r in hn])
    if load["median"] >= SATURATED_PCT:
        rep.notes.append(
            f"nats heartbeats: the load core was {fmt(load, ' %')} busy with the generator "
            f"({fmt(gen, ' %')}) and nats-server alone, the gateway's core {fmt(busy, ' %')}: "
            "the NATS heartbeats/s figure is the load side's limit (Python nats-py), not the "
            "gateway's; compare the gateway's CPU per heartbeat instead."
        )
    elif busy["median"] < SATURATED_PCT:
        cpu = med([r["gw_cpu_us_per_req"] for r in hn])["median"]
        rep.notes.append(
            f"nats heartbeats: neither the gateway's core ({fmt(busy, ' %')} busy) nor the load "
            f"core ({fmt(load, ' %')}: generator and nats-server) was saturated: {CONNS} requests "
            "in flight over a round trip of about the p50 bound the NATS heartbeats/s, not CPU; "
            f"at {cpu:.0f} µs per heartbeat the gateway's core alone would take about "
            f"{round(1e6 / max(cpu, 1e-9), -3):,.0f}/s (an extrapolation, not measured)."
        )
