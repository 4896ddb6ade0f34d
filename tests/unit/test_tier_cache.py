"""The gateway's incrementally kept tiers always equal tiers built afresh.

Random sequences of registrations, re-registrations, heartbeats, deregistrations, deliveries
(fast, slow, near the slow threshold, failed, refused) and time passing, on a fake clock; after
every step each intent's cached tiers are compared with :func:`build_tiers` over the registry
at that moment. The probe tier moves by time too (a recovering endpoint's backoff runs out), and
the slow flag by hysteresis.
"""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent_reach.core.model import Outcome
from agent_reach.core.routing import build_tiers
from agent_reach.errors import ReachError
from agent_reach.gateway.router import Router
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody

NAMES = [f"agent://n{i}" for i in range(5)]
INTENTS = ["t.a", "t.b", "t.c"]

ops = st.one_of(
    st.tuples(
        st.just("register"),
        st.sampled_from(NAMES),
        st.lists(st.sampled_from(INTENTS), min_size=1, max_size=3, unique=True),
        st.booleans(),
    ),
    st.tuples(st.just("heartbeat"), st.sampled_from(NAMES)),
    st.tuples(st.just("deregister"), st.sampled_from(NAMES)),
    st.tuples(
        st.just("deliver"),
        st.sampled_from(NAMES),
        st.sampled_from([5.0, 50.0, 500.0, 900.0, 3000.0]),  # 900: in the hysteresis band
        st.sampled_from(
            [
                Outcome.OK,
                Outcome.TIMEOUT,
                Outcome.CONNECT_ERROR,
                Outcome.SERVER_ERROR,
                Outcome.AGENT_ERROR,
            ]
        ),
    ),
    st.tuples(
        st.just("advance"),
        st.floats(0.0, 25.0)
        | st.sampled_from([0.001, 0.3, 0.5, 0.501, 0.7, 1.0, 2.5, 4.999, 5.001, 60.0]),
    ),
    st.tuples(st.just("route"), st.sampled_from(INTENTS)),
)


def snapshot(tiers: object) -> tuple[frozenset[str], frozenset[str], frozenset[str], int]:
    return (
        frozenset(tiers.healthy),
        frozenset(tiers.degraded),  # type: ignore[attr-defined]
        frozenset(tiers.probe),
        tiers.unavailable,
    )  # type: ignore[attr-defined]


# the recovery paths, which random sequences reach only now and then: a failure's probe
# coming due by time alone, and an ejection, its probe due, then the answer that ends it
RECOVERY = [
    ("register", NAMES[0], ["t.a"], False),
    ("deliver", NAMES[0], 5.0, Outcome.TIMEOUT),
    ("advance", 0.7),
    ("deliver", NAMES[0], 5.0, Outcome.CONNECT_ERROR),
    ("advance", 1.0),
    ("route", "t.a"),
    ("deliver", NAMES[0], 5.0, Outcome.OK),
]
HYSTERESIS = [
    ("register", NAMES[1], ["t.b"], False),
    ("deliver", NAMES[1], 3000.0, Outcome.OK),
    ("deliver", NAMES[1], 900.0, Outcome.OK),
    ("deliver", NAMES[1], 5.0, Outcome.OK),
    ("advance", 60.0),
]


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(ops, max_size=40))
@example(steps=RECOVERY)
@example(steps=HYSTERESIS)
async def test_cached_tiers_equal_fresh_tiers(steps: list[tuple[object, ...]]) -> None:
    clock = FakeClock()
    gw = Router(
        GatewaySettings(heartbeat_interval=5.0, slow_threshold_ms=1000.0),
        MemoryRegistry(),
        clock,
        rng=random.Random(0),
    )
    for step in steps:
        kind = step[0]
        if kind == "register":
            _, name, caps, move = step
            port = 2 if move else 1
            await gw.register(
                RegisterBody(
                    endpoint_id=name,
                    capabilities=list(caps),  # type: ignore[call-overload]
                    endpoint_url=f"http://127.0.0.1:{port}/",
                )
            )
        elif kind == "heartbeat":
            if gw.registry.get(step[1]) is not None:  # type: ignore[arg-type]
                gw.heartbeat(step[1])  # type: ignore[arg-type]
        elif kind == "deregister":
            if gw.registry.get(step[1]) is not None:  # type: ignore[arg-type]
                await gw.deregister(step[1])  # type: ignore[arg-type]
        elif kind == "deliver":
            _, name, ms, outcome = step
            if gw.registry.get(name) is not None:  # type: ignore[arg-type]
                stats = gw.attempt_started(name)  # type: ignore[arg-type]
                refused = outcome is Outcome.CONNECT_ERROR
                gw.attempt_finished(
                    name,
                    stats,
                    outcome,
                    ms,  # type: ignore[arg-type]
                    reached=not refused,
                    eject=refused,
                )
        elif kind == "advance":
            clock.advance(step[1])  # type: ignore[arg-type]
        else:
            with contextlib.suppress(ReachError):  # refusals are fine: warming is the point
                await gw.route(step[1], None)  # type: ignore[arg-type]
        now = gw.now()
        for intent in INTENTS:
            fresh = build_tiers(
                gw.registry.by_intent(intent), gw.registry.get, gw.stats, now, gw.thresholds
            )
            cached = gw._intent_tiers(intent, now)
            assert snapshot(cached) == snapshot(fresh), (step, intent)


@pytest.mark.timeout(10)
async def test_tiers_due_by_a_rounding_do_not_loop() -> None:
    """The review's hang: registered at 0.18 with 0.5 s intervals, routed, then routed at 0.68
    (past 0.18 + 0.5 in floats, not past 0.5 of age): the cache re-derived the same status
    with the same due time, before ``now``, and took it again for ever. Each due entry is now
    taken once a call, and the derivation agrees with its due time."""
    clock = FakeClock(start=0.0)
    router = Router(
        GatewaySettings(heartbeat_interval=0.5), MemoryRegistry(), clock, rng=random.Random(0)
    )
    clock.advance(0.18)
    await router.register(RegisterBody("agent://a", ["w.q"], "http://127.0.0.1:9/a"))
    await router.route("w.q")  # the tiers cached, due at 0.18 + 0.5
    clock.now = 0.68
    plan = await router.route("w.q")
    assert plan.tiers is not None and plan.tiers.degraded == ["agent://a"]
