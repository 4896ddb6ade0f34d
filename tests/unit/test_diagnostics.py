"""The gateway's diagnostics: the bounded record of unrouted intents, and what it answers.

:class:`UnroutedIntents` on its own (bound, order, counts), then through the service on a fake
clock: which refusals are recorded (only ``no_capable_agent`` of a send, never a dry run or a
recipient-hint refusal), and the settings it reports.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.errors import (
    NoAvailableAgent,
    NoCapableAgent,
    RecipientIncapable,
    RecipientNotFound,
)
from agent_reach.gateway.diagnostics import UNROUTED_CAPACITY, UnroutedIntents
from agent_reach.gateway.router import Router
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody

WALL = 1_700_000_000.0


def listed(u: UnroutedIntents) -> list[tuple[str, int, float]]:
    return [(x["intent"], x["count"], x["last_at"]) for x in u.to_list()]


def test_counts_and_orders_most_recently_refused_first() -> None:
    u = UnroutedIntents()
    u.note("a.x", 1.0)
    u.note("b.x", 2.0)
    u.note("a.x", 3.0)
    u.note("c.x", 4.0)
    assert listed(u) == [("c.x", 1, 4.0), ("a.x", 2, 3.0), ("b.x", 1, 2.0)]


def test_the_least_recently_refused_intent_is_evicted_past_the_capacity() -> None:
    u = UnroutedIntents(capacity=3)
    for i, intent in enumerate(["a.x", "b.x", "c.x", "a.x", "d.x"]):
        u.note(intent, float(i))
    # b.x was refused longest ago (a.x came back at 3): it goes first
    assert listed(u) == [("d.x", 1, 4.0), ("a.x", 2, 3.0), ("c.x", 1, 2.0)]
    assert u.evicted == 1
    u.note("b.x", 5.0)  # back, counted afresh
    assert listed(u) == [("b.x", 1, 5.0), ("d.x", 1, 4.0), ("a.x", 2, 3.0)]
    assert u.evicted == 2


def test_the_default_capacity_bounds_callers_strings() -> None:
    u = UnroutedIntents()
    assert u.capacity == UNROUTED_CAPACITY == 100
    for i in range(10_000):
        u.note(f"t.n{i}", float(i))
    assert len(u) == 100
    intents = [x["intent"] for x in u.to_list()]
    assert intents == [f"t.n{i}" for i in range(9_999, 9_899, -1)]


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        UnroutedIntents(capacity=0)


@given(st.lists(st.sampled_from([f"t.i{i}" for i in range(8)]), max_size=60))
def test_against_a_plain_model(refusals: list[str]) -> None:
    u = UnroutedIntents(capacity=4)
    counts: dict[str, int] = {}
    order: list[str] = []  # most recent last
    for at, intent in enumerate(refusals):
        u.note(intent, float(at))
        if intent in order:
            order.remove(intent)
            counts[intent] += 1
        else:
            counts[intent] = 1
            if len(order) == 4:
                counts.pop(order.pop(0))
        order.append(intent)
        assert len(u) <= 4
    assert [(x["intent"], x["count"]) for x in u.to_list()] == [
        (i, counts[i]) for i in reversed(order)
    ]


# --- through the service -------------------------------------------------------------------------


async def service(**settings: float) -> tuple[Router, FakeClock]:
    clock = FakeClock(start=0.0, wall_offset=WALL)
    gw = Router(GatewaySettings(**settings), MemoryRegistry(), clock)  # type: ignore[arg-type]
    await gw.register(
        RegisterBody(
            endpoint_id="agent://w1", capabilities=["weather.query"], endpoint_url="http://h/"
        )
    )
    return gw, clock


async def test_only_sends_refused_with_no_capable_agent_are_recorded() -> None:
    gw, clock = await service(heartbeat_interval=1.0)
    await gw.route("weather.query", None)  # served: nothing recorded
    with pytest.raises(NoCapableAgent):
        await gw.route("weather.querry", None)
    clock.advance(2.5)
    with pytest.raises(NoCapableAgent):
        await gw.route("weather.querry", None)
    # a dry run (/v1/route: doctor calls it) is not a caller asking
    with pytest.raises(NoCapableAgent):
        await gw.route("billing.charge", None, dry_run=True)
    # recipient-hint refusals are not tag mismatches
    with pytest.raises(RecipientNotFound):
        await gw.route("weather.querry", "agent://nobody")
    with pytest.raises(RecipientIncapable):
        await gw.route("weather.querry", "agent://w1")
    clock.advance(10.0)  # w1 is down now
    with pytest.raises(NoAvailableAgent):
        await gw.route("weather.query", None)  # declared, but nobody available: not unrouted
    assert gw.diagnostics()["unrouted_intents"] == [
        {"intent": "weather.querry", "count": 2, "last_at": WALL + 2.5}
    ]


async def test_the_answer_reports_the_settings_that_decide_health_and_retries() -> None:
    gw, _ = await service(
        heartbeat_interval=0.5,
        suspect_after=1.5,
        slow_threshold_ms=900.0,
        overhead_reserve_ms=250.0,
        confidence_threshold=0.6,
    )
    assert gw.diagnostics() == {
        "ok": True,
        "heartbeat_interval_s": 0.5,
        "degraded_after_s": 0.5,
        "suspect_after_s": 1.5,
        "down_after_s": 1.5,
        "slow_threshold_ms": 900.0,
        "overhead_reserve_ms": 250.0,
        "confidence_threshold": 0.6,
        "unrouted_intents": [],
    }
