"""Hedged requests on a fake clock and a held transport: who wins, who is cancelled, and when
no hedge is sent (no field, a hint, one candidate, the budget, the deadline).

The transport is a fake at the external edge (the network): each delivery waits until the test
answers it (or until it is cancelled), so the test decides which attempt answers first. The
gateway's router, the delivery loop and the hedge race are the real ones. Time moves only when
the loop sleeps (the hedge's wait) or an answer "takes" time.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.core.model import Outcome
from agent_reach.errors import AgentError, DeadlineExceeded, ReachError
from agent_reach.gateway.delivery import Reacher
from agent_reach.gateway.hedge import AnswerTimes, hedge_delay_ms
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.router import Router
from agent_reach.gateway.traces import TraceStore
from agent_reach.intents.dictionary import parse_dictionary
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.transport.base import Delivery
from agent_reach.wire.answers import Attempt, Reply
from agent_reach.wire.bodies import RegisterBody, SendBody

TAG = "t.echo"


@dataclass
class Answer:
    """What an endpoint answers: ``latency`` s after the call went out, with ``outcome``."""

    latency: float
    outcome: Outcome = Outcome.OK


@dataclass
class Call:
    """One delivery the gateway made, held until the test answers it."""

    url: str
    headers: dict[str, str]
    timeout_s: float
    at: float
    answer: asyncio.Future[Answer]
    cancelled: bool = False

    @property
    def endpoint_id(self) -> str:
        return "agent://" + self.url.split("/")[2]


@dataclass
class HeldTransport:
    """Each delivery waits for :meth:`reply` (or is cancelled); URLs in ``auto`` answer at once."""

    clock: FakeClock
    auto: dict[str, Answer] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    arrived: asyncio.Queue[Call] = field(default_factory=asyncio.Queue)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        call = Call(url, dict(headers), timeout_s, self.clock.now, asyncio.Future())
        self.calls.append(call)
        self.arrived.put_nowait(call)
        answer = self.auto.get(url)
        if answer is None:
            try:
                answer = await call.answer
            except asyncio.CancelledError:
                call.cancelled = True
                raise
        # the answer comes ``latency`` after the call went out, or the attempt times out
        end = call.at + min(answer.latency, timeout_s)
        if end > self.clock.now:
            self.clock.advance(end - self.clock.now)
        if answer.latency >= timeout_s:
            return Delivery(Outcome.TIMEOUT, detail="no answer")
        status = {Outcome.OK: 200, Outcome.AGENT_ERROR: 409, Outcome.SERVER_ERROR: 500}
        return Delivery(answer.outcome, status[answer.outcome], b'{"n": 1}')

    async def sent(self, n: int) -> list[Call]:
        """The first ``n`` calls, once they have gone out (2 s of real time as a backstop)."""
        async with asyncio.timeout(2.0):
            while len(self.calls) < n:
                await self.arrived.get()
        return self.calls[:n]


def reply(call: Call, latency: float, outcome: Outcome = Outcome.OK) -> None:
    call.answer.set_result(Answer(latency, outcome))


def dictionary(hedge: str | None) -> str:
    return f'[[intent]]\ntag = "{TAG}"\n' + ("" if hedge is None else f"hedge_after_ms = {hedge}\n")


def make(
    hedge: str | None = "50", auto: dict[str, Answer] | None = None, **overrides: Any
) -> tuple[Reacher, HeldTransport, FakeClock]:
    clock = FakeClock()
    router = Router(
        GatewaySettings(**overrides),
        MemoryRegistry(),
        clock,
        rng=random.Random(7),
    )
    router.dictionary = parse_dictionary(dictionary(hedge))
    transport = HeldTransport(clock, auto or {})
    metrics = GatewayMetrics(router.status_counts)
    return Reacher(router, transport, metrics, TraceStore(), wall=clock.wall), transport, clock


async def register(reacher: Reacher, *names: str) -> None:
    for name in names:
        await reacher.router.register(
            RegisterBody(
                endpoint_id=f"agent://{name}",
                capabilities=[TAG],
                endpoint_url=f"http://{name}/reach",
            )
        )


async def reach(reacher: Reacher, clock: FakeClock, **body: Any) -> tuple[Any, float]:
    """(the reply or the error, elapsed fake seconds)."""
    start = clock.now
    send = msgspec.convert({"intent": TAG, "trace_id": "trace_h", **body}, SendBody)
    send.msg_id = "msg_h"
    opened = reacher.open_trace(send, send.msg_id, None)
    send.trace_id = opened.trace_id
    try:
        result: Any = await reacher.send(send, opened, start)
    except ReachError as exc:
        result = exc
    return result, clock.now - start


async def done(task: asyncio.Task[tuple[Any, float]]) -> tuple[Any, float]:
    """The request's (reply or error, elapsed), 5 s of real time as a backstop."""
    async with asyncio.timeout(5.0):
        return await task


def counted(reacher: Reacher, result: str) -> float:
    value = reacher.metrics.registry.get_sample_value(
        "agent_reach_hedges_total", {"result": result}
    )
    return value or 0.0


def events(reacher: Reacher, kind: str) -> list[dict[str, Any]]:
    return [e for e in reacher.traces.get("trace_h") or [] if e["kind"] == kind]


async def until(predicate: Callable[[], object], what: str) -> None:
    """Wait (a bounded number of loop turns) until ``predicate()`` holds."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not within 1000 loop turns: {what}")


def inflight(reacher: Reacher) -> dict[str, int]:
    return {e: s.inflight for e, s in reacher.router.stats.items()}


# --- the pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "p95", "wait"),
    [
        (None, None, None),
        (None, 80.0, None),
        (50, None, 50.0),
        (50, 900.0, 50.0),
        (0, None, None),
        (0, 80.0, 80.0),
    ],
)
def test_the_wait_is_the_field_or_for_0_the_p95_and_none_without_history(
    after: int | None, p95: float | None, wait: float | None
) -> None:
    assert hedge_delay_ms(after, p95) == wait


@given(st.lists(st.floats(0.0, 1e6), max_size=300))
def test_answer_times_give_the_p95_of_the_last_100(samples: list[float]) -> None:
    times = AnswerTimes()
    for ms in samples:
        times.add(ms)
    kept = sorted(samples[-100:])
    assert times.p95_ms() == (kept[math.ceil(0.95 * len(kept)) - 1] if kept else None)


def test_an_unhedged_attempt_encodes_as_before() -> None:
    assert msgspec.json.encode(Attempt("agent://a", "ok", 1.5)) == (
        b'{"endpoint_id":"agent://a","outcome":"ok","latency_ms":1.5}'
    )
    assert msgspec.json.decode(
        msgspec.json.encode(Attempt("agent://b", "ok", 2.0, hedge=True)), type=dict
    ) == {"endpoint_id": "agent://b", "outcome": "ok", "latency_ms": 2.0, "hedge": True}


# --- the race ----------------------------------------------------------------------------------


async def test_a_slow_first_attempt_is_hedged_elsewhere_and_the_hedge_answer_wins() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    assert first.endpoint_id != hedge.endpoint_id  # never the same endpoint
    assert hedge.at - first.at == pytest.approx(0.05)  # after hedge_after_ms
    assert hedge.timeout_s == pytest.approx(2.0)  # its own per-try timeout, within the deadline
    assert (first.headers["X-Reach-Attempt"], hedge.headers["X-Reach-Attempt"]) == ("1", "2")
    assert first.headers["X-Reach-Msg-Id"] == hedge.headers["X-Reach-Msg-Id"] == "msg_h"
    reply(hedge, 0.01)
    result, elapsed = await done(task)
    assert isinstance(result, Reply), result
    assert result.endpoint_id == hedge.endpoint_id
    assert first.cancelled and not hedge.cancelled
    assert elapsed == pytest.approx(0.06)
    assert result.attempts == [
        Attempt(first.endpoint_id, "timeout", 60.0),
        Attempt(hedge.endpoint_id, "ok", 10.0, hedge=True),
    ]
    # both in-flight counts released; the cancelled one's cost is what it took (at least)
    assert inflight(reacher) == {first.endpoint_id: 0, hedge.endpoint_id: 0}
    now = reacher.router.now()
    assert reacher.router.stats[first.endpoint_id].cost_ms(now) == pytest.approx(60.0)
    assert reacher.router.stats[first.endpoint_id].p95_ms() is None  # no latency sample
    assert (counted(reacher, "sent"), counted(reacher, "won"), counted(reacher, "refused")) == (
        1,
        1,
        0,
    )
    (sent,) = events(reacher, "hedge")
    assert sent["sent"] is True and sent["racing"] == first.endpoint_id
    assert sent["endpoint_id"] == hedge.endpoint_id and sent["after_ms"] == 50.0
    outcomes = [
        (e["endpoint_id"], e["outcome"], e.get("hedge"), e.get("cancelled"))
        for e in events(reacher, "attempt")
    ]
    assert outcomes == [
        (hedge.endpoint_id, "ok", True, None),
        (first.endpoint_id, "timeout", None, True),
    ]
    # the cancelled loser counted in the attempt metrics too, as the answer lists it (a review:
    # it was not, and the doctor's sporadic-timeouts check never saw an endpoint hedging hides)
    samples = reacher.metrics.registry
    by_outcome = {
        outcome: samples.get_sample_value(
            "agent_reach_attempts_total", {"intent": TAG, "outcome": outcome}
        )
        for outcome in ("ok", "timeout")
    }
    assert by_outcome == {"ok": 1.0, "timeout": 1.0}


async def test_an_endpoint_losing_races_past_the_slow_threshold_is_seen_slow() -> None:
    """The loser of a race has not answered after the hedge's wait and the winner's answer: a
    lower bound of its latency. Past the slow threshold it is a sample (a review found an
    endpoint that lost every race by seconds never degraded: cancelled attempts taught only
    its cost); under it, only the cost, as above."""
    reacher, transport, clock = make("50", slow_threshold_ms=40.0)
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    reply(hedge, 0.01)
    assert isinstance((await done(task))[0], Reply)
    router = reacher.router
    stats = router.stats[first.endpoint_id]
    assert stats.p95_ms() is None  # not an answer: no p95 from it
    record = router.registry.get(first.endpoint_id)
    assert record is not None
    assert router.health(record).status.value == "degraded"  # 60 ms over 40: slow
    other = router.registry.get(hedge.endpoint_id)
    assert other is not None and router.health(other).status.value == "healthy"


@pytest.mark.parametrize("cost", [30.0, 200.0, 7000.0])
def test_a_lower_bound_raises_the_cost_and_never_lowers_it(cost: float) -> None:
    """A cancelled or cut-short attempt's time is what the endpoint took at least: it raises a
    cost under it and leaves one over it alone (a cut at 95 ms blended a cost of 200 ms down;
    a review found a cancel past the slow threshold, a sample, blending 7239 ms down too).
    The clock moves between steps: a blend at the same instant would change nothing."""
    clock = FakeClock()
    router = Router(
        GatewaySettings(slow_threshold_ms=2000.0), MemoryRegistry(), clock, rng=random.Random(7)
    )
    stats = router.attempt_started("agent://a")
    stats.penalize(cost, router.now())
    for bound, how in [(95.0, "cut"), (90.0, "cancelled"), (2500.0, "cancelled")]:
        clock.advance(0.05)
        before = stats.cost_ms(router.now())
        if how == "cut":
            router.attempt_cut_short("agent://a", stats, bound)
        else:
            router.attempt_cancelled("agent://a", stats, bound)
        assert stats.cost_ms(router.now()) == pytest.approx(max(before, bound)), (bound, how)
        stats = router.attempt_started("agent://a")
    assert stats.p95_ms() is None  # lower bounds are never answers


async def test_an_answer_before_the_wait_sends_no_hedge() -> None:
    auto = {"http://a/reach": Answer(0.03), "http://b/reach": Answer(0.03)}
    reacher, transport, clock = make("50", auto)
    await register(reacher, "a", "b")
    result, _ = await reach(reacher, clock)
    assert isinstance(result, Reply), result
    assert len(transport.calls) == 1
    assert result.attempts == [Attempt(result.endpoint_id, "ok", 30.0)]
    assert counted(reacher, "sent") == 0
    assert events(reacher, "hedge") == []


@pytest.mark.parametrize(
    ("hedge", "body"), [(None, {}), ("50", {"recipient_hint": "agent://a"})], ids=["field", "hint"]
)
async def test_without_the_field_or_with_a_recipient_hint_nothing_is_hedged(
    hedge: str | None, body: dict[str, Any]
) -> None:
    reacher, transport, clock = make(hedge)
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock, **body))
    (first,) = await transport.sent(1)
    reply(first, 1.0)  # slow, but nothing raced it
    result, elapsed = await done(task)
    assert isinstance(result, Reply), result
    assert len(transport.calls) == 1 and elapsed == pytest.approx(1.0)
    assert clock.slept == []  # no hedge's wait was even started
    assert counted(reacher, "sent") == 0 and not events(reacher, "hedge")


async def test_a_lone_candidate_is_never_hedged_to_itself() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a")
    task = asyncio.create_task(reach(reacher, clock))
    (first,) = await transport.sent(1)
    await until(lambda: events(reacher, "hedge"), "the hedge's wait to end")
    (note,) = events(reacher, "hedge")
    assert (note["sent"], note["reason"]) == (False, "no other eligible candidate")
    reply(first, 0.5)
    result, _ = await done(task)
    assert isinstance(result, Reply) and len(transport.calls) == 1
    assert counted(reacher, "sent") == counted(reacher, "refused") == 0


async def test_the_retry_budget_refuses_a_hedge_and_counts_it() -> None:
    reacher, transport, clock = make("50", retry_budget_ratio=0.0, retry_budget_min_per_s=0.0)
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    (first,) = await transport.sent(1)
    await until(lambda: counted(reacher, "refused") == 1, "the budget's refusal")
    (note,) = events(reacher, "hedge")
    assert (note["sent"], note["reason"]) == (False, "retry budget")
    reply(first, 0.5)
    result, _ = await done(task)
    assert isinstance(result, Reply) and len(transport.calls) == 1
    assert counted(reacher, "sent") == 0


async def test_a_hedge_is_charged_to_the_retry_budget() -> None:
    # a floor of one retry in the 10 s window and no share of requests: one hedge, then none
    reacher, transport, clock = make("50", retry_budget_ratio=0.0, retry_budget_min_per_s=0.1)
    await register(reacher, "a", "b")
    budget = reacher.router.budget
    assert budget.allowance(clock.now) == pytest.approx(1.0)
    task = asyncio.create_task(reach(reacher, clock))
    _, hedge = await transport.sent(2)
    reply(hedge, 0.01)
    assert isinstance((await done(task))[0], Reply)
    assert budget.allowance(clock.now) == pytest.approx(0.0)
    task = asyncio.create_task(reach(reacher, clock, msg_id="msg_2"))
    (third,) = (await transport.sent(3))[2:]
    await until(lambda: counted(reacher, "refused") == 1, "the second hedge's refusal")
    reply(third, 0.2)
    assert isinstance((await done(task))[0], Reply)
    assert (counted(reacher, "sent"), counted(reacher, "refused")) == (1, 1)


@pytest.mark.parametrize(
    ("hedge", "timeout_ms"),
    [("2000", 8000), ("5000", 8000), ("50", 40)],
    ids=["wait-equals-per-try", "wait-past-per-try", "wait-past-deadline"],
)
async def test_no_hedge_when_its_wait_would_not_end_before_the_attempt_does(
    hedge: str, timeout_ms: int
) -> None:
    reacher, transport, clock = make(hedge)
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock, timeout_ms=timeout_ms))
    (first,) = await transport.sent(1)
    reply(first, 0.01)
    result, _ = await done(task)
    assert isinstance(result, Reply), result
    assert len(transport.calls) == 1 and clock.slept == []  # no wait started


async def test_a_hedge_never_runs_past_the_deadline() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    start = clock.now
    task = asyncio.create_task(reach(reacher, clock, timeout_ms=160))
    first, hedge = await transport.sent(2)
    deadline = start + (160 - 5) / 1000  # less the answer margin
    assert first.timeout_s == pytest.approx(0.155)
    assert hedge.at + hedge.timeout_s == pytest.approx(deadline)  # cut to what is left
    reply(first, 5.0)  # neither answers in time
    reply(hedge, 5.0)
    result, elapsed = await done(task)
    assert isinstance(result, DeadlineExceeded), result
    assert elapsed <= 0.16
    assert [a.outcome for a in result.fields["attempts"]] == ["timeout", "timeout"]


async def test_no_hedge_with_less_time_left_than_the_first_attempts_head_start() -> None:
    """A review's case: 1000 ms, hedged after 990 ms, b with no history. A hedge then would
    have had 5 ms: it could not answer, and its timeout would have counted against b (a
    penalty and a strike) and against the retry budget. Not sent; the trace says why."""
    reacher, transport, clock = make("990")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock, timeout_ms=1000))
    (first,) = await transport.sent(1)
    await until(lambda: events(reacher, "hedge"), "the hedge's decision")
    (decided,) = events(reacher, "hedge")
    assert decided["sent"] is False and "not enough time left" in decided["reason"]
    reply(first, 5.0)
    result, _ = await done(task)
    assert isinstance(result, DeadlineExceeded), result
    assert [c.endpoint_id for c in transport.calls] == [first.endpoint_id]
    assert counted(reacher, "sent") == 0
    other = "agent://b" if first.endpoint_id == "agent://a" else "agent://a"
    assert other not in reacher.router.stats or not reacher.router.stats[other].penalized


async def test_a_hedge_whose_endpoint_goes_away_before_it_starts_leaves_the_first_alone() -> None:
    """The hedge's endpoint is deregistered in the loop turn between its choice and its
    task's start: nothing was sent to it, so the first attempt runs on and answers (a review
    found the request failing `all_attempts_failed` with its healthy first attempt
    cancelled)."""
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    router = reacher.router
    choose = router.choose

    def choose_then_deregister(*args: Any, **kwargs: Any) -> str | None:
        chosen = choose(*args, **kwargs)
        if kwargs.get("free_only") and chosen is not None:  # the hedge's choice
            asyncio.get_running_loop().create_task(router.deregister(chosen))
        return chosen

    router.choose = choose_then_deregister  # type: ignore[method-assign]
    task = asyncio.create_task(reach(reacher, clock))
    (first,) = await transport.sent(1)
    await until(lambda: events(reacher, "hedge"), "the hedge was chosen")
    await until(lambda: len(events(reacher, "hedge")) == 2, "the hedge was dropped")
    reply(first, 0.08)
    result, _ = await done(task)
    assert isinstance(result, Reply), result
    assert result.endpoint_id == first.endpoint_id and not first.cancelled
    assert result.attempts == [Attempt(first.endpoint_id, "ok", 80.0)]
    assert len(transport.calls) == 1  # nothing went to the deregistered endpoint
    chosen, dropped = events(reacher, "hedge")
    assert chosen["sent"] is True
    assert dropped["sent"] is False and "deregistered" in dropped["reason"]
    assert inflight(reacher) == {first.endpoint_id: 0}
    assert reacher.router.slots.reserved == {}


async def test_a_timeout_cut_below_the_endpoints_p95_does_not_count_against_it() -> None:
    """b answers in 200 ms. A hedge with 95 ms of the deadline left is not sent (it could not
    answer); an attempt the caller's deadline cuts below b's p95 times out there without
    counting against b: no penalty, no strike, no timeout sample (a review found a hedge cut
    so short penalized, with a strike)."""
    auto = {"http://b/reach": Answer(0.2)}
    reacher, transport, clock = make("1400", auto=auto)
    await register(reacher, "a", "b")
    router = reacher.router
    for _ in range(5):  # b's history: 200 ms answers
        assert isinstance((await reach(reacher, clock, recipient_hint="agent://b"))[0], Reply)
    b = router.stats["agent://b"]
    assert b.p95_ms() == pytest.approx(200.0)
    router.rng = random.Random(0)
    calls = len(transport.calls)
    task = asyncio.create_task(reach(reacher, clock, timeout_ms=1500))
    await until(lambda: any(c.endpoint_id == "agent://a" for c in transport.calls), "a's attempt")
    first = next(c for c in transport.calls if c.endpoint_id == "agent://a")
    await until(lambda: events(reacher, "hedge"), "the hedge's decision")
    assert events(reacher, "hedge")[-1]["sent"] is False  # 95 ms left, b's p95 200 ms
    reply(first, 5.0)
    result, _ = await done(task)
    assert isinstance(result, DeadlineExceeded), result
    assert len(transport.calls) == calls + 1  # a alone
    a = router.stats["agent://a"]  # a had its whole 1.5 s, far past its (unknown) p95
    assert a.penalized and a.strikes == 1
    # b given 145 ms by its caller's deadline, below its p95: not its fault
    result, _ = await reach(reacher, clock, recipient_hint="agent://b", timeout_ms=150)
    assert isinstance(result, DeadlineExceeded), result
    assert transport.calls[-1].endpoint_id == "agent://b" and transport.calls[-1].timeout_s < 0.2
    assert not b.penalized and b.strikes == 0
    assert b.p95_ms() == pytest.approx(200.0)


async def test_a_4xx_from_the_hedge_is_the_answer_and_the_first_is_cancelled() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    reply(hedge, 0.01, Outcome.AGENT_ERROR)
    result, _ = await done(task)
    assert isinstance(result, AgentError), result
    assert first.cancelled and len(transport.calls) == 2  # not retried
    assert result.fields["attempts"] == [
        Attempt(first.endpoint_id, "timeout", 60.0),
        Attempt(hedge.endpoint_id, "agent_error", 10.0, hedge=True),
    ]
    assert counted(reacher, "won") == 0
    assert set(inflight(reacher).values()) == {0}


async def test_a_4xx_from_the_first_while_the_hedge_runs_is_the_answer() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    reply(first, 0.07, Outcome.AGENT_ERROR)
    result, _ = await done(task)
    assert isinstance(result, AgentError), result
    assert hedge.cancelled and len(transport.calls) == 2
    assert result.fields["attempts"] == [
        Attempt(hedge.endpoint_id, "timeout", 20.0, hedge=True),
        Attempt(first.endpoint_id, "agent_error", 70.0),
    ]
    assert set(inflight(reacher).values()) == {0}


async def test_the_first_attempt_answering_after_the_hedge_went_out_still_wins() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    reply(first, 0.08)
    result, elapsed = await done(task)
    assert isinstance(result, Reply), result
    assert result.endpoint_id == first.endpoint_id and hedge.cancelled
    assert elapsed == pytest.approx(0.08)
    assert result.attempts == [
        Attempt(hedge.endpoint_id, "timeout", 30.0, hedge=True),
        Attempt(first.endpoint_id, "ok", 80.0),
    ]
    assert (counted(reacher, "sent"), counted(reacher, "won")) == (1, 0)
    assert set(inflight(reacher).values()) == {0}


async def test_a_failure_of_one_attempt_leaves_the_other_to_answer() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    reply(first, 0.06, Outcome.SERVER_ERROR)
    await until(lambda: events(reacher, "attempt"), "the first attempt's failure")
    reply(hedge, 0.02)
    result, _ = await done(task)
    assert isinstance(result, Reply), result
    assert result.endpoint_id == hedge.endpoint_id and len(transport.calls) == 2
    assert result.attempts == [
        Attempt(first.endpoint_id, "server_error", 60.0),
        Attempt(hedge.endpoint_id, "ok", 20.0, hedge=True),
    ]
    assert counted(reacher, "won") == 1


async def test_when_both_fail_the_retry_rules_go_on_without_a_second_hedge() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b", "c")
    task = asyncio.create_task(reach(reacher, clock, timeout_ms=30_000))
    first, hedge = await transport.sent(2)
    reply(first, 0.06, Outcome.SERVER_ERROR)
    reply(hedge, 0.02, Outcome.SERVER_ERROR)
    (third,) = (await transport.sent(3))[2:]
    assert third.endpoint_id not in {first.endpoint_id, hedge.endpoint_id}  # failover
    assert third.headers["X-Reach-Attempt"] == "3"
    reply(third, 1.5)  # slow, and nothing races it: a request hedges once
    result, _ = await done(task)
    assert isinstance(result, Reply), result
    assert [(a.outcome, a.hedge) for a in result.attempts] == [
        ("server_error", False),
        ("server_error", True),
        ("ok", False),
    ]
    assert clock.slept == [pytest.approx(0.05)]  # the one hedge's wait; failover does not wait
    assert counted(reacher, "sent") == 1


async def test_zero_waits_for_the_intents_p95_and_not_before_its_first_answer() -> None:
    reacher, transport, clock = make("0")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    (first,) = await transport.sent(1)
    reply(first, 0.04)
    assert isinstance((await done(task))[0], Reply)
    assert clock.slept == []  # no history: no hedge
    task = asyncio.create_task(reach(reacher, clock, msg_id="msg_2"))
    second, hedge = (await transport.sent(3))[1:]
    assert hedge.at - second.at == pytest.approx(0.04)  # the p95 of what the intent answered in
    reply(hedge, 0.01)
    result, _ = await done(task)
    assert isinstance(result, Reply) and result.attempts[-1].hedge


async def test_a_caller_going_away_cancels_both_attempts() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert first.cancelled and hedge.cancelled
    assert set(inflight(reacher).values()) == {0}
    assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing of the race left running
    cancelled = [e for e in events(reacher, "attempt") if e.get("cancelled")]
    assert len(cancelled) == 2


async def test_a_reloaded_dictionary_turns_hedging_off() -> None:
    reacher, transport, clock = make("50")
    await register(reacher, "a", "b")
    reacher.router.dictionary = parse_dictionary(dictionary(None))
    task = asyncio.create_task(reach(reacher, clock))
    (first,) = await transport.sent(1)
    reply(first, 0.3)
    assert isinstance((await done(task))[0], Reply)
    assert len(transport.calls) == 1 and clock.slept == []


async def test_the_hedges_slot_is_claimed_when_the_hedge_is_chosen() -> None:
    # one attempt at a time per endpoint: the hedge takes the other endpoint's only slot as it
    # is chosen, before its attempt's task has run, so a request choosing in that window finds
    # no free slot (it used to find one: two attempts at an endpoint bounded to one)
    reacher, transport, clock = make("50", max_inflight_per_endpoint=1)
    await register(reacher, "a", "b")
    router = reacher.router
    plan = await router.route(TAG, None)
    free_when_chosen: list[str | None] = []
    write = reacher.hedger.trace

    def trace(trace_id: str, kind: str, **data: Any) -> None:
        if kind == "hedge" and data.get("sent"):
            free_when_chosen.append(router.choose(plan, free_only=True))
        write(trace_id, kind, **data)

    reacher.hedger.trace = trace
    task = asyncio.create_task(reach(reacher, clock))
    first, hedge = await transport.sent(2)
    assert first.endpoint_id != hedge.endpoint_id
    assert free_when_chosen == [None]
    assert router.slots.reserved == {}  # the claim became the hedge attempt's own slot
    assert inflight(reacher) == {first.endpoint_id: 1, hedge.endpoint_id: 1}
    reply(hedge, 0.01)
    assert isinstance((await done(task))[0], Reply)
    assert set(inflight(reacher).values()) == {0}


async def test_a_retry_is_counted_at_the_endpoint_whose_slot_it_got() -> None:
    # (not a hedge: the retry rules this harness drives too) one attempt at a time per
    # endpoint. b's slot is held by a request hinted there; the failed attempt at a hands a's
    # slot to another hinted request waiting for it, so the retry's choice is b (a failover),
    # and it waits. a frees first: the retry goes to a again, and is counted as what it was
    # (same_endpoint), not as the failover to b first chosen.
    reacher, transport, clock = make(None, max_inflight_per_endpoint=1)
    await register(reacher, "a", "b")
    on_b = asyncio.create_task(reach(reacher, clock, recipient_hint="agent://b", msg_id="m_b"))
    (held_b,) = await transport.sent(1)
    task = asyncio.create_task(reach(reacher, clock, msg_id="msg_retry"))
    first = (await transport.sent(2))[1]
    assert (held_b.endpoint_id, first.endpoint_id) == ("agent://b", "agent://a")
    on_a = asyncio.create_task(reach(reacher, clock, recipient_hint="agent://a", msg_id="m_a"))
    await until(lambda: reacher.router.slots.waiting == 1, "the hinted request waiting for a")
    reply(first, 0.01, Outcome.SERVER_ERROR)  # a's slot goes to the hinted request
    held_a = (await transport.sent(3))[2]
    assert held_a.endpoint_id == "agent://a"
    await until(lambda: reacher.router.slots.waiting == 1, "the retry waiting for a slot")
    reply(held_a, 0.01)  # a frees first
    retry = (await transport.sent(4))[3]
    assert retry.endpoint_id == "agent://a"
    reply(retry, 0.01)
    reply(held_b, 0.01)
    for request in (task, on_a, on_b):
        assert isinstance((await done(request))[0], Reply)
    samples = reacher.metrics.registry
    kinds = {
        kind: samples.get_sample_value("agent_reach_retries_total", {"kind": kind}) or 0.0
        for kind in ("failover", "same_endpoint")
    }
    assert kinds == {"failover": 0.0, "same_endpoint": 1.0}


async def test_a_failover_given_the_slot_of_the_endpoint_it_tried_waits_its_backoff() -> None:
    """Every endpoint at its bound of 1: after a 5xx at e1 (whose slot another request takes at
    once) the retry's choice is a failover to e2, busy too, and the first slot to come free is
    e1's. Taking it is a retry of the same endpoint, which waits its backoff first (CONTRACT:
    0.5 x per-try, jittered 50-100 %); a review found it sent at once."""
    reacher, transport, clock = make(None, max_inflight_per_endpoint=1)
    await register(reacher, "a", "b")
    request = asyncio.create_task(reach(reacher, clock, timeout_ms=10000))
    (first,) = await transport.sent(1)
    e1 = first.endpoint_id
    e2 = "agent://b" if e1 == "agent://a" else "agent://a"
    on_e2 = asyncio.create_task(reach(reacher, clock, recipient_hint=e2, timeout_ms=10000))
    (_, held_e2) = await transport.sent(2)
    on_e1 = asyncio.create_task(reach(reacher, clock, recipient_hint=e1, timeout_ms=10000))
    await until(lambda: reacher.router.slots.waiting == 1, "a request waits for e1")
    reply(first, 0.01, Outcome.SERVER_ERROR)  # e1's slot goes to the request waiting for it
    (_, _, held_e1) = await transport.sent(3)
    assert held_e1.endpoint_id == e1
    await until(lambda: reacher.router.slots.waiting == 1, "the retry waits for a slot")
    freed = clock.now
    reply(held_e1, 0.0)  # e1 comes free first
    assert isinstance((await done(on_e1))[0], Reply)
    (*_, retry) = await transport.sent(4)
    assert retry.endpoint_id == e1
    assert retry.at - freed >= 0.5 * 2.0 * 0.5 - 1e-9, retry.at - freed  # the shortest backoff
    reply(retry, 0.01)
    result, _ = await done(request)
    assert isinstance(result, Reply) and result.endpoint_id == e1, result
    reply(held_e2, 0.01)
    assert isinstance((await done(on_e2))[0], Reply)
