"""Agent to agent: ``ctx.reach`` / ``ctx.reach_sync`` through a real gateway, real processes."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import ROOT, Proc, _start, gateway, http, start_agent


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agents = [
            _start(
                [sys.executable, str(ROOT / "tests/agents/relay_agent.py"), "--gateway", proc.url]
            ),
            start_agent(proc.url, "agent://hop-echo-01", "ok", intents="hop.echo"),
            start_agent(proc.url, "agent://hop-slow-01", "hang", intents="hop.hang"),
        ]
        try:
            yield proc
        finally:
            for agent in agents:
                agent.stop()


def relay(gw: Proc, how: str, inner: dict[str, Any], **outer: Any) -> tuple[int, Any]:
    return http(
        "POST",
        f"{gw.url}/v1/send",
        {"intent": f"relay.{how}", "payload": inner, **outer},
    )


@pytest.mark.parametrize("how", ["async", "sync"])
def test_onward_reach_keeps_the_trace_id_and_names_the_agent_as_sender(gw: Proc, how: str) -> None:
    trace_id = f"trace_hop_{how}"
    code, body = relay(
        gw,
        how,
        {"intent": "hop.echo", "payload": {"n": 7}, "options": {}},
        trace_id=trace_id,
        timeout_ms=4000,
    )
    assert code == 200, body
    inner = body["result"]
    assert inner["endpoint_id"] == "agent://hop-echo-01"
    assert inner["result"]["payload"] == {"n": 7}
    assert inner["trace_id"] == inner["result"]["trace_id"] == trace_id
    # the onward hop's deadline fits inside the relay's own
    assert 0 < inner["result"]["deadline_ms"] <= inner["my_deadline_ms"] <= 4000

    code, trace = http("GET", f"{gw.url}/v1/traces/{trace_id}")
    assert code == 200
    received = [e for e in trace["events"] if e["kind"] == "received"]
    assert [(e["intent"], e["sender"]) for e in received] == [
        (f"relay.{how}", None),
        ("hop.echo", "agent://relay-01"),
    ]


@pytest.mark.parametrize("how", ["async", "sync"])
def test_an_onward_hop_never_outlives_the_request_it_serves(gw: Proc, how: str) -> None:
    # the onward agent hangs; the hop asks for 30 s but gets what is left of 1.5 s
    start = time.monotonic()
    code, body = relay(
        gw,
        how,
        {"intent": "hop.hang", "payload": {}, "options": {"timeout_ms": 30_000}},
        timeout_ms=1500,
    )
    took = time.monotonic() - start
    assert code == 200, body  # the relay answered in time, with the onward error
    assert body["result"]["error"] == "deadline_exceeded"
    assert took < 1.5 + 0.3
