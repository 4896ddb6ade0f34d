"""The HTTP API of a real gateway process, against CONTRACT.md, with real agent processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Proc, gateway, http, start_agent, status_of, wait_until


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        yield proc


def reg(
    gw: Proc, name: str, caps: list[str], url: str = "http://127.0.0.1:9/reach", **extra: object
) -> tuple[int, dict[str, object]]:
    body = {"endpoint_id": f"agent://{name}", "capabilities": caps, "endpoint_url": url, **extra}
    return http("POST", f"{gw.url}/v1/register", body)


def test_register_answers_the_contract_shape_and_lists_the_agent(gw: Proc) -> None:
    code, body = reg(gw, "api-reg-01", ["api.alpha", "api.beta"], description="for people")
    assert (code, body) == (
        200,
        {"ok": True, "endpoint_id": "agent://api-reg-01", "heartbeat_interval_s": 30.0},
    )
    code, agent = http("GET", f"{gw.url}/v1/agents/api-reg-01")
    assert code == 200
    assert agent["capabilities"] == ["api.alpha", "api.beta"]
    assert agent["status"] == "healthy"
    assert agent["description"] == "for people"
    assert agent["avg_latency_ms"] is None and agent["p95_latency_ms"] is None
    assert set(agent) == {
        "endpoint_id",
        "capabilities",
        "endpoint_url",
        "description",
        "status",
        "last_seen_at",
        "avg_latency_ms",
        "p95_latency_ms",
    }
    code, listing = http("GET", f"{gw.url}/v1/agents")
    assert code == 200
    assert agent["endpoint_id"] in [a["endpoint_id"] for a in listing["agents"]]


def test_register_again_replaces_the_record_and_reindexes(gw: Proc) -> None:
    reg(gw, "api-upsert-01", ["api.old"])
    code, _ = reg(gw, "api-upsert-01", ["api.new"], url="http://127.0.0.1:10/x")
    assert code == 200
    _, agent = http("GET", f"{gw.url}/v1/agents/api-upsert-01")
    assert agent["capabilities"] == ["api.new"]
    assert agent["endpoint_url"] == "http://127.0.0.1:10/x"
    code, body = http("GET", f"{gw.url}/v1/route?intent=api.old")
    assert (code, body["error"]) == (404, "no_capable_agent")


def test_heartbeat_and_deregister(gw: Proc) -> None:
    reg(gw, "api-hb-01", ["api.hb"])
    code, body = http("POST", f"{gw.url}/v1/heartbeat", {"endpoint_id": "agent://api-hb-01"})
    assert (code, body) == (
        200,
        {"ok": True, "endpoint_id": "agent://api-hb-01", "status": "healthy"},
    )
    code, body = http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://api-hb-01"})
    assert (code, body) == (200, {"ok": True})
    for path in ("/v1/heartbeat", "/v1/deregister"):
        code, body = http("POST", gw.url + path, {"endpoint_id": "agent://api-hb-01"})
        assert code == 404
        assert body["error"] == "endpoint_not_registered"
        assert body["ok"] is False and body["detail"]
    assert http("GET", f"{gw.url}/v1/agents/api-hb-01")[0] == 404


@pytest.mark.parametrize(
    ("hint", "intent", "code", "error"),
    [
        ("agent://api-nobody", "api.route", 404, "recipient_not_found"),
        ("agent://api-route-01", "api.other", 422, "recipient_incapable"),
        (None, "api.nothing-declares-this", 404, "no_capable_agent"),
    ],
)
def test_send_routing_refusals(
    gw: Proc, hint: str | None, intent: str, code: int, error: str
) -> None:
    reg(gw, "api-route-01", ["api.route"])
    status, body = http(
        "POST", f"{gw.url}/v1/send", {"intent": intent, "recipient_hint": hint, "msg_id": "msg_1"}
    )
    assert (status, body["error"]) == (code, error)
    assert body["ok"] is False
    assert body["msg_id"] == "msg_1"
    assert re.fullmatch(r"trace_[0-9a-f]{32}", body["trace_id"])
    assert body["attempts"] == []
    # the dry run gives the same answer
    query = f"intent={intent}" + (f"&recipient_hint={hint}" if hint else "")
    status, body = http("GET", f"{gw.url}/v1/route?{query}")
    assert (status, body["error"]) == (code, error)


def test_connection_refused_endpoint_is_taken_out_at_once(gw: Proc) -> None:
    # port 9 (discard) is closed on loopback: the connection is refused
    reg(gw, "api-refused-01", ["api.refused"], url="http://127.0.0.1:9/reach")
    status, body = http("POST", f"{gw.url}/v1/send", {"intent": "api.refused"})
    assert (status, body["error"]) == (502, "all_attempts_failed")
    assert [a["outcome"] for a in body["attempts"]] == ["connect_error"]
    # passive check: out of intent routing now, without waiting for missed heartbeats
    assert status_of(gw.url, "agent://api-refused-01") == "suspect"
    status, body = http("POST", f"{gw.url}/v1/send", {"intent": "api.refused"})
    assert (status, body["error"]) == (503, "no_available_agent")
    status, body = http("GET", f"{gw.url}/v1/route?intent=api.refused")
    assert body["error"] == "no_available_agent"
    # its next heartbeat brings it back
    http("POST", f"{gw.url}/v1/heartbeat", {"endpoint_id": "agent://api-refused-01"})
    assert status_of(gw.url, "agent://api-refused-01") == "healthy"


def test_agent_4xx_is_not_retried_and_comes_back_as_agent_error(gw: Proc) -> None:
    agent = start_agent(gw.url, "agent://api-reject-01", "reject", intents="api.reject")
    try:
        status, body = http(
            "POST", f"{gw.url}/v1/send", {"intent": "api.reject", "timeout_ms": 8000}
        )
        assert (status, body["error"]) == (502, "agent_error")
        assert [a["outcome"] for a in body["attempts"]] == ["agent_error"]
        assert body["agent_status"] == 422
        assert body["agent_answer"]["detail"] == "told to reject"
    finally:
        agent.stop()


def test_an_answer_over_the_size_limit_is_a_failed_attempt(gw: Proc) -> None:
    agent = start_agent(gw.url, "agent://api-big-01", "big", intents="api.big")
    try:
        status, body = http("POST", f"{gw.url}/v1/send", {"intent": "api.big", "timeout_ms": 3000})
        assert (status, body["error"]) == (502, "agent_error")  # it did the work: no retry
        assert [a["outcome"] for a in body["attempts"]] == ["agent_error"]
        _, trace = http("GET", f"{gw.url}/v1/traces/{body['trace_id']}")
        attempt = next(e for e in trace["events"] if e["kind"] == "attempt")
        assert "larger than 1048576 bytes" in attempt["detail"]
    finally:
        agent.stop()


def test_route_explains_candidates_and_the_formula(gw: Proc) -> None:
    reg(gw, "api-explain-01", ["api.explain"])
    reg(gw, "api-explain-02", ["api.explain"])
    status, body = http("GET", f"{gw.url}/v1/route?intent=api.explain&timeout_ms=8000")
    assert status == 200
    assert body["ok"] is True and body["intent"] == "api.explain"
    assert body["chosen"] in ("agent://api-explain-01", "agent://api-explain-02")
    assert body["per_try_timeout_ms"] == 2000
    assert body["max_retries"] == 2  # floor((8000 - 1000) / 2400)
    ids = {c["endpoint_id"]: c for c in body["candidates"]}
    assert set(ids) == {"agent://api-explain-01", "agent://api-explain-02"}
    for c in ids.values():
        assert c["eligible"] is True and c["status"] == "healthy" and c["confidence"] == 1.0
        assert set(c) >= {
            "endpoint_id",
            "status",
            "confidence",
            "avg_latency_ms",
            "p95_latency_ms",
            "eligible",
            "reason",
        }
    status, body = http("GET", f"{gw.url}/v1/route?intent=api.explain&timeout_ms=3000")
    assert body["max_retries"] == 0


def test_fallback_matching_only_above_the_threshold(gw: Proc) -> None:
    """Only the matcher's confident matches route (tests/integration/test_matching.py has the
    whole story): a near tag routes, with its match on the route and the candidate."""
    reg(gw, "api-fallback-01", ["fb.weather.query.city.daily"])
    status, body = http("GET", f"{gw.url}/v1/route?intent=fb.weather.query.city.daily")
    assert status == 200 and body["match"]["method"] == "exact"

    def refused() -> tuple[int, Any]:
        return http("GET", f"{gw.url}/v1/route?intent=fb.forecast&fallback=false")

    # the index of the new tag is built at the lowest CPU priority (docs/matching.md): a
    # lookup waits 1.5 s for it, and on a busy machine the build may take longer
    # (the old index already suggests other tests' tags: wait for this one)
    def suggests_it() -> bool:
        suggestions = refused()[1].get("suggestions") or [{}]
        return suggestions[0].get("tag") == "fb.weather.query.city.daily"

    wait_until(suggests_it, timeout=60)
    status, body = refused()
    assert (status, body["error"]) == (404, "no_capable_agent")
    assert body["suggestions"][0]["tag"] == "fb.weather.query.city.daily"
    status, body = http("GET", f"{gw.url}/v1/route?intent=fb.forecast")
    if status == 200:  # routed by meaning: above the threshold, and it says so
        assert body["match"]["confidence"] >= 0.8
        assert "match on 'fb.weather.query.city.daily'" in body["candidates"][0]["reason"]
    else:
        assert (status, body["error"]) == (404, "no_capable_agent")
        assert all(s["confidence"] < 0.8 for s in body["suggestions"])


def test_traces_metrics_and_healthz(gw: Proc) -> None:
    http("POST", f"{gw.url}/v1/send", {"intent": "api.no-such", "trace_id": "trace_api_01"})
    status, body = http("GET", f"{gw.url}/v1/traces/trace_api_01")
    assert status == 200
    assert [e["kind"] for e in body["events"]] == ["received", "answer"]
    assert body["events"][1]["error"] == "no_capable_agent"
    status, body = http("GET", f"{gw.url}/v1/traces/trace_never_seen")
    assert (status, body["error"]) == (404, "trace_not_found")
    assert http("GET", f"{gw.url}/healthz") == (
        200,
        {
            "ok": True,
            "registry": {
                "backend": "memory",
                "available": True,
                "detail": "embedded in-memory registry",
            },
        },
    )
    status, text = http("GET", f"{gw.url}/metrics")
    assert status == 200
    assert 'agent_reach_requests_total{intent="_unroutable",outcome="no_capable_agent"}' in text
    assert re.search(r'agent_reach_endpoints\{status="healthy"\} [1-9]', text)
    assert "agent_reach_heartbeats_total" in text
    assert "agent_reach_request_duration_seconds_bucket" in text


def test_unknown_paths_and_methods_answer_in_the_error_shape(gw: Proc) -> None:
    status, body = http("GET", f"{gw.url}/v1/nothing")
    assert (status, body["ok"], body["error"]) == (404, False, "not_found")
    status, body = http("GET", f"{gw.url}/v1/send")
    assert (status, body["error"]) == (405, "method_not_allowed")


def test_down_record_stays_listed_and_comes_back_on_heartbeat() -> None:
    with gateway("--heartbeat-interval", "0.2") as gw:
        reg(gw, "api-down-01", ["api.down"])
        wait_until(lambda: status_of(gw.url, "agent://api-down-01") == "down", timeout=5)
        status, body = http("POST", f"{gw.url}/v1/send", {"intent": "api.down"})
        assert (status, body["error"]) == (503, "no_available_agent")
        status, body = http(
            "POST",
            f"{gw.url}/v1/send",
            {"intent": "api.down", "recipient_hint": "agent://api-down-01"},
        )
        assert (status, body["error"]) == (503, "no_available_agent")
        code, body = http("POST", f"{gw.url}/v1/heartbeat", {"endpoint_id": "agent://api-down-01"})
        assert (code, body["status"]) == (200, "healthy")


def test_statuses_fall_through_the_four_levels_without_heartbeats() -> None:
    with gateway("--heartbeat-interval", "0.3") as gw:
        reg(gw, "api-levels-01", ["api.levels"])
        seen = [status_of(gw.url, "agent://api-levels-01")]

        def fallen() -> bool:
            s = status_of(gw.url, "agent://api-levels-01")
            if s != seen[-1]:
                seen.append(s)
            return s == "down"

        wait_until(fallen, timeout=5, interval=0.01)
        assert seen == ["healthy", "degraded", "suspect", "down"]


def test_down_records_are_purged_after_purge_after() -> None:
    with gateway("--heartbeat-interval", "0.1", "--purge-after", "1") as gw:
        reg(gw, "api-purge-01", ["api.purge"])
        wait_until(lambda: status_of(gw.url, "agent://api-purge-01") == "http 404", timeout=10)
