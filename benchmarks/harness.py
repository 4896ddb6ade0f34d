"""Shared machinery of the benchmarks: child processes, wrk runs, CPU accounting, report
helpers, profiles.

- Children are started with their stdout/stderr in benchmarks/out/logs/, found ready by a
  bounded poll (never a fixed sleep), get SIGTERM if the runner dies (PR_SET_PDEATHSIG), and
  are stopped by the caller in a ``finally``.
- Every wrk run is bounded (its duration plus 30 s) and reports, besides wrk's own figures,
  the gateway's CPU per request (from /proc) and the CPU taken by processes outside the
  benchmark during the run, so that a noisy neighbour shows in the results.
- A measured run (``quiet_run``, which ``wrk`` uses) starts after a quiet window and is measured
  once more when noisy, the quieter of the two kept, within the budget of ``QUIET``.
- The nginx hop (``nginx_hop``): Debian's nginx started as a child with a generated config in a
  temporary directory, one process, proxying to an upstream with a keep-alive pool: the physical
  floor of a proxy hop on this machine.
- Token mode (``token_mode``): keys, a one-rule policy and tokens made in a temporary directory,
  the ``serve`` flags that use them, and ``register_with_token`` for an agent's registration.
- The report helpers (``fmt_col``, ``fmt_ms``, ``paired``, ``fmt_ratio``, ``fmt_signed``) only
  format: a figure is the median of the runs with their (min-max), a ratio or a difference is
  taken run by run (the runs of one round paired), then its median.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
LUA = HERE / "wrk_post.lua"
PY = sys.executable
READY_TIMEOUT_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOISY_PCT = 10.0  # CPU of other processes, in % of one core, above which a run is "noisy"
Cores = tuple[int | None, int | None]  # (gateways, load generator + agent)
Run = dict[str, Any]  # the figures of one run (wrk's, or a load generator's), by name
Runs = dict[str, list[Run]]  # the runs of each target of a measure, in the order measured

# --- processes --------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In the child: get SIGTERM when this runner dies (Linux), so no server outlives a crash."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """A server started by the benchmark, its stdout/stderr in benchmarks/out/logs/."""

    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    url: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_line(self, pattern: str, timeout: float = READY_TIMEOUT_S) -> str:
        """The first group of ``pattern`` in the child's stdout, polled for ``timeout`` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(self.stdout.read_text(errors="replace"))
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; "
                    f"see {self.stdout.with_suffix('.err')}"
                )
            time.sleep(0.02)  # polling interval, not a settle delay
        raise RuntimeError(f"{self.name} did not print its address within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def pin(core: int | None) -> list[str]:
    return ["taskset", "-c", str(core)] if core is not None else []


def start(name: str, cmd: list[str], core: int | None) -> Child:
    logs = OUT / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            pin(core) + cmd,
            stdout=fo,
            stderr=fe,
            stdin=subprocess.DEVNULL,
            cwd=HERE.parent,
            preexec_fn=die_with_parent,
        )
    return Child(name, proc, out)


def start_listening(
    name: str,
    cmd: list[str],
    core: int | None,
    children: list[Child],
    pattern: str = r"listening on (http://\S+)",
) -> Child:
    """``start``, the child added to ``children`` at once (the caller stops them, whatever
    happens), then its ``url``: the first group of ``pattern`` in its stdout (bounded poll)."""
    child = start(name, cmd, core)
    children.append(child)
    child.url = child.wait_line(pattern)
    return child


def wait_http(url: str, timeout: float = READY_TIMEOUT_S, child: Child | None = None) -> None:
    """Poll ``GET url`` until it answers 2xx, for at most ``timeout`` seconds (and fail at once
    when ``child``, the server behind it, has exited)."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout
    last: object = "no answer"
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise RuntimeError(
                f"{child.name} exited with {child.proc.returncode}; "
                f"see {child.stdout.with_suffix('.err')}"
            )
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=2)
        try:
            conn.request("GET", parts.path or "/")
            status = conn.getresponse().status
            if 200 <= status < 300:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = exc
        finally:
            conn.close()
        time.sleep(0.02)  # polling interval, not a settle delay
    raise RuntimeError(f"{url} not ready within {timeout} s: {last}")


def agent_reach_cli() -> list[str]:
    """The command that runs the gateway: the venv's ``agent-reach``, else ``python -m``."""
    script = Path(PY).parent / "agent-reach"
    return [str(script)] if script.exists() else [PY, "-m", "agent_reach"]


def free_port() -> int:
    """A port free on 127.0.0.1 now (for a server that cannot be told to pick one itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- the nginx hop ----------------------------------------------------------------------------

NGINX_CONF = """\
# generated by benchmarks/harness.py (nginx_hop); the command line adds "daemon off;"
# one process, so that the CPU it takes is that of one pid (a master would hand the requests
# to a worker process, out of the runner's sight): the same event loop as a worker's
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 1000000;  # callers' connections are never closed under load
    upstream agent {{
        server {upstream};
        keepalive 512;  # idle connections kept: more than the benchmark's callers
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://agent;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def nginx_path() -> str | None:
    """Debian's nginx (``apt-get install -y nginx-light`` or ``nginx``), else one on ``PATH``."""
    if os.access("/usr/sbin/nginx", os.X_OK):
        return "/usr/sbin/nginx"
    return shutil.which("nginx")


@contextlib.contextmanager
def nginx_hop(name: str, upstream_url: str, core: int | None) -> Iterator[Child]:
    """nginx proxying every request to ``upstream_url``'s host and port (the path is kept from
    the request), listening on a free 127.0.0.1 port; the child's ``url`` has the upstream's
    path, so that a POST to it reaches the same place as one to ``upstream_url``.

    Its config, pid file and temporary paths are in a temporary directory, its error log in
    benchmarks/out/logs/NAME.err; it is ready once a GET through it is answered (a bounded
    poll) and stopped (SIGTERM: a fast shutdown) on the way out, whatever happens.
    """
    nginx = nginx_path()
    if nginx is None:
        raise RuntimeError("nginx is not installed (apt-get install -y nginx-light)")
    target = urllib.parse.urlsplit(upstream_url)
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as prefix:
        conf = Path(prefix) / "nginx.conf"
        child: Child | None = None
        try:
            for attempt in range(3):  # the free port may be taken before nginx binds it
                port = free_port()
                conf.write_text(NGINX_CONF.format(prefix=prefix, upstream=target.netloc, port=port))
                cmd = [nginx, "-p", prefix, "-c", str(conf), "-e", "stderr"]
                child = start(name, [*cmd, "-g", "daemon off;"], core)
                child.url = f"http://127.0.0.1:{port}{target.path}"
                try:
                    wait_http(child.url, child=child)
                    break
                except RuntimeError:
                    child.stop()
                    if attempt == 2:
                        raise
            assert child is not None
            yield child
        finally:
            if child is not None:
                child.stop()


# --- token mode -------------------------------------------------------------------------------

CALLER_ID = "agent://bench-caller"  # the subject of the client token
TOKENS_POLICY = """\
[[reach]]
senders = ["agent://*"]
intents = ["*"]

[[claim]]
endpoints = ["agent://*"]
intents = ["*"]
"""


@dataclass
class TokenMode:
    """What a token-mode gateway and its callers need (files in the caller's directory)."""

    flags: list[str]  # ``serve`` flags: --auth tokens, --keys, --policy, the endpoint token TTL
    client: str  # a client token of ``CALLER_ID``, for ``Authorization: Bearer``
    enroll: str  # an enrollment token for any ``agent://`` endpoint and intent


def token_mode(directory: Path) -> TokenMode:
    """A signing key, ``TOKENS_POLICY`` and tokens (an hour long) in ``directory``."""
    from agent_reach.auth.keys import KeyRing, generate_key
    from agent_reach.auth.tokens import Kind, TokenService

    keys, policy = directory / "keys", directory / "policy.toml"
    generate_key(keys)
    policy.write_text(TOKENS_POLICY)
    ring = KeyRing(keys)
    ring.load()
    service = TokenService(ring)
    client, _ = service.issue(Kind.CLIENT, CALLER_ID, 3600)
    enroll, _ = service.issue(
        Kind.ENROLL, "bench-enroll", 3600, endpoints=["agent://*"], intents=["*"]
    )
    flags = ["--auth", "tokens", "--keys", str(keys), "--policy", str(policy)]
    flags += ["--endpoint-token-ttl", "86400"]  # at least 2 heartbeat intervals
    return TokenMode(flags, client, enroll)


def register_with_token(
    gateway: str, token: str, endpoint_id: str, intents: list[str], agent_url: str
) -> None:
    """Register an agent at a token-mode gateway with an enrollment token (the trivial agent
    registers itself only without one); RuntimeError unless it is registered."""
    body = json.dumps(
        {
            "endpoint_id": endpoint_id,
            "capabilities": intents,
            "endpoint_url": agent_url,
            "description": "benchmark trivial agent",
        }
    ).encode()
    req = urllib.request.Request(
        gateway.rstrip("/") + "/v1/register",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"register at {gateway}: {exc.code} {exc.read()[:300]!r}") from None
    if not answer.get("ok"):
        raise RuntimeError(f"register at {gateway} answered {answer}")


# --- what the gateway benchmarks send ---------------------------------------------------------

INTENT = "bench.echo"
AGENT_ID = "agent://bench-agent"
PAYLOAD = {"city": "Chengdu", "n": 1}
SEND_BODY = json.dumps({"intent": INTENT, "payload": PAYLOAD})  # POST /v1/send
DIRECT_BODY = json.dumps(  # what a gateway delivers to the agent
    {
        "msg_id": "msg_bench",
        "trace_id": "trace_bench",
        "sender": None,
        "recipient_hint": None,
        "intent": INTENT,
        "payload": PAYLOAD,
        "priority": "normal",
        "timeout_ms": 8000,
    }
)


def post(url: str, body: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """One POST (its own connection); the status and the raw answer."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("POST", parts.path, body=body.encode(), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


# --- measuring --------------------------------------------------------------------------------


def jiffies(pid: int) -> int:
    """utime + stime of ``pid`` (all its threads) in clock ticks; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def steal_jiffies() -> int:
    """CPU time the hypervisor gave to others (steal, all CPUs) in clock ticks since boot."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    except (OSError, IndexError, ValueError):
        return 0


def machine_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of the whole machine, every CPU, in clock ticks since boot: busy is
    user, nice, system, irq and softirq (what some process or the kernel on its behalf ran);
    all adds idle, iowait and steal."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, _steal = fields
    return user + nice + system + irq + softirq, sum(fields)


def all_jiffies() -> dict[int, tuple[str, int]]:
    """{pid: (command name, utime + stime)} of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                raw = f.read()
            comm = raw[raw.index("(") + 1 : raw.rindex(")")]
            fields = raw.rsplit(")", 1)[1].split()
            out[int(entry.name)] = (comm, int(fields[11]) + int(fields[12]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def foreign_cpu(
    before: dict[int, tuple[str, int]],
    after: dict[int, tuple[str, int]],
    ours: set[int],
    seconds: float,
) -> tuple[float, str]:
    """CPU taken by processes outside the benchmark, in % of one core, and the top three."""
    used: Counter[str] = Counter()
    for pid, (comm, j) in after.items():
        if pid not in ours:
            j0 = before[pid][1] if pid in before else 0
            if j > j0:
                used[f"{comm}[{pid}]"] += j - j0
    scale = 100 / CLK_TCK / max(seconds, 1e-9)
    top = ", ".join(f"{k} {v * scale:.0f}%" for k, v in used.most_common(3))
    return round(sum(used.values()) * scale, 1), top


class Quiet:
    """Waits, within a budget for the whole run, for other processes to leave the CPUs alone.

    On a shared machine (say, another engineer's test suite) a measured run starts once the CPU
    taken by processes outside the benchmark is below ``NOISY_PCT`` over a 0.5 s window, and a
    run that was noisy anyway is measured once more (the quieter of the two is kept).
    """

    def __init__(self) -> None:
        self.budget_s = 0.0
        self.waited_s = 0.0
        self.reruns = 0

    def wait(self, ours: set[int]) -> None:
        while self.waited_s < self.budget_s:
            snap0, t0 = all_jiffies(), time.monotonic()
            time.sleep(0.5)  # the sampling window
            seconds = time.monotonic() - t0
            busy, _ = foreign_cpu(snap0, all_jiffies(), ours | {os.getpid()}, seconds)
            if busy < NOISY_PCT:
                return
            self.waited_s += seconds


QUIET = Quiet()


def quiet_run(once: Callable[[], Run], ours: set[int], measured: bool) -> Run:
    """``once()`` after a quiet window when ``measured``, and once more if it was noisy (the
    quieter kept): what ``wrk`` does, for runs that are not (only) a wrk run.

    ``once`` must return the run's ``foreign_cpu_pct``; ``ours`` are the benchmark's processes,
    not counted as other processes' CPU. Unmeasured (warm-up) runs go straight to ``once()``.
    """
    if not measured:
        return once()
    QUIET.wait(ours)
    r = once()
    if r["foreign_cpu_pct"] >= 2 * NOISY_PCT and QUIET.waited_s < QUIET.budget_s:
        QUIET.reruns += 1
        QUIET.wait(ours)
        again = once()
        if again["foreign_cpu_pct"] < r["foreign_cpu_pct"]:
            r = again
    return r


def wrk(
    url: str,
    body: str,
    conns: int,
    duration: int,
    *,
    core: int | None,
    gateway_pid: int | None,
    ours: set[int],
    measured: bool = True,
    headers: dict[str, str] | None = None,
    script: Path = LUA,
    busy: bool = False,
) -> Run:
    """One wrk run, after a quiet window when ``measured``, and once more if it was noisy;
    ``headers`` are added to every request (``-H``: ``Authorization`` in token mode).

    ``script`` is the wrk script (wrk_post.lua by default; another must print the same WRKJSON
    line, and may add an ``rpcerror`` count); ``busy`` adds ``gw_busy_pct``, the gateway's CPU
    over the run's wall time in % of one core.
    """
    kw: dict[str, Any] = {"core": core, "gateway_pid": gateway_pid, "ours": ours}
    kw |= {"headers": headers, "script": script, "busy": busy}
    return quiet_run(lambda: _wrk(url, body, conns, duration, **kw), ours, measured)


def _wrk(
    url: str,
    body: str,
    conns: int,
    duration: int,
    *,
    core: int | None,
    gateway_pid: int | None,
    ours: set[int],
    headers: dict[str, str] | None = None,
    script: Path = LUA,
    busy: bool = False,
) -> Run:
    """One wrk run of ``script``: its WRKJSON figures plus good answers/s, errors, gateway CPU per
    request (and the gateway's busy share when ``busy``)."""
    cmd = [*pin(core), "wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "10s"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]  # set before the script runs, which keeps them
    cmd += ["-s", str(script), url]
    snap0, steal0, machine0 = all_jiffies(), steal_jiffies(), machine_jiffies()
    g0 = jiffies(gateway_pid) if gateway_pid else 0
    t0 = time.monotonic()
    with subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "WRK_BODY": body},
        preexec_fn=die_with_parent,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=duration + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)
            raise RuntimeError(f"wrk on {url} did not finish in {duration + 30} s") from None
    elapsed = time.monotonic() - t0
    g1 = jiffies(gateway_pid) if gateway_pid else 0
    snap1, steal1, machine1 = all_jiffies(), steal_jiffies(), machine_jiffies()
    m = re.search(rb"WRKJSON (\{.*\})", stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {stderr.decode()[-500:]}")
    r: Run = json.loads(m.group(1))
    r["errors"] = sum(r[k] for k in ("non200", "badbody", "connect", "read", "write", "timeout"))
    r["errors"] += r.get("rpcerror", 0)  # JSON-RPC errors (wrk_a2a.lua); wrk_post.lua has none
    # good answers only: a gateway that fails fast must not look fast
    r["rps"] = round(max(0, r["requests"] - r["errors"]) / (r["duration_us"] / 1e6), 1)
    if gateway_pid and r["requests"]:
        r["gw_cpu_us_per_req"] = round((g1 - g0) / CLK_TCK * 1e6 / r["requests"], 1)
    if gateway_pid and busy:
        r["gw_busy_pct"] = round((g1 - g0) * 100 / CLK_TCK / elapsed, 1)
    r["steal_pct"] = round((steal1 - steal0) * 100 / CLK_TCK / elapsed, 1)
    busy, every = machine1[0] - machine0[0], machine1[1] - machine0[1]
    # the whole machine: every process (wrk and the agent too) and the kernel's work for them
    r["machine_busy_pct"] = round(busy * 100 / every, 1) if every else 0.0
    if r["requests"]:
        r["machine_cpu_us_per_req"] = round(busy / CLK_TCK * 1e6 / r["requests"], 1)
    r["foreign_cpu_pct"], r["foreign_top"] = foreign_cpu(
        snap0, snap1, ours | {os.getpid()}, elapsed
    )
    return r


def med(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict[str, float], unit: str = "", digits: int = 0) -> str:
    f = f"{{:,.{digits}f}}"
    text = f.format(s["median"]) + unit
    if f.format(s["min"]) == f.format(s["max"]):
        return text
    return f"{text} ({f.format(s['min'])}-{f.format(s['max'])})"


# --- report helpers ---------------------------------------------------------------------------


class Rows(Protocol):
    """What of run.py's Report a benchmark module's ``report`` writes to."""

    notes: list[str]

    def row(self, bench: str, metric: str, ar: str, *, ratio: str = "", target: str = "") -> None:
        """One row of the table: the Agent-Reach figure ``ar``, a ``ratio`` and a ``target``."""

    def verdict(self, name: str, ok: bool, detail: str) -> None:
        """One target, met or not."""

    def noise(self, name: str, runs: list[Run]) -> None:
        """A note when other processes or the hypervisor took CPU during ``runs``."""


def fmt_col(runs: list[Run], key: str, unit: str = "", digits: int = 0, div: float = 1) -> str:
    """``fmt`` of ``key / div`` over the runs that have ``key``; "-" when none has it."""
    values = [r[key] / div for r in runs if key in r]
    return fmt(med(values), unit, digits) if values else "-"


def fmt_ms(runs: list[Run], key: str = "p50_us", digits: int = 2) -> str:
    """``fmt_col`` of a latency in µs (``key``), shown in ms."""
    return fmt_col(runs, key, " ms", digits, 1000)


def paired(a: list[Run], b: list[Run], f: Callable[[Run, Run], float]) -> dict[str, float]:
    """``f`` of the runs of a and b measured in the same round, then their median (``med``)."""
    return med([f(x, y) for x, y in zip(a, b, strict=True)])


def fmt_ratio(a: list[Run], b: list[Run], key: str = "rps") -> str:
    """``a[key] / b[key]`` run by run, their median (min-max), as "1.23x"."""
    return fmt(paired(a, b, lambda x, y: x[key] / max(y[key], 1e-9)), "x", 2)


def fmt_signed(s: dict[str, float], unit: str, digits: int = 0) -> str:
    """``fmt`` for a difference: signed, the range as (min to max)."""
    f = f"{{:+,.{digits}f}}"
    text = f.format(s["median"]) + unit
    if f.format(s["min"]) == f.format(s["max"]):
        return text
    return f"{text} ({f.format(s['min'])} to {f.format(s['max'])})"


# --- profile of a missed target ---------------------------------------------------------------

_ENTRY = ("<module>", "click/", "agent_reach/cli.py", "asyncio/runners.py")


def summarize_profile(raw: str, top: int = 12) -> str:
    """Where on-CPU samples of py-spy's raw (collapsed) stacks go: by package, and by function."""
    pkg: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        if " " not in line:
            continue
        stack, n_s = line.rsplit(" ", 1)
        n = int(n_s)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        last = frames[-1]
        if "asyncio/runners.py" in last:
            pkg["(C: uvloop, sockets, parser; or idle in the loop)"] += n
        else:
            m = re.search(r"\(([^/)]+)", last)
            pkg[m.group(1) if m else "?"] += n
        leaf[last] += n
        for f in set(frames):
            if "agent_reach/" in f and not any(e in f for e in _ENTRY):
                ours[f] += n
    if not total:
        return "(no samples)"

    def pct(n: int) -> str:
        return f"{100 * n / total:5.1f}%"

    lines = [f"{total} on-CPU samples", "", "self time by package:"]
    lines += [f"  {pct(n)}  {k}" for k, n in pkg.most_common(8)]
    lines += ["", "self time by function:"]
    lines += [f"  {pct(n)}  {k}" for k, n in leaf.most_common(top)]
    lines += ["", "Agent-Reach functions, inclusive (what they call included):"]
    lines += [f"  {pct(n)}  {k}" for k, n in ours.most_common(top + 4)]
    return "\n".join(lines)


def profile(pid: int, url: str, body: str, conns: int, cores: Cores, seconds: int = 6) -> str:
    """py-spy samples of process ``pid`` while wrk loads ``url``, summarized."""
    pyspy = shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")
    if not pyspy:
        return "(py-spy is not installed: `.venv/bin/pip install py-spy` to get a profile here)"
    raw = OUT / f"profile-c{conns}-{url.rsplit('/', 1)[1]}.txt"
    cmd = [*pin(cores[1]), "wrk", "-t1", f"-c{conns}", f"-d{seconds + 3}s", "--timeout", "10s"]
    load = subprocess.Popen(
        [*cmd, "-s", str(LUA), url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "WRK_BODY": body},
        preexec_fn=die_with_parent,
    )
    try:
        time.sleep(1.0)  # the load reaches its steady state before sampling starts
        spy = [pyspy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250"]
        proc = subprocess.run(
            [*spy, "-f", "raw", "-o", str(raw)], capture_output=True, timeout=seconds + 30
        )
        if proc.returncode != 0 or not raw.exists():
            return f"(py-spy failed: {proc.stderr.decode()[-300:]})"
        return summarize_profile(raw.read_text())
    finally:
        load.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            load.wait(timeout=10)
        if load.poll() is None:
            load.kill()
            load.wait(timeout=10)


# --- environment ------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    v = {"python": platform.python_version()}
    for pkg in (
        "agent-reach-gateway",
        "aiohttp",
        "msgspec",
        "uvloop",
        "fastapi",
        "starlette",
        "pydantic",
        "uvicorn",
        "httpx",
        "httpcore",
        "anyio",
    ):
        try:
            v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            v[pkg] = "not installed"
    v["sniffio"] = "installed" if importlib.util.find_spec("sniffio") else "not installed"
    try:
        out = subprocess.run(["wrk", "-v"], capture_output=True, timeout=10)
        v["wrk"] = (out.stdout + out.stderr).decode().splitlines()[0].split(" [")[0]
        v["wrk"] = v["wrk"].removeprefix("wrk ").strip()
    except (OSError, IndexError, subprocess.TimeoutExpired):
        v["wrk"] = "not found"
    return v


def source_revision() -> str:
    """The commit of the tree under test, and whether src/ has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=HERE.parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=HERE.parent,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{rev or 'unknown'}{' + uncommitted changes in src/' if dirty else ''}"


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.0f} GiB"
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "loadavg_at_start": load,
    }
