"""The agent's own hop in GET /v1/traces/ID: SDK agents report how long their handler ran
(and whether a repeated msg_id was answered from memory), the gateway records it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Proc, gateway, http, start_agent


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agent = start_agent(
            proc.url, "agent://hop-slow-01", "slow", intents="hop.slow", delay_ms=120
        )
        try:
            yield proc
        finally:
            agent.stop()


def events(gw: Proc, trace_id: str, kind: str) -> list[dict[str, object]]:
    code, body = http("GET", f"{gw.url}/v1/traces/{trace_id}")
    assert code == 200, body
    return [e for e in body["events"] if e["kind"] == kind]


def test_the_agents_hop_is_in_the_trace(gw: Proc) -> None:
    code, body = http(
        "POST", f"{gw.url}/v1/send", {"intent": "hop.slow", "trace_id": "trace_hop_1"}
    )
    assert code == 200, body
    (attempt,) = events(gw, "trace_hop_1", "attempt")
    (hop,) = events(gw, "trace_hop_1", "agent")
    assert hop["endpoint_id"] == "agent://hop-slow-01"
    assert hop["attempt"] == 1 and hop["answered_from"] == "handler"
    # the handler slept 120 ms; its hop fits inside the gateway's view of the attempt
    assert 120 <= hop["handle_ms"] <= attempt["latency_ms"]  # type: ignore[operator]


def test_a_repeated_msg_id_shows_it_was_answered_from_memory(gw: Proc) -> None:
    for trace_id in ("trace_hop_a", "trace_hop_b"):
        code, _ = http(
            "POST",
            f"{gw.url}/v1/send",
            {"intent": "hop.slow", "msg_id": "msg_hop_same", "trace_id": trace_id},
        )
        assert code == 200
    (first,) = events(gw, "trace_hop_a", "agent")
    (second,) = events(gw, "trace_hop_b", "agent")
    assert first["answered_from"] == "handler"
    assert second["answered_from"] == "cached"
    assert second["handle_ms"] == first["handle_ms"]  # the first run's answer, not a new run
