"""Shared machinery of the benchmarks: child processes, wrk runs, CPU accounting, profiles.

- Children are started with their stdout/stderr in benchmarks/out/logs/, found ready by a
  bounded poll (never a fixed sleep), get SIGTERM if the runner dies (PR_SET_PDEATHSIG), and
  are stopped by the caller in a ``finally``.
- Every wrk run is bounded (its duration plus 30 s) and reports, besides wrk's own figures,
  the gateway's CPU per request (from /proc) and the CPU taken by processes outside the
  benchmark during the run, so that a noisy neighbour shows in the results.
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
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
LUA = HERE / "wrk_post.lua"
PY = sys.executable
READY_TIMEOUT_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOISY_PCT = 10.0  # CPU of other processes, in % of one core, above which a run is "noisy"
Cores = tuple[int | None, int | None]  # (gateways, load generator + agent)

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


def wait_http(url: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``GET url`` until it answers 2xx, for at most ``timeout`` seconds."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout
    last: object = "no answer"
    while time.monotonic() < deadline:
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
) -> dict[str, Any]:
    """One wrk run, after a quiet window when ``measured``, and once more if it was noisy;
    ``headers`` are added to every request (``-H``: ``Authorization`` in token mode)."""
    kw: dict[str, Any] = {"core": core, "gateway_pid": gateway_pid, "ours": ours}
    kw["headers"] = headers
    if not measured:
        return _wrk(url, body, conns, duration, **kw)
    QUIET.wait(ours)
    r = _wrk(url, body, conns, duration, **kw)
    if r["foreign_cpu_pct"] >= 2 * NOISY_PCT and QUIET.waited_s < QUIET.budget_s:
        QUIET.reruns += 1
        QUIET.wait(ours)
        again = _wrk(url, body, conns, duration, **kw)
        if again["foreign_cpu_pct"] < r["foreign_cpu_pct"]:
            r = again
    return r


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
) -> dict[str, Any]:
    """One wrk run: its WRKJSON figures plus good answers/s, errors, gateway CPU per request."""
    cmd = [*pin(core), "wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--timeout", "10s"]
    for name, value in (headers or {}).items():
        cmd += ["-H", f"{name}: {value}"]  # set before wrk_post.lua runs, which keeps them
    cmd += ["-s", str(LUA), url]
    snap0, steal0 = all_jiffies(), steal_jiffies()
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
    snap1, steal1 = all_jiffies(), steal_jiffies()
    m = re.search(rb"WRKJSON (\{.*\})", stdout)
    if proc.returncode != 0 or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {stderr.decode()[-500:]}")
    r: dict[str, Any] = json.loads(m.group(1))
    r["errors"] = sum(r[k] for k in ("non200", "badbody", "connect", "read", "write", "timeout"))
    # good answers only: a gateway that fails fast must not look fast
    r["rps"] = round(max(0, r["requests"] - r["errors"]) / (r["duration_us"] / 1e6), 1)
    if gateway_pid and r["requests"]:
        r["gw_cpu_us_per_req"] = round((g1 - g0) / CLK_TCK * 1e6 / r["requests"], 1)
    r["steal_pct"] = round((steal1 - steal0) * 100 / CLK_TCK / elapsed, 1)
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
