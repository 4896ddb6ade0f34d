"""A real gateway with --nats delivering to an agent that has no open port, only a NATS
subscription: registration of nats:SUBJECT, the delivery's headers, Reach-Status, failover to
an HTTP twin when the NATS agent is gone (no responders), and the refusals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from urllib import request

import pytest
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from tests.nats_support import NATS_URL, Reply, responder, unique
from tests.support import Proc, gateway, http, start_agent


@pytest.fixture
def gw() -> Iterator[Proc]:
    with gateway("--nats", NATS_URL, "--heartbeat-interval", "30") as proc:
        yield proc


async def weather(msg: Msg) -> Reply:
    """A NATS agent's answer: the request's intent and msg_id, ``Reach-Status`` 422 when its
    payload says ``bad``."""
    body = json.loads(msg.data)
    status = "422" if body["payload"].get("bad") else "200"
    reply = {"answered_over": "nats", "intent": body["intent"], "msg_id": body["msg_id"]}
    return json.dumps(reply).encode(), {"Reach-Status": status}


@pytest.fixture
async def subject() -> AsyncIterator[tuple[str, list[Msg]]]:
    """A NATS agent on a subject of its own, until closed: its subject and the requests seen."""
    name = unique("weather")
    async with responder(NATS_URL, name, weather) as seen:
        yield name, seen


def scrape(url: str) -> str:
    with request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def register(gw: Proc, name: str, url: str, caps: list[str]) -> tuple[int, dict[str, object]]:
    body = {"endpoint_id": f"agent://{name}", "capabilities": caps, "endpoint_url": url}
    return http("POST", f"{gw.url}/v1/register", body)


async def test_a_nats_agent_is_reached_by_intent_with_the_contract_headers(
    gw: Proc, subject: tuple[str, list[Msg]]
) -> None:
    name, seen = subject
    assert register(gw, "nats-weather-01", f"nats:{name}", ["natsw.query"])[0] == 200
    send = {"intent": "natsw.query", "payload": {"city": "成都"}, "trace_id": "trace_nats_1"}
    status, answer = await asyncio.to_thread(http, "POST", f"{gw.url}/v1/send", send)
    assert status == 200, answer
    assert answer["endpoint_id"] == "agent://nats-weather-01"
    assert answer["result"]["answered_over"] == "nats"
    assert [a["outcome"] for a in answer["attempts"]] == ["ok"]
    (msg,) = seen
    headers = msg.headers or {}
    assert headers["X-Reach-Trace-Id"] == "trace_nats_1"
    assert headers["X-Reach-Msg-Id"] == answer["msg_id"] == answer["result"]["msg_id"]
    assert headers["X-Reach-Attempt"] == "1"
    assert 0 < int(headers["X-Reach-Deadline-Ms"]) <= 8000
    assert headers["traceparent"].startswith("00-")
    # Reach-Status 422 from the agent is agent_error, as a 4xx over HTTP: not retried
    bad = {"intent": "natsw.query", "payload": {"bad": True}}
    status, answer = await asyncio.to_thread(http, "POST", f"{gw.url}/v1/send", bad)
    assert (status, answer["error"], len(answer["attempts"])) == (502, "agent_error", 1)
    code, health = http("GET", f"{gw.url}/healthz")
    assert code == 200 and health["nats"]["connected"] is True
    assert health["nats"]["slow_consumers"] == 0
    scraped = await asyncio.to_thread(scrape, f"{gw.url}/metrics")
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name.startswith("agent_reach_nats_")
    }
    assert values["agent_reach_nats_connected"] == 1.0
    assert values["agent_reach_nats_reconnects_total"] == 0.0
    assert values["agent_reach_nats_slow_consumer_drops_total"] == 0.0


async def test_no_responders_fails_over_to_an_http_twin_and_ejects_the_nats_one(
    gw: Proc, subject: tuple[str, list[Msg]]
) -> None:
    name, _ = subject
    twin = start_agent(gw.url, "agent://nats-twin-http-01", intents="natsf.query")
    try:
        gone = f"{name}.gone"  # nobody subscribes: "no responders" at once
        assert register(gw, "nats-gone-01", f"nats:{gone}", ["natsf.query"])[0] == 200
        for _ in range(6):
            send = {"intent": "natsf.query"}  # 8 s: room for 2 retries by the formula
            status, answer = await asyncio.to_thread(http, "POST", f"{gw.url}/v1/send", send)
            assert status == 200, answer
            assert answer["endpoint_id"] == "agent://nats-twin-http-01"
        # after its first connect_error the NATS endpoint is out of intent routing
        _, route = http("GET", f"{gw.url}/v1/route?intent=natsf.query")
        gone_row = next(
            c for c in route["candidates"] if c["endpoint_id"] == "agent://nats-gone-01"
        )
        assert gone_row["eligible"] is False
    finally:
        twin.stop()


def test_nats_endpoints_are_refused_without_nats_and_bad_subjects_always() -> None:
    with gateway() as plain:
        status, answer = register(plain, "nats-none-01", "nats:reach-test.a", ["natsn.query"])
        assert (status, answer["error"], answer["field"]) == (
            422,
            "invalid_request",
            "endpoint_url",
        )
        assert "--nats" in str(answer["detail"])
        assert http("GET", f"{plain.url}/v1/agents")[1]["agents"] == []
    with gateway("--nats", NATS_URL) as gw:
        for bad in ("nats:reach.*", "nats:reach.>", "nats:agent-reach.v1.send", "nats:$JS.API.x"):
            status, answer = register(gw, "nats-bad-01", bad, ["natsn.query"])
            assert (status, answer["error"]) == (422, "invalid_request"), bad
        assert http("GET", f"{gw.url}/v1/agents")[1]["agents"] == []
