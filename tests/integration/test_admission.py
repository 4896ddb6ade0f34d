"""Admission with real processes: past --max-inflight the gateway refuses at once with 503
``overloaded`` and ``Retry-After``, low priority first (70 %), then normal (90 %), high only at
100 %; nothing is delivered for a refused request, and room comes back as answers go out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Proc, gateway, http_full, metric, start_agent, wait_until

HOLD_MS = 2500.0  # how long the slow agent keeps each request


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--max-inflight", "10") as proc:
        agent = start_agent(proc.url, "agent://slow-01", "slow", delay_ms=HOLD_MS)
        try:
            yield proc
        finally:
            agent.stop()


def send(gw: Proc, priority: str) -> tuple[int, Any, dict[str, str]]:
    body = {"intent": "test.echo", "priority": priority, "timeout_ms": 8000}
    return http_full("POST", f"{gw.url}/v1/send", body)


def hold(gw: Proc, priority: str, n: int, out: list[int]) -> list[threading.Thread]:
    threads = [
        threading.Thread(target=lambda: out.append(send(gw, priority)[0]), daemon=True)
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    return threads


def in_delivery(gw: Proc) -> float:
    return metric(gw, "agent_reach_requests_in_delivery")


def test_low_is_refused_first_then_normal_and_high_last(gw: Proc) -> None:
    held: list[int] = []
    threads = hold(gw, "low", 7, held)
    wait_until(lambda: in_delivery(gw) == 7, timeout=5)
    delivered = metric(gw, "agent_reach_attempts_total", intent="test.echo", outcome="ok")
    started = time.monotonic()
    code, answer, headers = send(gw, "low")
    assert time.monotonic() - started < 1.0  # at once, not after the agent's hold
    assert (code, answer["error"]) == (503, "overloaded"), answer
    assert headers.get("Retry-After") == "1"
    assert answer["msg_id"] and answer["trace_id"] and answer["attempts"] == []
    threads += hold(gw, "normal", 2, held)
    wait_until(lambda: in_delivery(gw) == 9, timeout=5)
    code, answer, _ = send(gw, "normal")
    assert (code, answer["error"]) == (503, "overloaded"), answer
    threads += hold(gw, "high", 1, held)
    wait_until(lambda: in_delivery(gw) == 10, timeout=5)
    code, answer, _ = send(gw, "high")
    assert (code, answer["error"]) == (503, "overloaded"), answer
    assert metric(gw, "agent_reach_overloaded_total", priority="low") >= 1
    assert metric(gw, "agent_reach_overloaded_total", priority="high") >= 1
    for t in threads:
        t.join(timeout=15)
    assert held == [200] * 10, held
    # the refused ones were never delivered: 10 deliveries for the 10 admitted
    after = metric(gw, "agent_reach_attempts_total", intent="test.echo", outcome="ok")
    assert after - delivered == 10
    # room again at once
    assert in_delivery(gw) == 0
    code, answer, _ = send(gw, "low")
    assert code == 200, answer
