"""The delivery loop on a fake clock and a scripted transport: deadlines, retries, failover.

The transport is a fake at the external edge (the network); the gateway service, the core and
the loop are the real ones. Time moves only when the loop sleeps or an attempt "takes" time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.auth.keys import KeyDirectoryError, KeyRing, generate_key
from agent_reach.auth.tokens import TokenService
from agent_reach.core.model import Outcome
from agent_reach.errors import (
    AgentError,
    AllAttemptsFailed,
    InternalError,
    NoAvailableAgent,
    ReachError,
)
from agent_reach.gateway.delivery import WAKE_SLACK_S, Reacher
from agent_reach.gateway.explain import explain_route
from agent_reach.gateway.matching import Match
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.router import RoutePlan, Router
from agent_reach.gateway.traces import TraceStore
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.transport.base import Delivery
from agent_reach.wire.bodies import RegisterBody, SendBody


@dataclass
class Behaviour:
    """What an endpoint does with each attempt: take ``latency`` s, then answer ``outcome``."""

    latency: float
    outcome: Outcome = Outcome.OK


@dataclass
class ScriptedTransport:
    clock: FakeClock
    behaviours: dict[str, list[Behaviour]]
    calls: list[tuple[str, dict[str, str], float, float]] = field(default_factory=list)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        self.calls.append((url, dict(headers), timeout_s, self.clock.now))
        script = self.behaviours[url]
        b = script.pop(0) if len(script) > 1 else script[0]
        if b.latency >= timeout_s:
            self.clock.advance(timeout_s)
            return Delivery(Outcome.TIMEOUT)
        self.clock.advance(b.latency)
        if b.outcome is Outcome.CONNECT_ERROR:
            return Delivery(b.outcome, reached=False, eject=True)
        status = {Outcome.OK: 200, Outcome.AGENT_ERROR: 409, Outcome.SERVER_ERROR: 500}[b.outcome]
        return Delivery(b.outcome, status, b'{"n": 1}')


class LateClock(FakeClock):
    """A fake clock whose sleeps end 1 ms late, as a real loop's timers do."""

    async def sleep(self, seconds: float) -> None:
        await super().sleep(seconds)
        self.advance(0.001)


def make(
    behaviours: dict[str, list[Behaviour]],
    seed: int = 1,
    clock: FakeClock | None = None,
    **overrides: float,
) -> tuple[Reacher, ScriptedTransport, FakeClock]:
    clock = FakeClock() if clock is None else clock
    gw = Router(
        GatewaySettings(**overrides),
        MemoryRegistry(),
        clock,  # type: ignore[arg-type]
        rng=random.Random(seed),
    )
    transport = ScriptedTransport(clock, behaviours)
    reacher = Reacher(
        gw, transport, GatewayMetrics(gw.status_counts), TraceStore(), wall=clock.wall
    )
    return reacher, transport, clock


async def register(reacher: Reacher, *names: str, intent: str = "t.echo") -> None:
    for name in names:
        await reacher.router.register(
            RegisterBody(
                endpoint_id=f"agent://{name}",
                capabilities=[intent],
                endpoint_url=f"http://{name}/reach",
            )
        )


def url(name: str) -> str:
    return f"http://{name}/reach"


async def reach(reacher: Reacher, clock: FakeClock, **body: object) -> tuple[object, float]:
    """(result or error, elapsed fake seconds)."""
    start = clock.now
    try:
        send = msgspec.convert({"intent": "t.echo", **body}, SendBody)
        send.msg_id = send.msg_id or "msg_1"
        opened = reacher.open_trace(send, send.msg_id, None)
        send.trace_id = opened.trace_id
        result: object = await reacher.send(send, opened, start)
    except (ReachError, InternalError) as exc:
        result = exc
    return result, clock.now - start


outcomes = st.sampled_from(
    [Outcome.OK, Outcome.SERVER_ERROR, Outcome.CONNECT_ERROR, Outcome.AGENT_ERROR]
)
behaviour = st.builds(Behaviour, st.floats(0.0, 12.0), outcomes)


@settings(max_examples=300, deadline=None)
@given(
    timeout_ms=st.integers(1, 20_000),
    scripts=st.lists(st.lists(behaviour, min_size=1, max_size=5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
async def test_the_answer_never_comes_after_the_deadline(
    timeout_ms: int, scripts: list[list[Behaviour]], seed: int
) -> None:
    slowest = max(b.latency for script in scripts for b in script)  # before the scripts run
    names = [f"a{i}" for i in range(len(scripts))]
    reacher, transport, clock = make(
        {url(n): s for n, s in zip(names, scripts, strict=True)}, seed=seed
    )
    await register(reacher, *names)
    result, elapsed = await reach(reacher, clock, timeout_ms=timeout_ms)
    assert elapsed <= timeout_ms / 1000
    assert len(transport.calls) <= 4  # at most 3 retries
    for _, headers, timeout_s, _ in transport.calls:
        assert int(headers["X-Reach-Deadline-Ms"]) == int(timeout_s * 1000)
        # per-try timeout: 2000 ms without history, 1.5 x p95 of answered deliveries after
        assert timeout_s <= max(2.0, 1.5 * slowest) + 1e-9  # latency via clock arithmetic
    if isinstance(result, AgentError):
        assert len(transport.calls) == len(result.fields["attempts"])
        assert result.fields["attempts"][-1].outcome == "agent_error"


async def test_the_issue_example_8s_deadline_p95_800_gives_2000ms_tries_and_2_retries() -> None:
    reacher, transport, clock = make({url("a"): [Behaviour(0.8)]})
    await register(reacher, "a")
    for _ in range(20):  # history: p95 800 ms
        await reach(reacher, clock)
    gw = reacher.router
    assert gw.per_try_ms("agent://a") == 2000
    assert gw.max_retries(8000, gw.per_try_ms("agent://a")) == 2
    transport.behaviours[url("a")] = [Behaviour(5.0)]  # now it hangs
    gw.heartbeat("agent://a")
    result, elapsed = await reach(reacher, clock, timeout_ms=8000)
    assert isinstance(result, ReachError)
    attempts = result.fields["attempts"]
    # 2 s try, 0.5-1 s wait, 2 s try, then a 1-2 s wait cut to what leaves room for a last
    # 2 s try (~3 s left) and WAKE_SLACK_S, which the hung agent lets run out: the retries
    # are used up WAKE_SLACK_S before the deadline
    assert [a.outcome for a in attempts] == ["timeout", "timeout", "timeout"]
    assert isinstance(result, AllAttemptsFailed)
    first_wait, second_wait = clock.slept[-2:]
    assert 0.5 <= first_wait <= 1.0
    assert 1.0 <= second_wait <= 2.0
    assert 7.9 <= elapsed < 8.0


async def test_no_retry_starts_when_its_try_cannot_fit() -> None:
    reacher, transport, clock = make({url("a"): [Behaviour(5.0)]})
    await register(reacher, "a")
    # 2 s try; the shortest wait (0.5 s) + a 2 s try does not fit in the 1.5 s left
    result, elapsed = await reach(reacher, clock, timeout_ms=3500)
    assert isinstance(result, AllAttemptsFailed)
    assert "not enough for another attempt" in result.detail
    assert len(transport.calls) == 1
    assert elapsed == pytest.approx(2.0)


async def test_a_wait_shortened_to_fit_the_try_still_lets_the_try_start() -> None:
    """4 s deadline, one endpoint: a 503 at 1.3 s leaves 2.7 s, room for the shortest wait
    (0.5 s) and a 2 s try; a drawn wait over 0.7 s is shortened. Cut to the room exactly, it
    woke (1 ms late, as real timers do) with less than the try's 2 s and the retry was given
    up: 502 where the rules promise a retry (a review of 2026-12-07)."""
    waits = []
    for seed in range(12):
        script = [Behaviour(1.3, Outcome.SERVER_ERROR), Behaviour(0.01)]
        reacher, transport, clock = make({url("only"): script}, seed=seed, clock=LateClock())
        await register(reacher, "only")
        result, elapsed = await reach(reacher, clock, timeout_ms=4000)
        assert not isinstance(result, ReachError), (seed, result)
        assert len(transport.calls) == 2
        assert transport.calls[1][2] == pytest.approx(2.0)  # the retry's whole per-try time
        assert elapsed <= 4.0
        waits.append(clock.slept[0])
    # drawn from 0.5-1.0 s; those over the room were shortened to it, less the slack for a
    # late wake-up (the room: what the try leaves of the deadline, ~0.7 s)
    room = max(waits)
    assert room <= 0.7 - WAKE_SLACK_S
    assert waits.count(room) >= 3  # the seeds drew waits that had to be shortened


async def test_failover_goes_to_another_endpoint_without_waiting() -> None:
    reacher, transport, clock = make(
        {url("bad"): [Behaviour(0.01, Outcome.SERVER_ERROR)], url("good"): [Behaviour(0.01)]}
    )
    await register(reacher, "bad", "good")
    for _ in range(10):
        result, _ = await reach(reacher, clock, timeout_ms=8000)
        assert not isinstance(result, ReachError)
        assert result.endpoint_id == "agent://good"  # type: ignore[attr-defined]
    assert clock.slept == []  # failover never waits
    assert any(u == url("bad") for u, *_ in transport.calls)


async def test_retry_of_the_same_endpoint_waits_a_jittered_backoff() -> None:
    script = [Behaviour(0.01, Outcome.SERVER_ERROR)] * 3 + [Behaviour(0.01)]
    reacher, transport, clock = make({url("only"): list(script)})
    await register(reacher, "only")
    result, _ = await reach(reacher, clock, timeout_ms=12_000)
    assert not isinstance(result, ReachError), result
    assert [h["X-Reach-Attempt"] for _, h, _, _ in transport.calls] == ["1", "2", "3", "4"]
    first, *later = clock.slept
    assert 0.5 <= first <= 1.0  # 50-100 % of 0.5 x 2000 ms
    assert all(1.0 <= w <= 2.0 for w in later)  # 50-100 % of 1 x 2000 ms


async def test_agent_4xx_is_never_retried() -> None:
    reacher, transport, clock = make(
        {url("a"): [Behaviour(0.01, Outcome.AGENT_ERROR)], url("b"): [Behaviour(0.01)]}
    )
    await register(reacher, "a", "b")
    refused = 0
    for _ in range(10):
        result, _ = await reach(reacher, clock, timeout_ms=8000)
        if isinstance(result, ReachError):
            assert isinstance(result, AgentError)
            assert len(result.fields["attempts"]) == 1
            refused += 1
    assert refused >= 1  # "a" was reached at least once (new endpoints look fast)
    assert sum(u == url("a") for u, *_ in transport.calls) == refused  # never a second try


async def test_connection_refused_ejects_at_once_and_is_not_charged_to_the_budget() -> None:
    reacher, transport, clock = make(
        {url("dead"): [Behaviour(0.0, Outcome.CONNECT_ERROR)], url("live"): [Behaviour(0.01)]},
        seed=3,
    )
    await register(reacher, "dead", "live")
    budget = reacher.router.budget
    for _ in range(20):
        result, _ = await reach(reacher, clock, timeout_ms=8000)
        assert not isinstance(result, ReachError)
    dead_calls = [c for c in transport.calls if c[0] == url("dead")]
    assert len(dead_calls) == 1  # ejected after the first refusal
    assert budget.allowance(clock.now) == pytest.approx(10 * 10)  # nothing spent: the floor
    record = reacher.router.registry.get("agent://dead")
    assert record is not None
    assert reacher.router.health(record).status.value == "suspect"
    reacher.router.heartbeat("agent://dead")  # its next heartbeat brings it back
    assert (
        reacher.router.health(record := reacher.router.registry.get("agent://dead")).status.value
        == "healthy"
    )  # type: ignore[arg-type]


async def probe_due(*live: str) -> tuple[Router, RoutePlan]:
    """A router whose ``dead`` endpoint was ejected and is due its probe, beside ``live`` ones
    that answer; the plan of their intent. Its first choices send 2 % to ``dead`` (the share)."""
    reacher, _, clock = make(
        {url("dead"): [Behaviour(0.0, Outcome.CONNECT_ERROR)]}
        | {url(name): [Behaviour(0.01)] for name in live},
        seed=5,
    )
    await register(reacher, "dead", *live)
    while not any(c[0] == url("dead") for c in reacher.transport.calls):  # type: ignore[attr-defined]
        await reach(reacher, clock)
    clock.advance(1.0)  # past the first backoff (0.5 s): its probe is due
    router = reacher.router
    plan = router.plan(Match("exact", "t.echo", 1.0), None)
    sends = [router.choose(plan) for _ in range(2000)]
    assert 0 < sends.count("agent://dead") < 100  # the probe share, 2 % of 2,000
    return router, plan


async def test_a_dry_run_shows_the_choice_of_the_sends_that_are_not_probes() -> None:
    """An ejected endpoint whose probe is due gets 2 % of the sends (the probe share); the
    route a dry run explains is the other 98 %'s, every time."""
    router, _ = await probe_due("live")
    for _ in range(200):
        answer = explain_route(router, Match("exact", "t.echo", 1.0), None, None)
        assert answer["chosen"] == "agent://live"


async def test_only_a_requests_first_choice_draws_the_probe_share() -> None:
    """A review: the probe share was drawn at every choice, so a request that retried drew it
    again at each retry (up to ~8 % of requests carried a probe where the contract allows 5 %).
    A retry (or a hedge) now never draws it."""
    router, plan = await probe_due("live", "other")
    retries = [router.choose(plan, ("agent://live",)) for _ in range(2000)]
    assert set(retries) == {"agent://other"}


async def test_retry_budget_caps_retries_across_requests() -> None:
    reacher, transport, clock = make(
        {
            url("a"): [Behaviour(0.0, Outcome.SERVER_ERROR)],
            url("b"): [Behaviour(0.0, Outcome.SERVER_ERROR)],
        },
        retry_budget_min_per_s=0.5,
        retry_budget_ratio=0.0,
    )
    await register(reacher, "a", "b")
    errors = []
    for _ in range(10):
        result, _ = await reach(reacher, clock, timeout_ms=20_000)
        assert isinstance(result, AllAttemptsFailed)
        errors.append(result.detail)
    # 0.5/s over a 10 s window: 5 retries in all, then first attempts only
    assert sum("budget" in e for e in errors) >= 5
    assert len(transport.calls) <= 10 + 5


async def test_suspect_only_by_hint_and_down_never() -> None:
    reacher, transport, clock = make({url("a"): [Behaviour(0.01)]}, heartbeat_interval=10.0)
    await register(reacher, "a")
    clock.advance(25)  # suspect (past 20 s)
    result, _ = await reach(reacher, clock)
    assert isinstance(result, NoAvailableAgent)
    result, _ = await reach(reacher, clock, recipient_hint="agent://a")
    assert not isinstance(result, ReachError)
    clock.advance(10)  # down (past 30 s)
    result, _ = await reach(reacher, clock, recipient_hint="agent://a")
    assert isinstance(result, NoAvailableAgent)
    assert len(transport.calls) == 1


async def test_gateway_stall_does_not_demote_endpoints() -> None:
    reacher, _, clock = make({url("a"): [Behaviour(0.01)]}, heartbeat_interval=10.0)
    gw = reacher.router
    await register(reacher, "a")
    for _ in range(8):  # the ticker runs for 2 s
        clock.advance(0.25)
        gw.liveness.tick(clock.now)
    clock.advance(40)  # SIGSTOP for 40 s: no tick, no heartbeat
    record = gw.registry.get("agent://a")
    assert record is not None
    assert gw.health(record).status.value == "healthy"  # before the late tick
    gw.liveness.tick(clock.now)
    assert gw.health(record).status.value == "healthy"  # after: the stall is credited
    for _ in range(44):  # 11 s of normal running without heartbeats
        clock.advance(0.25)
        gw.liveness.tick(clock.now)
    assert gw.health(record).status.value == "degraded"


async def test_tier_cache_sees_a_revived_endpoint_at_once() -> None:
    reacher, _, clock = make({url("a"): [Behaviour(0.01)]}, heartbeat_interval=10.0)
    await register(reacher, "a")
    clock.advance(25)
    result, _ = await reach(reacher, clock)
    assert isinstance(result, NoAvailableAgent)
    reacher.router.heartbeat("agent://a")
    result, _ = await reach(reacher, clock)
    assert not isinstance(result, ReachError)


# --- faults of ours: still answered with the ids, counted, traced and logged -----------------


def retire_every_key(keys: KeyRing, directory: Path) -> None:
    """Every key file deleted and a bad one put beside them: the reload is refused, and the
    deleted keys are retired all the same (a leaked key must not stay in force)."""
    for pem in directory.glob("*.pem"):
        pem.unlink()
    (directory / "new.pem").write_text("not a key")
    with pytest.raises(KeyDirectoryError):
        keys.load()
    assert keys.keys == {}


def _requests(reacher: Reacher, outcome: str) -> float:
    text = reacher.metrics.render().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("agent_reach_requests_total{") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_signing_failure_is_an_internal_error_counted_and_traced(tmp_path: Path) -> None:
    generate_key(tmp_path)
    keys = KeyRing(tmp_path)
    keys.load()
    reacher, transport, clock = make({url("a"): [Behaviour(0.01)]})
    reacher.signer = TokenService(keys)
    await register(reacher, "a")
    retire_every_key(keys, tmp_path)  # nothing may sign: nothing is delivered unsigned
    result, _ = await reach(reacher, clock, msg_id="msg_sig", trace_id="trace_sig")
    assert isinstance(result, InternalError)
    assert "cannot sign the delivery" in result.detail
    assert (result.fields["msg_id"], result.fields["trace_id"]) == ("msg_sig", "trace_sig")
    assert result.fields["attempts"] == []
    assert transport.calls == []
    assert _requests(reacher, "internal_error") == 1
    events = reacher.traces.get("trace_sig")
    assert events is not None
    assert events[-1]["kind"] == "answer" and events[-1]["error"] == "internal_error"


async def test_an_unexpected_fault_in_delivery_is_answered_not_lost() -> None:
    reacher, transport, clock = make({url("a"): [Behaviour(0.01)]})
    await register(reacher, "a")

    async def broken(*args: object) -> Delivery:
        raise RuntimeError("a bug in a transport")

    transport.deliver = broken  # type: ignore[method-assign]  # the fake external edge fails
    result, _ = await reach(reacher, clock, trace_id="trace_bug")
    assert isinstance(result, InternalError)
    assert result.fields["trace_id"] == "trace_bug"
    assert _requests(reacher, "internal_error") == 1
    assert reacher.router.stats["agent://a"].inflight == 0  # the attempt's count released
    summary = reacher.traces.recent(None, "internal_error", 10)
    assert [s.trace_id for s in summary] == ["trace_bug"]


async def test_a_resend_inside_an_attempt_is_counted_not_retried() -> None:
    reacher, transport, clock = make({url("a"): [Behaviour(0.01)]})
    await register(reacher, "a")
    scripted = transport.deliver

    async def resent(
        url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        return (await scripted(url, body, headers, timeout_s))._replace(resent=True)

    transport.deliver = resent  # type: ignore[method-assign]  # the fake network resent once
    result, _ = await reach(reacher, clock)
    assert not isinstance(result, InternalError)
    text = reacher.metrics.render().decode()
    assert "agent_reach_transport_resends_total 1.0" in text
    assert 'agent_reach_retries_total{kind="same_endpoint"}' not in text
