"""Fuzz the HTTP API of a real gateway: no server error, always the error shape, no change.

Bodies are random JSON, valid bodies with one field broken or added, and random bytes. After an
error answer the registry must be exactly as before. Endpoint URLs that fuzzing manages to
register are loopback-only in effect: any other host is deregistered at once, so no delivery can
leave the machine.
"""

from __future__ import annotations

import http.client as http_client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_support import check_error_shape, json_values
from tests.support import Proc, gateway, http

VALID = {
    "/v1/register": {
        "endpoint_id": "agent://fuzz-01",
        "capabilities": ["fuzz.echo"],
        "endpoint_url": "http://127.0.0.1:9/reach",
        "description": "x",
    },
    "/v1/heartbeat": {"endpoint_id": "agent://fuzz-01"},
    "/v1/deregister": {"endpoint_id": "agent://fuzz-01"},
    "/v1/send": {
        "intent": "fuzz.echo",
        "msg_id": "m1",
        "trace_id": "t1",
        "sender": "agent://fuzz-caller",
        "recipient_hint": None,
        "payload": {},
        "priority": "normal",
        "timeout_ms": 50,
    },
}
PATHS = sorted(VALID)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    body: dict[str, Any] = dict(VALID[path])
    how = draw(st.sampled_from(["replace", "drop", "add", "whole", "bytes"]))
    if how == "replace":
        body[draw(st.sampled_from(sorted(body)))] = draw(json_values)
    elif how == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "add":
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif how == "whole":
        return path, json.dumps(draw(json_values)).encode()
    else:
        return path, draw(st.binary(max_size=200))
    return path, json.dumps(body).encode()


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "600") as proc:
        # a stable population that every error answer must leave untouched
        for i in range(3):
            http(
                "POST",
                f"{proc.url}/v1/register",
                {
                    "endpoint_id": f"agent://fuzz-base-{i}",
                    "capabilities": ["fuzz.base"],
                    "endpoint_url": "http://127.0.0.1:9/reach",
                },
            )
        yield proc


def snapshot(gw: Proc) -> list[tuple[Any, ...]]:
    _, body = http("GET", f"{gw.url}/v1/agents")
    return sorted(
        (a["endpoint_id"], tuple(a["capabilities"]), a["endpoint_url"], a["description"])
        for a in body["agents"]
    )


# the only 5xx answers the contract allows: a routing outcome, never a gateway fault
def contain(gw: Proc, path: str, raw: bytes, status: int) -> None:
    """Undo a registration fuzzing made to anything but loopback (nothing may leave the host)."""
    if path != "/v1/register" or status != 200:
        return
    record = json.loads(raw)
    host = urlsplit(record["endpoint_url"]).hostname
    if host != "127.0.0.1":
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": record["endpoint_id"]})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
def test_post_bodies_never_5xx_and_errors_change_nothing(gw: Proc, case: tuple[str, bytes]) -> None:
    path, raw = case
    before = snapshot(gw)
    status, body = http("POST", gw.url + path, raw=raw)
    check_error_shape(status, body)
    if status >= 400:
        assert snapshot(gw) == before
        if status in (400, 422):
            assert body["error"] == "invalid_request"
    contain(gw, path, raw, status)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    intent=st.text(max_size=40),
    hint=st.none() | st.text(max_size=30),
    timeout=st.none() | st.text(max_size=8),
    extra=st.none() | st.text(min_size=1, max_size=8),
)
def test_route_queries_never_5xx(
    gw: Proc, intent: str, hint: str | None, timeout: str | None, extra: str | None
) -> None:
    query = f"intent={quote(intent)}"
    if hint is not None:
        query += f"&recipient_hint={quote(hint)}"
    if timeout is not None:
        query += f"&timeout_ms={quote(timeout)}"
    if extra is not None:
        query += f"&{quote(extra)}=1"
    status, body = http("GET", f"{gw.url}/v1/route?{query}")
    check_error_shape(status, body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(min_size=1, max_size=40))
def test_path_parameters_never_5xx(gw: Proc, name: str) -> None:
    for path in ("/v1/agents/", "/v1/traces/"):
        status, body = http("GET", gw.url + path + quote(name, safe=""))
        check_error_shape(status, body)
        assert status in (200, 404, 422)


@pytest.mark.parametrize("path", PATHS)
def test_oversized_bodies_get_payload_too_large(gw: Proc, path: str) -> None:
    before = snapshot(gw)
    filler = "x" * (1 << 20)
    status, body = http("POST", gw.url + path, {**VALID[path], "description": filler})
    assert (status, body["error"]) == (413, "payload_too_large")
    assert snapshot(gw) == before


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b"", 400, None),
        (b"not json", 400, None),
        (b"[]", 422, None),
        (
            b'{"endpoint_id": "agent://UPPER", "capabilities": ["a"], '
            b'"endpoint_url": "http://127.0.0.1:9/"}',
            422,
            "endpoint_id",
        ),
        (
            b'{"endpoint_id": "agent://ok", "capabilities": [], '
            b'"endpoint_url": "http://127.0.0.1:9/"}',
            422,
            "capabilities",
        ),
        (
            b'{"endpoint_id": "agent://ok", "capabilities": ["Bad.Tag"], '
            b'"endpoint_url": "http://127.0.0.1:9/"}',
            422,
            "capabilities[0]",
        ),
        (
            b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"], '
            b'"endpoint_url": "ftp://127.0.0.1/x"}',
            422,
            "endpoint_url",
        ),
        (b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"]}', 422, "endpoint_url"),
        # user info would be sent as Basic auth and shown to every reader: refused
        (
            b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"], '
            b'"endpoint_url": "http://user:secret@127.0.0.1:9/"}',
            422,
            "endpoint_url",
        ),
        # legacy numeric hosts the HTTP client does not dial: refused, naming the address
        *(
            (
                b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"], '
                b'"endpoint_url": "http://' + host + b':9/"}',
                422,
                "endpoint_url",
            )
            for host in (b"127.1", b"2130706433", b"017700000001", b"0x7f.0.0.1")
        ),
        # what is shown must be what is dialled: a NUL ends the name the resolver sees, a tab
        # is dropped by urlsplit, a percent-encoded host is dialled as those characters, an
        # IPvFuture literal as a DNS name (a review registered all four)
        *(
            (
                b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"], '
                b'"endpoint_url": "' + url + b'"}',
                422,
                "endpoint_url",
            )
            for url in (
                b"http://127.0.0.1\\u0000.evil.example:9/x",
                b"http://metadata.google.internal\\u0000.x/",
                b"http://127.0.0.1\\t:9/x",
                b"http://127.0.0.1:9/a b",
                b"http://%31%36%39.254.169.254/",
                b"http://[v1.x]:9/",
                b"nats:agents.\\u0001",
            )
        ),
        (
            b'{"endpoint_id": "agent://ok", "a2a_card_url": "http://127.0.0.1\\u0000.x:9/"}',
            422,
            "a2a_card_url",
        ),
        (
            b'{"endpoint_id": "agent://ok", "capabilities": ["a.b"], '
            b'"endpoint_url": "http://127.0.0.1:9/", "colour": 1}',
            422,
            "colour",
        ),
    ],
)
def test_register_errors_name_the_field(
    gw: Proc, raw: bytes, status: int, field: str | None
) -> None:
    before = snapshot(gw)
    code, body = http("POST", f"{gw.url}/v1/register", raw=raw)
    assert (code, body["error"]) == (status, "invalid_request")
    assert body.get("field") == field
    if field:
        assert field.split("[")[0] in body["detail"]
    assert snapshot(gw) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "intent"),
        ({"intent": "Weather.Query"}, "intent"),
        ({"intent": "a" * 129}, "intent"),
        ({"intent": "a.b", "priority": "urgent"}, "priority"),
        ({"intent": "a.b", "timeout_ms": 0}, "timeout_ms"),
        ({"intent": "a.b", "timeout_ms": "1000"}, "timeout_ms"),
        ({"intent": "a.b", "recipient_hint": "weather"}, "recipient_hint"),
        ({"intent": "a.b", "trace_id": "has space"}, "trace_id"),
        ({"intent": "a.b", "sender": 7}, "sender"),
        ({"intent": "a.b\n"}, "intent"),
        ({"intent": "a.b", "recipient_hint": "agent://x\n"}, "recipient_hint"),
        ({"intent": "a.b", "msg_id": "m\n"}, "msg_id"),
    ],
)
def test_send_errors_name_the_field(gw: Proc, body: dict[str, Any], field: str) -> None:
    code, answer = http("POST", f"{gw.url}/v1/send", body)
    assert (code, answer["error"], answer.get("field")) == (422, "invalid_request", field)


def test_deeply_nested_json_is_refused_not_crashed_on(gw: Proc) -> None:
    raw = b'{"intent": "fuzz.base", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    code, answer = http("POST", f"{gw.url}/v1/send", raw=raw)
    assert (code, answer["error"]) == (400, "invalid_request")
    assert "nested" in answer["detail"]


def test_gateway_survived_the_fuzzing(gw: Proc) -> None:
    assert gw.popen.poll() is None
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
    assert [a[0] for a in snapshot(gw) if a[0].startswith("agent://fuzz-base")] == [
        f"agent://fuzz-base-{i}" for i in range(3)
    ]


def _chunked_post(url: str, path: str, chunks: list[bytes]) -> tuple[int, Any]:
    parts = urlsplit(url)
    conn = http_client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body=iter(chunks),
            encode_chunked=True,
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_chunked_bodies_are_read_and_capped(gw: Proc) -> None:
    body = json.dumps({"endpoint_id": "agent://fuzz-base-0"}).encode()
    status, answer = _chunked_post(gw.url, "/v1/heartbeat", [body[:5], body[5:]])
    assert (status, answer["ok"]) == (200, True)
    before = snapshot(gw)
    big = [
        b'{"endpoint_id": "agent://fuzz-big", "capabilities": ["a.b"], ',
        b'"endpoint_url": "http://127.0.0.1:9/", "description": "',
        *([b"x" * 65536] * 20),
        b'"}',
    ]
    status, answer = _chunked_post(gw.url, "/v1/register", big)
    assert (status, answer["error"]) == (413, "payload_too_large")
    assert snapshot(gw) == before
