"""The agent SDK mounted into an existing Starlette app, served by a real uvicorn process
(tests/agents/asgi_agent.py), reached through a real gateway: the app's lifespan registers and
heartbeats, the mounted endpoint answers deliveries, and SIGTERM deregisters."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.agents.sdk_support import (
    agent_record,
    declare_too_large,
    events,
    key,
    send,
    start_asgi_agent,
)
from tests.support import Proc, gateway, http, status_of, wait_until


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway() as proc:
        yield proc


@pytest.mark.parametrize("style", ["mount", "route"])
def test_a_mounted_agent_is_reached_through_the_gateway(gw: Proc, style: str) -> None:
    endpoint_id = f"agent://sdk-asgi-{style}-01"
    agent = start_asgi_agent(gw.url, endpoint_id, style)
    try:
        code, record = agent_record(gw.url, endpoint_id)
        assert (code, record["status"], record["endpoint_url"]) == (200, "healthy", agent.url)
        assert record["description"] == "mounted in a Starlette app"

        trace_id = f"trace_{key()}"
        status, body = send(
            gw.url, intent="asgi.echo", payload={"n": 1}, trace_id=trace_id, timeout_ms=5000
        )
        assert status == 200, body
        assert body["endpoint_id"] == endpoint_id
        assert body["result"]["payload"] == {"n": 1}
        assert (body["result"]["trace_id"], body["result"]["via"]) == (trace_id, style)
        wait_until(lambda: events(agent, "asgi.echo.work", trace_id=trace_id), timeout=5)
        assert events(agent, "agent.request", trace_id=trace_id, intent="asgi.echo")

        # the same error table as the agent's own server, from the same delivery function
        code, answer = http("POST", agent.url, raw=b"not json")
        assert (code, answer["error"]) == (400, "invalid_request")
        code, answer = http("POST", agent.url, raw=b'{"intent": "asgi.none"}')
        assert (code, answer["error"]) == (404, "unknown_intent")
        code, answer = declare_too_large(agent.url, (1 << 20) + 1)
        assert (code, answer["error"]) == (413, "payload_too_large")
        code, answer = http("GET", agent.url)
        assert code == 405

        # the app's own routes are still the app's
        root = agent.url.split("/reach")[0] + "/"
        assert http("GET", root) == (200, {"app": "the team's own app"})
    finally:
        # uvicorn shuts down cleanly, then re-raises the signal so the exit status shows it
        assert agent.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert status_of(gw.url, endpoint_id) == "http 404"  # the lifespan's shutdown deregistered
    assert events(agent, "agent.deregistered")
