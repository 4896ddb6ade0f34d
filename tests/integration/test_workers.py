"""``agent-reach serve --workers N``: several gateway processes on one port over the shared
registry (the real Redis at 127.0.0.1:6379, a key prefix of the test's own).

Shown: refused on ``memory://`` (exit 2, a message naming the fix); on Redis, the listening line
names the worker pids, an agent registered through one worker is seen through every fresh
connection, sends on fresh connections all succeed and both workers take a share of them; a
worker killed with SIGKILL is replaced (and the replacement takes its share) while the other
serves on; SIGTERM to the supervisor ends every worker."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import (
    MCP_ACCEPT,
    MCP_INITIALIZE,
    REDIS_URL,
    ROOT,
    Proc,
    drop_prefix,
    http,
    http_full,
    start_agent,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)

SERVE = [sys.executable, "-m", "agent_reach", "serve", "--port", "0"]


def test_workers_on_the_memory_registry_are_refused() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_REACH_")}
    proc = subprocess.run(
        [*SERVE, "--registry", "memory://", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--workers 2 needs a shared registry" in proc.stderr
    assert "redis://" in proc.stderr  # says what to use instead
    assert "listening" not in proc.stdout


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited and been reaped (a zombie is not gone: a zombie group leader
    may still have threads that hold its sockets)."""
    return not Path(f"/proc/{pid}").exists()


def sends(url: str, n: int, threads: int = 4) -> list[int]:
    """``n`` sends, each on a fresh connection (urllib does not keep connections alive)."""

    def one(_: int) -> int:
        code, body = http("POST", f"{url}/v1/send", {"intent": "test.echo"}, timeout=10)
        assert code != 200 or body["result"]["agent"] == "agent://workers-echo-01", body
        return code

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


def start_supervisor(cmd: list[str], timeout: float = 30.0) -> tuple[Proc, str]:
    """Start ``cmd`` and return it with its listening line, read within ``timeout`` s."""
    log = Path(tempfile.mkstemp(prefix="agent-reach-workers-", suffix=".log")[1])
    with log.open("wb") as err:
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
    assert popen.stdout is not None
    os.set_blocking(popen.stdout.fileno(), False)
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        if popen.poll() is not None or time.monotonic() > deadline:
            popen.kill()
            popen.wait()
            raise RuntimeError(f"{cmd} did not start: {buf!r} {log.read_text()[-2000:]}")
        buf += popen.stdout.read() or b""
        time.sleep(0.02)  # polling interval, not a settle delay
    line = buf.decode().splitlines()[0]
    url = re.search(r"listening on (http://\S+)", line)
    assert url, line
    return Proc(popen, url[1], log), line


@pytest.fixture
def supervisor() -> Iterator[tuple[Proc, str]]:
    """``serve --workers 2`` on Redis, and its listening line."""
    prefix = f"test-{os.urandom(6).hex()}"
    cmd = [*SERVE, "--registry", REDIS_URL, "--registry-prefix", prefix, "--workers", "2"]
    proc, line = start_supervisor([*cmd, "--heartbeat-interval", "5"])
    try:
        yield proc, line
    finally:
        proc.stop(timeout=15)
        drop_prefix(prefix, REDIS_URL)


def children(pid: int) -> set[int]:
    """Live (not zombie) child processes of ``pid``."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(entry.name))
    return out


def test_two_workers_share_one_port_survive_a_killed_worker_and_stop_together(
    supervisor: tuple[Proc, str],
) -> None:
    proc, line = supervisor
    url = proc.url
    workers = children(proc.popen.pid)
    assert _pids_of(line) == workers, line  # the listening line names the 2 workers
    assert "2 workers" in line
    for pid in workers:  # the gateway's bounds shared: half of each (defaults 1024 and 64)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[argv.index("--max-inflight") + 1] == "512", argv
        assert argv[argv.index("--max-inflight-per-endpoint") + 1] == "32", argv
        assert argv.count("--max-inflight") == 1, argv

    agent = start_agent(url, "agent://workers-echo-01")  # registered through one of them
    try:
        # seen through both: 20 fresh connections in a row find it
        def seen_by_all() -> bool:
            return all(http("GET", f"{url}/v1/agents/workers-echo-01")[0] == 200 for _ in range(20))

        wait_until(seen_by_all, 5.0)
        before = {pid: cpu_ticks(pid) for pid in workers}
        codes = sends(url, 300)
        assert codes == [200] * 300
        used = {pid: cpu_ticks(pid) - before[pid] for pid in workers}
        total = sum(used.values())
        assert all(u >= 0.15 * total for u in used.values()), used  # both took connections

        # a worker killed: the other serves on; the supervisor starts another
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        # once reaped, its listening socket is closed (connections queued at the dead worker
        # when it died are reset: that is what a SIGKILL does to them)
        wait_until(lambda: gone(victim), 5.0)
        assert sends(url, 50) == [200] * 50
        wait_until(lambda: len(children(proc.popen.pid) - {victim}) == 2, 10.0)
        replacement = (children(proc.popen.pid) - workers).pop()
        wait_until(lambda: f"worker {replacement} listening" in _stderr(proc), 30.0)
        assert f"worker {victim} exited" in _stderr(proc)
        now = children(proc.popen.pid)
        before = {pid: cpu_ticks(pid) for pid in now}
        assert sends(url, 300) == [200] * 300
        used = {pid: cpu_ticks(pid) - before[pid] for pid in now}
        assert used[replacement] >= 0.15 * sum(used.values()), used
    finally:
        agent.stop()

    # SIGTERM to the supervisor stops every worker
    everyone = workers | children(proc.popen.pid)
    assert proc.stop(timeout=15) == 0
    assert [pid for pid in everyone if not gone(pid)] == []


def _stderr(proc: Proc) -> str:
    return proc.log_path.read_text(errors="replace")


def _pids_of(line: str) -> set[int]:
    match = re.search(r"pids ([\d ]+)\)", line)
    assert match, line
    return {int(p) for p in match[1].split()}


def test_sighup_to_the_supervisor_reloads_the_dictionary_of_every_worker(tmp_path: Path) -> None:
    path = tmp_path / "intents.toml"
    path.write_text('[[intent]]\ntag = "alpha.one"\n')
    prefix = f"test-{os.urandom(6).hex()}"
    cmd = [*SERVE, "--registry", REDIS_URL, "--registry-prefix", prefix, "--workers", "2"]
    proc, _line = start_supervisor([*cmd, "--intents", str(path)])
    try:

        def tags() -> set[str]:  # a fresh connection: either worker answers
            code, body = http("GET", f"{proc.url}/v1/intents")
            assert code == 200, body
            return {entry["tag"] for entry in body["intents"]}

        assert all(tags() == {"alpha.one"} for _ in range(10))
        path.write_text('[[intent]]\ntag = "alpha.one"\n\n[[intent]]\ntag = "beta.two"\n')
        proc.popen.send_signal(signal.SIGHUP)
        # both workers re-read it: 20 fresh connections in a row all see the new entry
        wait_until(lambda: all(tags() == {"alpha.one", "beta.two"} for _ in range(20)), 20)
        assert proc.popen.poll() is None  # the supervisor lives on
        assert len(children(proc.popen.pid)) == 2
    finally:
        proc.stop(timeout=15)
        drop_prefix(prefix, REDIS_URL)


def test_mcp_under_workers_is_stateless(supervisor: tuple[Proc, str]) -> None:
    """A session would live in one worker, and the next request may reach the other: under
    --workers, /mcp opens none, and every request (each on a new connection here, spread by
    the kernel over both workers) is served on its own."""
    proc, _ = supervisor
    accept = MCP_ACCEPT
    initialize = MCP_INITIALIZE
    status, _, headers = http_full("POST", f"{proc.url}/mcp", initialize, headers=accept)
    assert status == 200
    assert "mcp-session-id" not in {k.lower() for k in headers}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for _ in range(12):
        status, text, _ = http_full(
            "POST",
            f"{proc.url}/mcp",
            listing,
            headers={**accept, "Mcp-Protocol-Version": "2025-06-18"},
        )
        assert status == 200, text
        assert '"name":"reach"' in str(text).replace(" ", ""), text
