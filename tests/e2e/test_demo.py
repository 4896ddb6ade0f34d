"""`agent-reach demo` (and `make run`'s --keep-running) as a new user runs them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support import ROOT, http

_GATEWAY = re.compile(r"gateway (http://127\.0\.0\.1:(\d+))")


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_demo_plays_the_scenarios_and_leaves_nothing_running(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent_reach", "demo", "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "4/4 scenarios as expected" in out
    assert "answered by agent://weather-cn-01" in out
    assert "refused: no_capable_agent" in out and "as expected" in out
    # the scheduler's onward reaches, in its result
    assert "'agent://weather-cn-01', 'agent://note-01'" in out or (
        '"hops": ["agent://weather-cn-01", "agent://note-01"]' in out
    )
    # ... and the gateway's trace of it as `agent-reach trace` draws it: the two onward
    # requests nested under the scheduler's own hop, each over the attempt that answered it
    assert "3 requests, " in out, out
    waterfall = out[out.index("3 requests, ") :].splitlines()

    def place(hop: str) -> tuple[int, int]:  # (row, column) of a hop's label
        return next((i, line.index(hop)) for i, line in enumerate(waterfall) if hop in line)

    outer_row, outer_column = place("agent://scheduler-01  ok")
    for onward, answered in [
        ("weather.query  ok", "agent://weather-cn-01  ok"),
        ("note.create  ok", "agent://note-01  ok"),
    ]:
        (row, column), (attempt_row, attempt_column) = place(onward), place(answered)
        assert outer_row < row < attempt_row, out
        assert outer_column < column < attempt_column, out
    match = _GATEWAY.search(out)
    assert match, out
    assert _refused(int(match.group(2)))  # the gateway is gone
    logs = {p.name for p in tmp_path.iterdir()}
    assert logs == {"gateway.log", "weather-cn-01.log", "note-01.log", "scheduler-01.log"}
    for name in ("weather-cn-01", "note-01", "scheduler-01"):
        # stopped before the gateway: each one deregistered
        assert '"event":"agent.deregistered"' in (tmp_path / f"{name}.log").read_text()


def test_keep_running_serves_until_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_reach", "demo", "--keep-running", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(lines)
        assert "Agent-Reach is running" in text, text
        match = _GATEWAY.search(text)
        assert match, text
        url, port = match.group(1), int(match.group(2))
        code, body = http("GET", f"{url}/v1/agents")
        assert code == 200
        assert {a["endpoint_id"]: a["status"] for a in body["agents"]} == {
            "agent://weather-cn-01": "healthy",
            "agent://note-01": "healthy",
            "agent://scheduler-01": "healthy",
        }
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert _refused(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
