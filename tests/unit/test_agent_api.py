"""The agent SDK's declarations, checked before anything starts (no sockets)."""

from __future__ import annotations

import time

import pytest

from agent_reach.errors import DeadlineExceeded
from agent_reach.sdk import Agent, ReachContext, Reject


def test_the_gateway_comes_from_the_argument_then_the_environment_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENT_REACH_GATEWAY", raising=False)
    assert Agent("agent://a-01").gateway == "http://127.0.0.1:7700"
    monkeypatch.setenv("AGENT_REACH_GATEWAY", "http://gw.internal:7800/")
    assert Agent("agent://a-01").gateway == "http://gw.internal:7800"  # read when made
    assert Agent("agent://a-01", gateway="http://other:1").gateway == "http://other:1"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Agent("weather-01"), "endpoint id"),
        (lambda: Agent("agent://a-01", path="reach"), "path must start"),
        (lambda: Agent("agent://a-01", workers=0), "workers"),
        (lambda: Agent("agent://a-01").handle("Weather.Query"), "intent tag"),
        (lambda: Agent("agent://a-01").lifespan("ftp://x/reach"), "endpoint_url"),
        (lambda: Reject("no", status=500), "4xx"),
    ],
)
def test_bad_declarations_are_refused_at_once(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


async def test_an_agent_without_handlers_does_not_start() -> None:
    with pytest.raises(ValueError, match="no handlers"):
        await Agent("agent://a-01", gateway="http://127.0.0.1:9").start()


def test_handle_returns_the_function_unchanged() -> None:
    agent = Agent("agent://a-01")

    def query(payload: object, ctx: ReachContext) -> object:
        return payload

    assert agent.handle("weather.query")(query) is query
    assert agent.handlers == {"weather.query": query}


def _ctx(agent: Agent | None, deadline_at: float | None) -> ReachContext:
    return ReachContext(
        msg_id="m",
        trace_id="trace_unit",
        intent="relay.x",
        sender=None,
        priority="normal",
        attempt=1,
        deadline_ms=None if deadline_at is None else 1,
        deadline_at=deadline_at,
        _agent=agent,
    )


async def test_onward_reach_with_no_time_left_fails_before_any_request() -> None:
    agent = Agent("agent://unit-relay", gateway="http://127.0.0.1:9")  # nothing listens there
    ctx = _ctx(agent, time.monotonic() + 0.01)  # 10 ms left: less than the answer margin
    with pytest.raises(DeadlineExceeded) as exc:
        await ctx.reach("hop.echo")
    assert exc.value.trace_id == "trace_unit" and exc.value.attempts == []
    assert agent._client is None  # no client was even made


async def test_reach_outside_a_running_agent_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no running agent"):
        await _ctx(None, None).reach("hop.echo")
    agent = Agent("agent://unit-relay", gateway="http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match="not running"):
        _ctx(agent, None).reach_sync("hop.echo")
