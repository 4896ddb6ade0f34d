"""Reacher.relay: one A2A call (GetTask, CancelTask) to an A2A agent, and what comes back of
its errors. The transport is a scripted stand-in for the A2A transport's ``call`` (what it
answers is what transport/a2a.py makes of an agent's JSON-RPC answer)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from agent_reach.core.model import EndpointRecord, Outcome
from agent_reach.errors import AgentError, AllAttemptsFailed
from agent_reach.gateway.delivery import Reacher
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.router import Router
from agent_reach.gateway.traces import TraceStore
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.transport.base import Delivery

RECORD = EndpointRecord("agent://a2a-x", ("t.q",), "a2a+http://127.0.0.1:9/rpc", "", 0.0, 0.0)


class Answering:
    """An A2A transport whose ``call`` answers one scripted Delivery."""

    def __init__(self, answer: Delivery) -> None:
        self.answer = answer

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        raise AssertionError("relay calls, it does not deliver")

    async def call(
        self,
        url: str,
        method: str,
        params: Mapping[str, Any],
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Delivery:
        return self.answer


def reacher(answer: Delivery) -> Reacher:
    clock = FakeClock()
    router = Router(GatewaySettings(), MemoryRegistry(), clock, rng=random.Random(1))  # type: ignore[arg-type]
    metrics = GatewayMetrics(router.status_counts)
    return Reacher(router, Answering(answer), metrics, TraceStore(), wall=clock.wall)  # type: ignore[arg-type]


@pytest.mark.parametrize("outcome", [Outcome.AGENT_ERROR, Outcome.SERVER_ERROR])
async def test_the_agents_own_json_rpc_error_is_passed_on_as_it_gave_it(outcome: Outcome) -> None:
    """A review: an agent's own fault (-32603, a SERVER_ERROR) answering GetTask became
    ``all_attempts_failed``, "did not answer", its error object dropped (docs/a2a.md: the
    agent's own JSON-RPC error comes back as it gave it)."""
    body = b'{"code": -32603, "message": "db down", "data": [{"why": "disk"}]}'
    got = Delivery(outcome, 200, body, "agent answered JSON-RPC error -32603: db down")
    with pytest.raises(AgentError) as raised:
        await reacher(got).relay(RECORD, "GetTask", {"id": "task-1"}, None)
    assert raised.value.fields["rpc_error"] == {
        "code": -32603,
        "message": "db down",
        "data": [{"why": "disk"}],
    }


async def test_an_agent_that_did_not_answer_is_all_attempts_failed() -> None:
    got = Delivery(Outcome.SERVER_ERROR, 502, None, "answered 502", reached=True)
    with pytest.raises(AllAttemptsFailed, match="did not answer GetTask"):
        await reacher(got).relay(RECORD, "GetTask", {"id": "task-1"}, None)


async def test_a_5xx_body_that_only_looks_like_a_json_rpc_error_is_not_passed_on() -> None:
    """A framework's 5xx body ({"code": 500, ...}) is not the agent's JSON-RPC error: JSON-RPC
    codes are negative."""
    body = b'{"code": 500, "message": "Internal Server Error"}'
    got = Delivery(Outcome.SERVER_ERROR, 500, body, "answered 500", reached=True)
    with pytest.raises(AllAttemptsFailed, match="did not answer GetTask"):
        await reacher(got).relay(RECORD, "GetTask", {"id": "task-1"}, None)
