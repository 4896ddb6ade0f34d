"""`agent-reach demo` (and `make run`'s --keep-running) as a new user runs them: with a
nats-server (a private one, named by ``AGENT_REACH_NATS``) one agent serves over NATS; without
one, the demo says NATS was skipped and why, and plays the rest over HTTP.

The demo starts its own gateway (in-memory registry) and picks each agent's transport itself, so
neither of tests/support.py's switches changes anything here: under them this module is skipped
(it ran in the plain pass).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_reach.demo.stack import nats_unavailable
from tests.support import ROOT, NatsServer, free_port, http, own_processes, private_nats

pytestmark = own_processes

_GATEWAY = re.compile(r"gateway (http://127\.0\.0\.1:(\d+))")
DEMO_AGENTS = ("weather-cn-01", "note-01", "scheduler-01")


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def nats() -> Iterator[NatsServer]:
    with private_nats() as server:
        yield server


def demo(log_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", "demo", "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **env},
        check=False,
    )


def test_demo_plays_the_scenarios_and_leaves_nothing_running(
    tmp_path: Path, nats: NatsServer
) -> None:
    done = demo(tmp_path, AGENT_REACH_NATS=nats.url)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "5/5 scenarios as expected; on NATS: agent://air-nats-01" in out
    assert (
        f"NATS {nats.url}: agent://air-nats-01 (nats:agents.air-nats-01) over NATS,"
        " the others over HTTP"
    ) in out
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
    # the request over NATS: answered by the agent that opens no port, and said so
    nats_part = out[out.index("5. Over NATS, no inbound port: send air.query") :]
    assert "answered by agent://air-nats-01" in nats_part, out
    assert "delivered over NATS to nats:agents.air-nats-01" in nats_part, out
    assert '"aqi": ' in nats_part, out
    match = _GATEWAY.search(out)
    assert match, out
    assert _refused(int(match.group(2)))  # the gateway is gone
    logs = {p.name for p in tmp_path.iterdir()}
    assert logs == {"gateway.log", "air-nats-01.log", *(f"{n}.log" for n in DEMO_AGENTS)}
    for name in (*DEMO_AGENTS, "air-nats-01"):
        # stopped before the gateway: each one deregistered
        assert '"event":"agent.deregistered"' in (tmp_path / f"{name}.log").read_text()


def test_without_nats_the_demo_says_why_and_plays_the_rest(tmp_path: Path) -> None:
    closed = f"nats://127.0.0.1:{free_port()}"
    # AGENT_REACH_SERVE in the caller's shell: the demo's HTTP agents serve over HTTP anyway
    # (had they taken it, they could not serve, and the demo would not start)
    done = demo(tmp_path, AGENT_REACH_NATS=closed, AGENT_REACH_SERVE=closed)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    (line,) = [x for x in out.splitlines() if x.startswith("NATS")]
    assert line == (
        f"NATS skipped: no nats-server answers on {closed} (Connection refused);"
        " every agent over HTTP"
    ), out
    assert "4/4 scenarios as expected; NATS skipped" in out
    assert "air.query" not in out and "delivered over NATS" not in out
    assert {p.name for p in tmp_path.iterdir()} == {
        "gateway.log",
        *(f"{n}.log" for n in DEMO_AGENTS),
    }


def test_the_nats_probe_is_bounded_and_wants_a_nats_server() -> None:
    # a port that takes the connection and says nothing, and one that speaks another protocol
    with socket.socket() as silent, socket.socket() as other:
        for s in (silent, other):
            s.bind(("127.0.0.1", 0))
            s.listen()
        stop = threading.Event()

        def speak() -> None:
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                stop.wait(5)

        talker = threading.Thread(target=speak, daemon=True)
        talker.start()
        try:
            t0 = time.monotonic()
            url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
            assert nats_unavailable(url, timeout_s=0.3) == (
                f"no nats-server answered on {url} within 0.3 s"
            )
            assert time.monotonic() - t0 < 1.0
            url = f"nats://127.0.0.1:{other.getsockname()[1]}"
            assert nats_unavailable(url, timeout_s=2) == f"{url} answered, but not as a nats-server"
        finally:
            stop.set()
            talker.join(5)
    assert nats_unavailable("http://127.0.0.1:4222") == (
        "'http://127.0.0.1:4222' is not a nats://HOST:PORT address"
    )


def test_keep_running_serves_until_sigint(tmp_path: Path, nats: NatsServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_reach", "demo", "--keep-running", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            "AGENT_REACH_NATS": nats.url,
        },
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
        assert f"AGENT_REACH_SERVE={nats.url} python -m agent_reach.demo.air" in text, text
        match = _GATEWAY.search(text)
        assert match, text
        url, port = match.group(1), int(match.group(2))
        code, body = http("GET", f"{url}/v1/agents")
        assert code == 200
        assert {a["endpoint_id"]: (a["status"], a["endpoint_url"][:5]) for a in body["agents"]} == {
            "agent://weather-cn-01": ("healthy", "http:"),
            "agent://note-01": ("healthy", "http:"),
            "agent://scheduler-01": ("healthy", "http:"),
            "agent://air-nats-01": ("healthy", "nats:"),
        }
        assert http("GET", f"{url}/healthz")[1]["nats"]["connected"] is True
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert _refused(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
