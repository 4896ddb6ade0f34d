"""/metrics stays small on a real gateway process that agents keep joining and leaving with
tags of their own (open mode: anyone may register any tag). A stdlib HTTP server plays the
agents: every registration points at it, and it answers every delivery.

NEEDS THE WIRING of GatewayMetrics.follow(registry) in the gateway's composition: until then
the series of departed tags stay, and this test fails on the size bound.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import gateway, http

CYCLES = 500
LIVE_EVERY = 50


class EchoAgent(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoAgent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/reach"
    server.shutdown()
    server.server_close()


def register(gw: str, name: str, tag: str, url: str) -> None:
    status, body = http(
        "POST",
        f"{gw}/v1/register",
        {"endpoint_id": f"agent://{name}", "capabilities": [tag], "endpoint_url": url},
    )
    assert status == 200, body


def send(gw: str, tag: str) -> None:
    status, body = http("POST", f"{gw}/v1/send", {"intent": tag, "payload": {}})
    assert status == 200, body


def intent_labels(text: str) -> set[str]:
    return {
        s.labels["intent"]
        for family in text_string_to_metric_families(text)
        if family.name in ("agent_reach_requests", "agent_reach_attempts")
        for s in family.samples
    }


def test_register_send_deregister_cycles_keep_metrics_small(agent_url: str) -> None:
    """Needs the wiring (see the module docstring)."""
    with gateway() as gw:
        register(gw.url, "metrics-live", "metrics.live", agent_url)
        live_sends = 0
        warm = 0
        for cycle in range(CYCLES):
            tag = f"metrics.cycle-{cycle}"
            register(gw.url, f"metrics-cycle-{cycle}", tag, agent_url)
            send(gw.url, tag)
            status, body = http(
                "POST", f"{gw.url}/v1/deregister", {"endpoint_id": f"agent://metrics-cycle-{cycle}"}
            )
            assert status == 200, body
            if cycle % LIVE_EVERY == 0:
                send(gw.url, "metrics.live")
                live_sends += 1
            if cycle == 20:
                status, text = http("GET", f"{gw.url}/metrics")
                assert status == 200
                warm = len(text)
        status, text = http("GET", f"{gw.url}/metrics")
        assert status == 200
        # each departed tag would add about 2 KB (a histogram and two counters)
        assert len(text) < warm + 2_000, (warm, len(text))
        assert intent_labels(text) == {"metrics.live"}
        requests = [
            s.value
            for family in text_string_to_metric_families(text)
            if family.name == "agent_reach_requests"
            for s in family.samples
            if s.name.endswith("_total")
        ]
        assert requests == [live_sends]  # the live tag's series survived every drop
