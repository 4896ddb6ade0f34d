"""``GET /v1/diagnostics`` (an extension beyond contract v1) on a real gateway process.

What it reports of the gateway's settings, which refusals it lists (only sends refused with
``no_capable_agent``), its order and bound, and that other methods and odd requests get the
usual error shape without changing what it reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import Proc, gateway, http

KEYS = {
    "ok",
    "heartbeat_interval_s",
    "degraded_after_s",
    "suspect_after_s",
    "down_after_s",
    "slow_threshold_ms",
    "overhead_reserve_ms",
    "confidence_threshold",
    "unrouted_intents",
}


def diagnostics(gw: Proc) -> dict[str, Any]:
    status, body = http("GET", f"{gw.url}/v1/diagnostics")
    assert status == 200, body
    assert set(body) == KEYS
    return body  # type: ignore[no-any-return]


def unrouted(gw: Proc) -> list[tuple[str, int]]:
    return [(u["intent"], u["count"]) for u in diagnostics(gw)["unrouted_intents"]]


def register(gw: Proc, name: str, caps: list[str]) -> None:
    body = {
        "endpoint_id": f"agent://{name}",
        "capabilities": caps,
        "endpoint_url": "http://127.0.0.1:9/reach",  # never delivered to in these tests
    }
    assert http("POST", f"{gw.url}/v1/register", body)[0] == 200


def send(gw: Proc, intent: str, **fields: Any) -> tuple[int, str]:
    """A send that forbids matching by meaning (``weather.querry`` would be caught by it):
    these tests are about the record of tags nobody declares."""
    body = {"intent": intent, "fallback": False, **fields}
    status, answer = http("POST", f"{gw.url}/v1/send", body)
    return status, answer["error"]


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    """A gateway whose record is filled by the tests that use it (read-only checks here)."""
    with gateway("--heartbeat-interval", "600") as proc:
        register(proc, "diag-01", ["diag.echo"])
        yield proc


def test_a_gateway_with_default_settings_says_so() -> None:
    with gateway() as gw:
        assert diagnostics(gw) == {
            "ok": True,
            "heartbeat_interval_s": 10.0,
            "degraded_after_s": 10.0,
            "suspect_after_s": 20.0,
            "down_after_s": 30.0,
            "slow_threshold_ms": 2000.0,
            "overhead_reserve_ms": 1000.0,
            "confidence_threshold": 0.8,
            "unrouted_intents": [],
        }


def test_the_settings_are_the_gateways_flags() -> None:
    flags = (
        "--heartbeat-interval",
        "0.5",
        "--suspect-after",
        "1.5",
        "--down-after",
        "4",
        "--slow-threshold-ms",
        "900",
        "--overhead-reserve-ms",
        "250",
        "--confidence-threshold",
        "0.6",
    )
    with gateway(*flags) as gw:
        body = diagnostics(gw)
    assert {k: v for k, v in body.items() if k != "unrouted_intents"} == {
        "ok": True,
        "heartbeat_interval_s": 0.5,
        "degraded_after_s": 0.5,  # 1 x interval
        "suspect_after_s": 1.5,
        "down_after_s": 4.0,
        "slow_threshold_ms": 900.0,
        "overhead_reserve_ms": 250.0,
        "confidence_threshold": 0.6,
    }


def test_only_sends_refused_with_no_capable_agent_are_listed_most_recent_first() -> None:
    with gateway() as gw:
        register(gw, "diag-weather-01", ["weather.query"])
        before = time.time()
        assert send(gw, "weather.querry") == (404, "no_capable_agent")
        assert send(gw, "note.create") == (404, "no_capable_agent")
        assert send(gw, "weather.querry") == (404, "no_capable_agent")
        after = time.time()
        # none of these is a caller asking for a tag nobody declares
        assert send(gw, "Weather.Query")[0] == 422  # not a valid tag
        assert send(gw, "x" * 129)[0] == 422
        hint = {"recipient_hint": "agent://diag-weather-01"}
        assert send(gw, "billing.charge", **hint) == (422, "recipient_incapable")
        assert send(gw, "billing.charge", recipient_hint="agent://nobody") == (
            404,
            "recipient_not_found",
        )
        status, body = http("GET", f"{gw.url}/v1/route?intent=billing.charge&fallback=false")
        assert (status, body["error"]) == (404, "no_capable_agent")
        body = diagnostics(gw)
        assert [(u["intent"], u["count"]) for u in body["unrouted_intents"]] == [
            ("weather.querry", 2),
            ("note.create", 1),
        ]
        for u in body["unrouted_intents"]:
            assert before - 1 <= u["last_at"] <= after + 1
        assert body["unrouted_intents"][0]["last_at"] >= body["unrouted_intents"][1]["last_at"]
        assert send(gw, "note.create") == (404, "no_capable_agent")
        assert unrouted(gw) == [("note.create", 2), ("weather.querry", 2)]
        # the metrics still count them under one label, not by intent
        status, text = http("GET", f"{gw.url}/metrics")
        assert 'intent="_unroutable",outcome="no_capable_agent"} 4.0' in text
        assert "weather.querry" not in text and "note.create" not in text


def test_at_most_100_distinct_intents_are_kept() -> None:
    with gateway() as gw:
        for i in range(105):
            assert send(gw, f"diag.n{i:03d}") == (404, "no_capable_agent")
        listed = unrouted(gw)
    assert listed == [(f"diag.n{i:03d}", 1) for i in range(104, 4, -1)]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_other_methods_are_not_allowed(gw: Proc, method: str) -> None:
    status, body = http(method, f"{gw.url}/v1/diagnostics", {"anything": 1})
    assert (status, body["ok"], body["error"]) == (405, False, "method_not_allowed")


def test_neighbouring_paths_are_not_found_and_a_query_is_ignored(gw: Proc) -> None:
    for path in ("/v1/diagnostics/", "/v1/diagnostics/x", "/v1/diagnostic", "/v1/diagnosticsx"):
        status, body = http("GET", gw.url + path)
        assert (status, body["error"]) == (404, "not_found"), path
    status, body = http("GET", f"{gw.url}/v1/diagnostics?intent=x&reset=1")
    assert status == 200 and body["ok"] is True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    query=st.text(max_size=30),
    body=st.none() | st.binary(max_size=100),
)
def test_odd_requests_never_5xx_nor_change_the_record(
    gw: Proc, method: str, query: str, body: bytes | None
) -> None:
    before = diagnostics(gw)
    status, answer = http(method, f"{gw.url}/v1/diagnostics?{quote(query)}", raw=body)
    assert status < 500
    if status != 200:
        assert answer["ok"] is False and isinstance(answer["error"], str)
    assert json.dumps(diagnostics(gw), sort_keys=True) == json.dumps(before, sort_keys=True)
