"""What the reliability suite's scenarios share: the scale, a load driver, chaos agents, figures.

Scale: every scenario runs in a SMOKE version (seconds; what ``make test`` runs) unless
``AGENT_REACH_CHAOS=full`` (``make chaos``) asks for the FULL one, with the issue's durations.
:func:`pick` chooses a value by scale; :data:`full_only` skips a test outside the full run.

The load driver (:class:`Load`) sends ``POST /v1/send`` from a process of its own
(tests/chaos/drive.py), open loop at a fixed rate or closed loop from N callers, bounded in
count (outstanding requests) and in time, and records each request: start, end, HTTP status,
error code, the endpoint that answered and every attempt. Faults are injected from the test
meanwhile, timestamped on the same monotonic clock (the machine's).

Each scenario prints one line ``CHAOS {json}`` with its figures and goals (run pytest with
``-s`` to see them) and, when ``AGENT_REACH_CHAOS_OUT`` names a file, appends it there.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, Proc, free_port, http, start_sdk_agent

FULL = os.environ.get("AGENT_REACH_CHAOS", "").strip().lower() == "full"
SCALE = "full" if FULL else "smoke"
AGENT = ROOT / "tests" / "chaos" / "agent.py"
DRIVE = ROOT / "tests" / "chaos" / "drive.py"
LATE_SLACK_MS = 50.0  # an answer later than its deadline by more than this is late (scenario 12)

full_only = pytest.mark.skipif(
    not FULL, reason="full version only: make chaos (AGENT_REACH_CHAOS=full)"
)


def pick(smoke: Any, full: Any) -> Any:
    """``full`` in the full run, else ``smoke``."""
    return full if FULL else smoke


def bounded(smoke_s: float, full_s: float) -> pytest.MarkDecorator:
    """The test's timeout (pytest-timeout) by scale: a backstop over its own bounds."""
    mark: pytest.MarkDecorator = pytest.mark.timeout(pick(smoke_s, full_s))
    return mark


# --- figures -------------------------------------------------------------------------------


def pct(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when there are none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def report(
    scenario: str, name: str, figures: dict[str, Any], goals: dict[str, str], met: bool
) -> dict[str, Any]:
    """Print (and append to ``$AGENT_REACH_CHAOS_OUT``) the scenario's line; ``met``: whether
    the figures meet the issue's goals (whatever the scale)."""
    line = {
        "scenario": scenario,
        "name": name,
        "scale": SCALE,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "figures": figures,
        "goals": goals,
        "goal_met": met,
    }
    text = json.dumps(line, default=_rounded)
    print(f"\nCHAOS {text}", flush=True)
    out = os.environ.get("AGENT_REACH_CHAOS_OUT")
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")
    return line


def _rounded(value: Any) -> Any:
    return str(value)


def r3(value: float) -> float:
    return round(value, 3)


# --- the load driver -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One request the driver sent and what came of it (times: ``time.monotonic()``)."""

    start: float
    end: float
    status: int  # the HTTP status; 0 when no answer came (the client's own timeout or error)
    error: str  # the contract's error code; "" on success; "client: ..." with no answer
    endpoint: str  # the endpoint that answered ("" when none)
    attempts: tuple[tuple[str, str], ...]  # (endpoint_id, outcome) of each attempt
    timeout_ms: float
    priority: str
    kind: str  # the scenario's label for the request's body
    # the answer's latency_ms: the gateway's own time from the request's last byte read to its
    # answer (None: no answer, or an answer without it); the rest of latency_ms is outside it
    gateway_ms: float | None = None

    @property
    def latency_ms(self) -> float:
        return (self.end - self.start) * 1000

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def late(self) -> bool:
        """Answered (or given up) later than its deadline plus :data:`LATE_SLACK_MS`."""
        return self.latency_ms > self.timeout_ms + LATE_SLACK_MS

    def touched(self, endpoint_id: str) -> bool:
        """Whether any attempt of this request went to ``endpoint_id``."""
        return any(eid == endpoint_id for eid, _ in self.attempts)


Bodies = list[dict[str, Any]]


def echo(intent: str = "test.echo", timeout_ms: float = 8000, priority: str = "normal") -> Bodies:
    """The same small request each time."""
    return [{"intent": intent, "timeout_ms": int(timeout_ms), "priority": priority, "payload": {}}]


class Load:
    """Requests to ``url``'s ``/v1/send`` from a process of its own (tests/chaos/drive.py), for
    ``duration`` seconds.

    ``rate``: open loop, that many requests a second whatever the answers (a request due while
    ``max_outstanding`` are unanswered is not sent, and counted in ``skipped``); ``callers``:
    closed loop, each caller sends its next request when its last is answered. Request i sends
    ``bodies[i % len(bodies)]``, ``{i}`` in its strings replaced by i (``_kind`` in it labels
    the request and is not sent). Every request has a client timeout of its ``timeout_ms`` plus
    10 s, so that none is waited on forever. :meth:`start` returns once the driver sends;
    ``started_at`` is then its first instant (the machine's monotonic clock, as
    ``time.monotonic()`` here).
    """

    def __init__(
        self,
        url: str,
        bodies: Bodies,
        *,
        duration: float,
        rate: float | None = None,
        callers: int | None = None,
        max_outstanding: int = 2000,
    ) -> None:
        assert (rate is None) != (callers is None), "rate or callers"
        self.spec = {
            "url": f"{url}/v1/send",
            "bodies": bodies,
            "duration": duration,
            "rate": rate,
            "callers": callers,
            "max_outstanding": max_outstanding,
        }
        self.duration = duration
        self.results: list[Sent] = []
        self.skipped = 0
        self.started_at = math.nan
        self._dir = Path(tempfile.mkdtemp(prefix="agent-reach-load-"))
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self, bound: float = 15.0) -> Load:
        spec = self._dir / "spec.json"
        spec.write_text(json.dumps(self.spec))
        cmd = [sys.executable, str(DRIVE), str(spec), str(self._dir / "results.json")]
        self._popen = popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=ROOT)
        assert popen.stdout is not None
        ready, _, _ = select.select([popen.stdout], [], [], bound)
        line = popen.stdout.readline() if ready else b""
        if not line.startswith(b"started "):
            popen.kill()
            popen.wait(5)
            raise AssertionError(f"the load driver did not start within {bound} s: {line!r}")
        self.started_at = float(line.split()[1])
        return self

    def stop(self) -> None:
        """End the load early (requests in flight are still waited for)."""
        if self._popen is not None and self._popen.poll() is None:
            self._popen.send_signal(signal.SIGTERM)

    def join(self, timeout: float | None = None) -> list[Sent]:
        """Wait for the load to end (``duration`` plus the answers of the last requests)."""
        popen = self._popen
        assert popen is not None, "not started"
        bound = timeout if timeout is not None else self.duration + 30
        try:
            code = popen.wait(bound)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)
            raise AssertionError(f"the load did not end within {bound} s") from None
        finally:
            if popen.stdout is not None:
                popen.stdout.close()
        assert code == 0, f"the load driver failed ({code})"
        out = json.loads((self._dir / "results.json").read_text())
        shutil.rmtree(self._dir, ignore_errors=True)
        self.skipped = out["skipped"]
        self.results = sorted((_sent(row) for row in out["rows"]), key=lambda s: s.start)
        return self.results

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, kind: object, *_: object) -> None:
        """Wait for the load to run its course (end it at once when the block raised)."""
        if kind is not None:
            self.stop()
        self.join()


def _sent(row: list[Any]) -> Sent:
    start, end, status, error, endpoint, attempts, timeout_ms, priority, kind, gateway_ms = row
    return Sent(
        start=start,
        end=end,
        status=status,
        error=error,
        endpoint=endpoint,
        attempts=tuple((eid, outcome) for eid, outcome in attempts),
        timeout_ms=timeout_ms,
        priority=priority,
        kind=kind,
        gateway_ms=gateway_ms,
    )


def window(
    results: Iterable[Sent], since: float = -math.inf, until: float = math.inf
) -> list[Sent]:
    """The requests started in [since, until)."""
    return [s for s in results if since <= s.start < until]


Window = tuple[bool, float, float]  # (a fault phase?, from, until)


def take_turns(
    rounds: int,
    calm: Callable[[int], tuple[float, float]],
    fault: Callable[[int], tuple[float, float]],
) -> list[Window]:
    """Rounds of a calm phase and a fault phase, in the order CF FC CF ..., each phase run by
    its function (the round's number given), which returns when the phase is over with the
    window of it that is measured. Interleaved, a spell of the machine's own noise (a two-core
    VM's neighbours) falls on both sides of a comparison rather than on one."""
    windows: list[Window] = []
    for r in range(rounds):
        for is_fault in (False, True) if r % 2 == 0 else (True, False):
            since, until = (fault if is_fault else calm)(r)
            windows.append((is_fault, since, until))
    return windows


@dataclass
class Phases:
    """The requests of every calm window and of every fault window of :func:`take_turns`, and
    each round's pair of p99s."""

    quiet: list[Sent] = field(default_factory=list)
    loud: list[Sent] = field(default_factory=list)
    rounds: list[tuple[float, float]] = field(default_factory=list)  # (quiet, loud) p99s
    sent: list[Sent] = field(default_factory=list)  # every request

    @classmethod
    def split(cls, sent: list[Sent], windows: list[Window]) -> Phases:
        """Each request counted in the window it started in (none when it started outside)."""
        phases = cls(sent=sent)
        for i in range(0, len(windows) - 1, 2):  # a round's two windows, in either order
            pair = {}
            for is_loud, since, until in windows[i : i + 2]:
                part = window(sent, since, until)
                (phases.loud if is_loud else phases.quiet).extend(part)
                pair[is_loud] = pct(latencies(part), 99)
            phases.rounds.append((pair[False], pair[True]))
        return phases

    def figures(self) -> dict[str, Any]:
        ratios = [loud / quiet for quiet, loud in self.rounds]
        return {
            "rounds": len(self.rounds),
            "per_side": [len(self.quiet), len(self.loud)],
            "round_p99s_ms": [[r3(q), r3(loud)] for q, loud in self.rounds],
            "round_ratio_median": r3(statistics.median(ratios)) if ratios else None,
        }


def worst(results: Iterable[Sent], n: int = 5) -> list[list[float | None]]:
    """The ``n`` slowest requests as ``[client ms, gateway ms]``: what the gateway's own
    ``latency_ms`` does not cover was spent in the sockets, the kernel or the client."""
    slowest = sorted(results, key=lambda s: s.latency_ms, reverse=True)[:n]
    return [[r3(s.latency_ms), None if s.gateway_ms is None else r3(s.gateway_ms)] for s in slowest]


def errors(results: Iterable[Sent]) -> Counter[str]:
    """The failed requests by error code."""
    return Counter(s.error or str(s.status) for s in results if not s.ok)


def share(results: Sequence[Sent], endpoint_id: str) -> float:
    """The part of ``results`` that had an attempt on ``endpoint_id``."""
    if not results:
        return math.nan
    return sum(s.touched(endpoint_id) for s in results) / len(results)


def latencies(results: Iterable[Sent]) -> list[float]:
    return [s.latency_ms for s in results]


# --- processes -----------------------------------------------------------------------------


def chaos_agent(gw: str, endpoint_id: str, *flags: str, intents: str = "test.echo") -> Proc:
    """A tests/chaos/agent.py process, registered when this returns (``flags``: its options)."""
    cmd = [sys.executable, str(AGENT), "--gateway", gw, "--id", endpoint_id]
    # AGENT_REACH_SERVE empty: it serves over HTTP whatever the NATS switch says
    return start_sdk_agent([*cmd, "--intents", intents, *flags], env={"AGENT_REACH_SERVE": ""})


def in_parallel(start: Callable[[int], Proc], n: int) -> list[Proc]:
    """``start(0) ... start(n - 1)`` at once (each process waited for on a thread)."""
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(start, range(n)))


def base(proc: Proc) -> str:
    """A chaos agent's base URL (its printed URL without ``/reach``)."""
    return proc.url.rsplit("/", 1)[0]


def control(proc: Proc, **change: Any) -> None:
    """Change a chaos agent's behaviour (``delay_ms``, ``error_rate``, ``hang``, ...)."""
    status, answer = http("POST", f"{base(proc)}/control", change, timeout=5)
    assert status == 200, answer


def stats(proc: Proc) -> dict[str, Any]:
    """What a chaos agent saw (``received``, answers by status, ``inflight``, ``retries``)."""
    status, answer = http("GET", f"{base(proc)}/stats", timeout=5)
    assert status == 200, answer
    return dict(answer)


def reset_stats(proc: Proc) -> None:
    status, answer = http("POST", f"{base(proc)}/stats/reset", timeout=5)
    assert status == 200, answer


@contextmanager
def stopping(procs: list[Proc]) -> Iterator[list[Proc]]:
    """Stop every process in ``procs`` afterwards (including those added meanwhile)."""
    try:
        yield procs
    finally:
        for proc in reversed(procs):
            proc.stop(timeout=3)


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` now, SIGCONT when the block ends (whatever happens in it)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def rss_mb(pid: int) -> float:
    """The resident set of ``pid`` in MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _socket_ports(pid: int) -> dict[str, int]:
    """Socket inode -> local port of every TCP socket in ``pid``'s network namespace."""
    ports = {}
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            ports[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    return ports


def fds_by_kind(pid: int, port: int) -> dict[str, int]:
    """``pid``'s open files by kind: ``inbound`` (TCP sockets on ``port``, the listener and its
    clients' connections), ``outbound`` (other TCP sockets: the pools to agents and stores) and
    ``other`` (files, pipes, the event loop's epoll, unix and UDP sockets, and TCP sockets not
    yet bound). The files are listed first and the TCP tables read after, once more when a
    socket is missing from them (opened in between)."""
    inodes: list[str | None] = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:  # closed meanwhile
            continue
        inodes.append(target[len("socket:[") : -1] if target.startswith("socket:[") else None)
    ports = _socket_ports(pid)
    if any(i is not None and i not in ports for i in inodes):
        ports = _socket_ports(pid)
    kinds = {"inbound": 0, "outbound": 0, "other": 0}
    for inode in inodes:
        if inode is None or inode not in ports:
            kinds["other"] += 1
        else:
            kinds["inbound" if ports[inode] == port else "outbound"] += 1
    return kinds


def agents_listed(gw: str) -> dict[str, str]:
    """The gateway's table: endpoint id -> status."""
    status, body = http("GET", f"{gw}/v1/agents", timeout=10)
    assert status == 200, body
    return {a["endpoint_id"]: a["status"] for a in body["agents"]}


class Poller:
    """Calls ``probe()`` every ``every`` seconds on a thread of its own, keeping (time, value)
    samples, until stopped."""

    def __init__(self, probe: Callable[[], Any], every: float = 0.1) -> None:
        self.probe = probe
        self.every = every
        self.samples: list[tuple[float, Any]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-poll")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.probe()))
            except (OSError, AssertionError, ValueError) as exc:
                self.failures.append(repr(exc))
            self._stop.wait(self.every)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


# --- a private Redis -----------------------------------------------------------------------


@dataclass
class PrivateRedis:
    """A redis-server of the scenario's own on a free port, without persistence (a restart
    comes back EMPTY): never the machine's Redis."""

    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="agent-reach-chaos-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, bound: float = 10.0) -> None:
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server on PATH")
        cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--dir", self.workdir, "--daemonize", "no"]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + bound
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    if client.ping():
                        return
            except redis.RedisError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on {self.port}") from None
            time.sleep(0.02)  # polling interval, not a settle delay

    def kill(self) -> None:
        """SIGKILL: a crash, nothing saved."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        self.popen = None

    def ids(self, prefix: str) -> set[str]:
        """The endpoint ids Redis holds under ``prefix`` now (its last-seen set)."""
        import redis

        with redis.Redis(port=self.port, socket_timeout=1, decode_responses=True) as client:
            return set(client.zrange("{" + prefix + "}:seen", 0, -1))


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(server.workdir, ignore_errors=True)
