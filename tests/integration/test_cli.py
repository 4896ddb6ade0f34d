"""`agent-reach serve` as a user runs it: flags, environment, refusals, clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support import ROOT, _start, http

SERVE = [sys.executable, "-m", "agent_reach", "serve"]


def test_flags_come_from_the_environment_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_REACH_HEARTBEAT_INTERVAL", "7")
    monkeypatch.setenv("AGENT_REACH_PORT", "1")  # overridden by --port 0 below
    proc = _start([*SERVE, "--port", "0"])
    try:
        code, body = http(
            "POST",
            f"{proc.url}/v1/register",
            {
                "endpoint_id": "agent://cli-env-01",
                "capabilities": ["cli.env"],
                "endpoint_url": "http://127.0.0.1:9/",
            },
        )
        assert (code, body["heartbeat_interval_s"]) == (200, 7.0)
    finally:
        assert proc.stop(signal.SIGTERM) == 0  # clean stop on SIGTERM


def test_sigint_stops_cleanly() -> None:
    proc = _start([*SERVE, "--port", "0"])
    assert proc.stop(signal.SIGINT) == 0
    assert "gateway.stopping" in {line["event"] for line in proc.log_lines()}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, *args], capture_output=True, text=True, timeout=30, cwd=ROOT, check=False
    )


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start prints on stderr (besides JSON log lines), no traceback."""
    assert result.stdout == ""  # never said it listens
    assert "Traceback" not in result.stderr
    [message] = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert message.startswith("Error: ")
    return message


def test_inconsistent_thresholds_are_refused_with_a_clear_message() -> None:
    result = run("--port", "0", "--degraded-after", "30", "--suspect-after", "10")
    assert result.returncode == 2  # config_error
    assert "degraded-after <= suspect-after" in refusal(result)


def test_purge_before_down_is_refused() -> None:
    result = run("--port", "0", "--heartbeat-interval", "10", "--purge-after", "20")
    assert result.returncode == 2
    assert "must be at least down-after (30.0)" in refusal(result)


def test_bad_values_and_unknown_registry_are_refused() -> None:
    assert run("--port", "70000").returncode == 2
    assert run("--confidence-threshold", "1.5").returncode == 2
    result = run("--port", "0", "--registry", "etcd://x")
    assert result.returncode == 2
    assert "unsupported registry URL" in result.stderr


def test_an_unreachable_shared_registry_exits_1_with_one_line() -> None:
    result = run("--port", "0", "--registry", "redis://127.0.0.1:1/0", "--log-level", "ERROR")
    assert result.returncode == 1  # backend_unavailable
    assert refusal(result).startswith("Error: cannot reach the registry at redis://127.0.0.1:1/0")


def test_a_taken_port_is_a_clear_error() -> None:
    first = _start([*SERVE, "--port", "0"])
    try:
        port = first.url.rsplit(":", 1)[1]
        result = run("--port", port)
        assert result.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    finally:
        first.stop()


def test_python_dash_m_and_the_console_script_agree() -> None:
    script = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "agent-reach"), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    module = run("--help")
    assert module.returncode == 0
    assert script.stdout.replace("agent-reach", "X") == module.stdout.replace("agent-reach", "X")
    assert "AGENT_REACH_SLOW_THRESHOLD_MS" in module.stdout
