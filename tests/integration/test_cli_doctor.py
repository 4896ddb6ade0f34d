"""`agent-reach doctor` as a subprocess against real gateways: output, --json, exit codes.

The findings themselves are tested per state in test_doctor.py; this is the command around them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.support import Proc, gateway, http, start_agent


def doctor(gw_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", "doctor", "--gateway", gw_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agent = start_agent(proc.url, "agent://doc-weather-01", "ok", intents="weather.query")
        try:
            yield proc
        finally:
            agent.stop()


def test_healthy_gateway_exits_0_and_says_each_check_passed(gw: Proc) -> None:
    code, _ = http("POST", f"{gw.url}/v1/send", {"intent": "weather.query"})
    assert code == 200
    done = doctor(gw.url)
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("empty_registry", "intent_unserved", "unrouted_agent", "retry_storm"):
        assert check in done.stdout
    assert "doctor:" in done.stdout and "warning" not in done.stdout


def test_a_tag_mismatch_is_reported_with_evidence_and_exit_4(gw: Proc) -> None:
    # the index of the agent's registration is built in the background at the lowest CPU
    # priority: on a busy machine (CI's two workers) it can take longer than the 1.5 s a
    # lookup waits for it, and the answer then suggests nothing yet
    deadline = time.monotonic() + 30
    while True:
        _, body = http("GET", f"{gw.url}/v1/route?intent=weather.querry")
        if body.get("suggestions") or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for _ in range(3):  # a typo: the matcher would catch it, so this caller forbids matching
        send = {"intent": "weather.querry", "fallback": False}
        code, body = http("POST", f"{gw.url}/v1/send", send)
        assert (code, body["error"]) == (404, "no_capable_agent")
        assert body["suggestions"][0]["tag"] == "weather.query"
    done = doctor(gw.url)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "weather.querry" in done.stdout and "weather.query" in done.stdout
    assert "next:" in done.stdout

    as_json = doctor(gw.url, "--json")
    assert as_json.returncode == 4
    body = json.loads(as_json.stdout)
    assert body["ok"] is False and body["worst"] == "warning"
    (unserved,) = [
        f
        for f in body["findings"]
        if f["check"] == "intent_unserved" and f["severity"] == "warning"
    ]
    assert unserved["subject"] == "weather.querry"
    assert any("weather.query" in line for line in unserved["evidence"]) or (
        "weather.query" in unserved["next_step"]
    )


def test_empty_registry_is_an_error_and_unreachable_is_exit_3() -> None:
    with gateway() as empty:
        done = doctor(empty.url, "--json")
        assert done.returncode == 4
        body = json.loads(done.stdout)
        assert body["worst"] == "error"
        assert [f["check"] for f in body["findings"] if f["severity"] == "error"] == [
            "empty_registry"
        ]
        url = empty.url
    gone = doctor(url)
    assert gone.returncode == 3
    assert "gateway_unavailable" in gone.stderr
