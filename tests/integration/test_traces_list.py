"""The dashboard's HTTP surface on a real gateway with real agents: the recent-requests list
(``GET /v1/traces``), the in-flight counts (``GET /v1/inflight``) and the static files.

Both endpoints are extensions beyond contract v1 (docs/api.md).
"""

from __future__ import annotations

import http.client as http_client
import threading
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import Proc, gateway, http, start_agent, wait_until

SUMMARY_KEYS = {
    "trace_id",
    "msg_id",
    "intent",
    "outcome",
    "endpoint_id",
    "latency_ms",
    "attempts",
    "ts",
}


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agents = [
            start_agent(proc.url, "agent://tl-ok-01", intents="tl.echo,tl.limit"),
            start_agent(proc.url, "agent://tl-reject-01", "reject", intents="tl.reject"),
            start_agent(proc.url, "agent://tl-slow-01", "slow", intents="tl.slow", delay_ms=1500),
        ]
        try:
            yield proc
        finally:
            for agent in agents:
                agent.stop()


def send(gw: Proc, intent: str, **extra: object) -> dict[str, object]:
    _, body = http("POST", f"{gw.url}/v1/send", {"intent": intent, "timeout_ms": 5000, **extra})
    assert isinstance(body, dict)
    return body


def listing(gw: Proc, query: str = "") -> list[dict[str, object]]:
    code, body = http("GET", f"{gw.url}/v1/traces{query}")
    assert code == 200, body
    assert set(body) == {"traces"}
    return list(body["traces"])


def raw_get(url: str, path: str, headers: dict[str, str] | None = None) -> http_client.HTTPResponse:
    """GET ``path`` exactly as given (no client-side normalisation); the response, body read."""
    parts = urlsplit(url)
    conn = http_client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp


# --- GET /v1/traces -------------------------------------------------------------------------


def test_lists_answered_requests_most_recent_first(gw: Proc) -> None:
    ids = [f"trace_tl_order_{n}" for n in range(3)]
    for n, trace_id in enumerate(ids):
        assert send(gw, "tl.echo", trace_id=trace_id, msg_id=f"msg_tl_order_{n}")["ok"] is True
    listed = listing(gw, "?intent=tl.echo")
    assert [t["trace_id"] for t in listed[:3]] == ids[::-1]
    first = listed[0]
    assert set(first) == SUMMARY_KEYS
    assert first["msg_id"] == "msg_tl_order_2"
    assert first["intent"] == "tl.echo"
    assert first["outcome"] == "ok"
    assert first["endpoint_id"] == "agent://tl-ok-01"
    assert first["attempts"] == 1
    assert isinstance(first["latency_ms"], float) and first["latency_ms"] > 0
    stamps = [t["ts"] for t in listed]
    assert stamps == sorted(stamps, reverse=True)


def test_errors_are_listed_with_their_code_and_the_endpoint_tried(gw: Proc) -> None:
    refused = send(gw, "tl.no-such-intent", trace_id="trace_tl_refused")
    assert refused["error"] == "no_capable_agent"
    rejected = send(gw, "tl.reject", trace_id="trace_tl_rejected")
    assert rejected["error"] == "agent_error"

    by_trace = {t["trace_id"]: t for t in listing(gw, "?limit=500")}
    assert by_trace["trace_tl_refused"]["outcome"] == "no_capable_agent"
    assert by_trace["trace_tl_refused"]["endpoint_id"] is None  # nothing was delivered
    assert by_trace["trace_tl_refused"]["attempts"] == 0
    assert by_trace["trace_tl_rejected"]["outcome"] == "agent_error"
    assert by_trace["trace_tl_rejected"]["endpoint_id"] == "agent://tl-reject-01"
    assert by_trace["trace_tl_rejected"]["attempts"] == 1

    only = listing(gw, "?outcome=agent_error")
    assert only and {t["outcome"] for t in only} == {"agent_error"}
    both = listing(gw, "?intent=tl.reject&outcome=ok")
    assert both == []


def test_every_listed_request_has_its_timeline(gw: Proc) -> None:
    send(gw, "tl.echo", trace_id="trace_tl_timeline")
    listed = listing(gw, "?intent=tl.echo&limit=1")
    assert [t["trace_id"] for t in listed] == ["trace_tl_timeline"]
    code, body = http("GET", f"{gw.url}/v1/traces/trace_tl_timeline")
    assert code == 200
    assert [e["kind"] for e in body["events"]] == [
        "received",
        "route",
        "attempt",
        "agent",
        "answer",
    ]


def test_limit_defaults_to_50_and_bounds_the_list(gw: Proc) -> None:
    for _ in range(55):
        send(gw, "tl.limit")
    assert len(listing(gw, "?intent=tl.limit")) == 50
    assert len(listing(gw, "?intent=tl.limit&limit=3")) == 3
    assert len(listing(gw, "?intent=tl.limit&limit=500")) == 55


def test_blank_query_values_mean_no_filter(gw: Proc) -> None:
    send(gw, "tl.echo")
    assert listing(gw, "?intent=&outcome=&limit=") == listing(gw)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("limit=ten", "limit"),
        ("limit=1.5", "limit"),
        ("outcome=okay", "outcome"),
        ("outcome=invalid_request", "outcome"),
        ("intent=Not.A.Tag", "intent"),
        ("intent=a..b", "intent"),
        ("since=1", "since"),
    ],
)
def test_invalid_queries_are_refused_naming_the_field(gw: Proc, query: str, field: str) -> None:
    code, body = http("GET", f"{gw.url}/v1/traces?{query}")
    assert code == 422
    assert body["ok"] is False
    assert body["error"] == "invalid_request"
    assert body["field"] == field
    assert body["detail"]


def test_the_list_is_read_only(gw: Proc) -> None:
    code, body = http("POST", f"{gw.url}/v1/traces", {})
    assert (code, body["error"]) == (405, "method_not_allowed")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=st.dictionaries(
        st.sampled_from(["intent", "outcome", "limit", "x"]), st.text(max_size=20), max_size=3
    )
)
def test_list_queries_never_5xx(gw: Proc, params: dict[str, str]) -> None:
    query = "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items())
    code, body = http("GET", f"{gw.url}/v1/traces?{query}")
    assert code in (200, 422), body
    if code == 422:
        assert (body["ok"], body["error"]) == (False, "invalid_request")


# --- GET /v1/inflight -----------------------------------------------------------------------


def test_inflight_counts_the_open_deliveries_by_endpoint(gw: Proc) -> None:
    code, body = http("GET", f"{gw.url}/v1/inflight")
    assert code == 200
    assert set(body) == {"at", "total", "endpoints"}
    assert isinstance(body["at"], float)
    answers: list[dict[str, object]] = []
    caller = threading.Thread(target=lambda: answers.append(send(gw, "tl.slow")))
    caller.start()
    try:

        def open_now() -> dict[str, object] | None:
            _, body = http("GET", f"{gw.url}/v1/inflight")
            return body if body["endpoints"].get("agent://tl-slow-01") == 1 else None

        seen = wait_until(open_now, timeout=5)
        assert seen["total"] >= 1
    finally:
        caller.join(10)
    assert answers and answers[0]["ok"] is True
    _, body = http("GET", f"{gw.url}/v1/inflight")
    assert "agent://tl-slow-01" not in body["endpoints"]


# --- the dashboard's static files -----------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_the_page_is_served_with_its_headers(gw: Proc, path: str) -> None:
    resp = raw_get(gw.url, path)
    assert resp.status == 200
    assert resp.getheader("Content-Type") == "text/html; charset=utf-8"
    assert resp.getheader("Cache-Control") == "no-cache"
    assert resp.getheader("X-Content-Type-Options") == "nosniff"
    csp = resp.getheader("Content-Security-Policy") or ""
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("dashboard.js", "text/javascript; charset=utf-8"),
        ("dashboard.css", "text/css; charset=utf-8"),
        ("index.html", "text/html; charset=utf-8"),
    ],
)
def test_static_files_have_their_content_type_and_revalidate(
    gw: Proc, name: str, content_type: str
) -> None:
    resp = raw_get(gw.url, f"/static/{name}")
    assert resp.status == 200
    assert resp.getheader("Content-Type") == content_type
    assert resp.getheader("Cache-Control") == "no-cache"
    etag = resp.getheader("ETag")
    assert etag
    again = raw_get(gw.url, f"/static/{name}", {"If-None-Match": etag})
    assert again.status == 304


@pytest.mark.parametrize(
    "path",
    [
        "/static/nothing.js",
        "/static/",
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/Dashboard.js",
        "/dashboard/",
        "/nothing",
        "/v1/nothing",
        "/index.html",
    ],
)
def test_unknown_paths_are_404_in_the_error_shape(gw: Proc, path: str) -> None:
    code, body = http("GET", gw.url + path)
    assert code == 404
    assert (body["ok"], body["error"]) == (False, "not_found")
    assert body["detail"]


def test_the_page_is_read_only(gw: Proc) -> None:
    for path in ("/", "/dashboard", "/static/dashboard.js"):
        code, body = http("POST", gw.url + path, {})
        assert (code, body["error"]) == (405, "method_not_allowed")
