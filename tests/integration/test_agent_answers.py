"""Answers an agent may give that the gateway must not trust: redirects, compression, no body,
and a gateway registered as its own agent. A stdlib HTTP server plays the odd agent."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support import Proc, gateway, http, status_of

seen: list[tuple[str, str]] = []  # (method, path) of every request the odd agent received


class OddAgent(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        return

    def _answer(self) -> None:
        seen.append((self.command, self.path))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/gzip":
            body = gzip.compress(json.dumps({"blob": "x" * (2 << 20)}).encode())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:  # /empty
            self.send_response(204)
            self.end_headers()

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def odd() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OddAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway() as proc:
        yield proc


def register(gw: Proc, name: str, url: str) -> None:
    code, body = http(
        "POST",
        f"{gw.url}/v1/register",
        {"endpoint_id": f"agent://{name}", "capabilities": [f"odd.{name}"], "endpoint_url": url},
    )
    assert code == 200, body


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/redirect", "agent answered 302 (redirects are not followed)"),
        ("/gzip", "Content-Encoding gzip"),
        ("/empty", "agent answered 204 with a body that is not JSON"),
    ],
)
def test_unusable_answers_are_agent_errors_and_never_retried(
    gw: Proc, odd: str, path: str, detail: str
) -> None:
    name = path.strip("/")
    register(gw, name, odd + path)
    seen.clear()
    status, body = http("POST", f"{gw.url}/v1/send", {"intent": f"odd.{name}", "timeout_ms": 8000})
    assert (status, body["error"]) == (502, "agent_error")
    assert detail in body["detail"]
    assert [a["outcome"] for a in body["attempts"]] == ["agent_error"]
    assert seen == [("POST", path)]  # delivered once, nothing followed, nothing retried


def test_a_gateway_registered_as_its_own_agent_does_not_loop(gw: Proc) -> None:
    register(gw, "loop", f"{gw.url}/v1/send")
    status, body = http("POST", f"{gw.url}/v1/send", {"intent": "odd.loop", "timeout_ms": 8000})
    assert (status, body["error"]) == (502, "agent_error")
    assert body["agent_status"] == 422
    assert "will not deliver to itself" in body["agent_answer"]["detail"]
    assert len(body["attempts"]) == 1


def test_hosts_no_resolver_takes_are_refused_at_registration(gw: Proc) -> None:
    code, body = http(
        "POST",
        f"{gw.url}/v1/register",
        {
            "endpoint_id": "agent://odd-host",
            "capabilities": ["odd.host"],
            "endpoint_url": "http://a..b/reach",
        },
    )
    assert (code, body["error"], body["field"]) == (422, "invalid_request", "endpoint_url")
    assert status_of(gw.url, "agent://odd-host") == "http 404"


def test_every_send_error_carries_ids_and_attempts(gw: Proc) -> None:
    for raw in (b"not json", b'{"intent": 5}', b'{"intent": "a.b", "x": 1}'):
        code, body = http("POST", f"{gw.url}/v1/send", raw=raw)
        assert code in (400, 422)
        assert body["msg_id"].startswith("msg_") and body["trace_id"].startswith("trace_")
        assert body["attempts"] == []
    code, body = http(
        "POST",
        f"{gw.url}/v1/send",
        raw=b'{"intent": "a.b", "payload": "' + b"x" * (1 << 20) + b'"}',
    )
    assert (code, body["error"], body["attempts"]) == (413, "payload_too_large", [])
    code, body = http("GET", f"{gw.url}/v1/route?intent=Bad")
    assert (code, body["attempts"]) == (422, [])


def test_a_malformed_agent_name_is_simply_not_registered(gw: Proc) -> None:
    code, body = http("GET", f"{gw.url}/v1/agents/Not-A-Name")
    assert (code, body["error"]) == (404, "endpoint_not_registered")
