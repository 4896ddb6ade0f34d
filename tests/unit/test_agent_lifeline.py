"""The agent's heartbeat line without sleeping: the pure schedule (agent_reach.sdk._schedule),
and the line itself (agent_reach.sdk._beat.HeartbeatLine) driving a real ReachClient against a
scripted stand-in for the gateway's HTTP API (an external edge), with every wait through a
FakeClock. The stand-in checks each body with the gateway's own wire types."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.errors import AgentReachError, InvalidRequest
from agent_reach.sdk._beat import HeartbeatLine, failover_logger
from agent_reach.sdk._schedule import Outcome, beat_timeout, call_bounds, next_wait, sleep_for
from agent_reach.sdk._wire import register_body
from agent_reach.sdk.client import ReachClient
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import EndpointIdBody, RegisterBody, decode
from tests.support import served

ID = "agent://line-01"


class Top(random.Random):
    """Every jitter draw at the top of its range: the schedule's upper bounds, exactly."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Bottom(random.Random):
    """Every jitter draw at the bottom of its range."""

    def uniform(self, a: float, b: float) -> float:
        return a


# --- the schedule, pure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "registered", "interval", "top"),
    [
        (1, False, 10.0, 0.25),
        (2, False, 10.0, 0.5),
        (3, False, 10.0, 1.0),
        (4, False, 10.0, 2.0),
        (5, False, 10.0, 4.0),
        (6, False, 10.0, 5.0),  # retry_max_s
        (60, False, 10.0, 5.0),
        (10_000, False, 10.0, 5.0),  # no overflow
        (3, True, 0.5, 0.5),  # registered: never longer than the interval
        (6, True, 10.0, 5.0),
        (1, True, 0.1, 0.1),
    ],
)
def test_the_backoff_doubles_from_a_quarter_second_up_to_its_cap(
    failures: int, registered: bool, interval: float, top: float
) -> None:
    for outcome in (Outcome.FAILED, Outcome.REFUSED):
        options: dict[str, Any] = {
            "failures": failures,
            "interval": interval,
            "registered": registered,
            "retry_max_s": 5.0,
        }
        assert next_wait(outcome, rng=Top(), **options) == pytest.approx(top)
        assert next_wait(outcome, rng=Bottom(), **options) == pytest.approx(top / 2)


def test_a_heartbeat_period_is_early_and_jittered_and_404_waits_for_nothing() -> None:
    options: dict[str, Any] = {"failures": 7, "interval": 10.0, "registered": True}
    assert next_wait(Outcome.OK, rng=Top(), retry_max_s=5.0, **options) == pytest.approx(8.0)
    assert next_wait(Outcome.OK, rng=Bottom(), retry_max_s=5.0, **options) == pytest.approx(6.0)
    assert next_wait(Outcome.UNKNOWN, rng=Top(), retry_max_s=5.0, **options) == 0.0


@given(
    outcome=st.sampled_from([Outcome.OK, Outcome.UNKNOWN, Outcome.FAILED, Outcome.REFUSED]),
    failures=st.integers(0, 100),
    interval=st.floats(0.01, 600),
    registered=st.booleans(),
    retry_max_s=st.floats(0.01, 60),
    seed=st.integers(0, 2**32),
)
def test_a_registered_line_never_waits_longer_than_an_interval(
    outcome: Outcome,
    failures: int,
    interval: float,
    registered: bool,
    retry_max_s: float,
    seed: int,
) -> None:
    wait = next_wait(
        outcome,
        failures=failures,
        interval=interval,
        registered=registered,
        retry_max_s=retry_max_s,
        rng=random.Random(seed),
    )
    assert wait >= 0.0
    if registered:
        assert wait <= interval
    if outcome is not Outcome.OK:
        assert wait <= retry_max_s


@pytest.mark.parametrize(
    ("interval", "several", "beat", "connect"),
    [
        (10.0, False, 5.0, 5.0),  # one gateway: the whole request timeout for both
        (0.5, False, 5.0, 5.0),
        (10.0, True, 1.5, 1.0),  # 0.15 x interval; connect_timeout_s
        (0.5, True, 0.25, 0.1),  # the floors
        (100.0, True, 5.0, 1.0),  # never past request_timeout_s / connect_timeout_s
    ],
)
def test_with_several_gateways_calls_leave_most_of_the_interval_for_moving(
    interval: float, several: bool, beat: float, connect: float
) -> None:
    bounds = call_bounds(interval, several=several, request_timeout_s=5.0, connect_timeout_s=1.0)
    assert bounds == pytest.approx((beat, connect))


def test_a_wait_counts_from_the_start_of_the_previous_call() -> None:
    assert sleep_for(1.6, started=100.0, now=100.0) == pytest.approx(1.6)  # answered at once
    assert sleep_for(1.6, started=100.0, now=101.0) == pytest.approx(0.6)  # a 1 s answer
    assert sleep_for(1.6, started=100.0, now=105.0) == 0.0  # slower than the wait: at once


@pytest.mark.parametrize(
    ("bound", "interval", "since", "timeout"),
    [
        (5.0, 10.0, 8.0, 1.0),  # one gateway: until 0.9 x the interval, not the whole 5 s
        (5.0, 10.0, 6.0, 3.0),
        (5.0, 2.0, 1.6, 0.25),  # never under 0.25 s (a busy gateway is not a dead one)
        (5.0, 2.0, 0.25, 1.55),  # a retry soon after a quick failure: the rest of the 0.9
        (5.0, 100.0, 60.0, 5.0),  # never past the bound
        (1.5, 10.0, 6.0, 1.5),  # several gateways: call_bounds' 0.15 x the interval still holds
        (0.1, 10.0, 8.0, 0.1),  # a request_timeout_s under the floor
    ],
)
def test_a_heartbeat_waits_until_nine_tenths_of_the_interval_after_the_last_call_started(
    bound: float, interval: float, since: float, timeout: float
) -> None:
    assert beat_timeout(bound, interval=interval, since=since) == pytest.approx(timeout)


@given(
    bound=st.floats(0.01, 60),
    interval=st.floats(0.01, 600),
    since=st.floats(0, 600),
)
def test_a_heartbeat_never_waits_past_nine_tenths_of_the_interval_or_its_bound(
    bound: float, interval: float, since: float
) -> None:
    timeout = beat_timeout(bound, interval=interval, since=since)
    assert 0.0 < timeout <= bound
    assert since + timeout <= max(0.9 * interval, since + 0.25) + 1e-9


@pytest.mark.parametrize("rng", [Top(), Bottom()], ids=["top", "bottom"])
@pytest.mark.parametrize("interval", [2.0, 10.0])
def test_after_one_timed_out_heartbeat_the_gateway_hears_again_within_the_interval(
    rng: random.Random, interval: float
) -> None:
    """One gateway, request_timeout_s 5 s: a heartbeat used to wait the whole 5 s and the wait
    after it counted from its end, so that the gateway next heard from the agent 0.8 x interval
    + 5 s + 0.25 s after the last beat (6.85 s at an interval of 2: past down-after, 3 x the
    interval; 13.25 s at 10: degraded). Here, on the schedule's own numbers."""
    bound, _ = call_bounds(interval, several=False, request_timeout_s=5.0, connect_timeout_s=1.0)
    options: dict[str, Any] = {"interval": interval, "registered": True, "retry_max_s": 5.0}
    beat = 0.0  # a heartbeat that worked started, and was answered, here
    wait = next_wait(Outcome.OK, failures=0, rng=rng, **options)
    start = beat + sleep_for(wait, started=beat, now=beat)
    ended = start + beat_timeout(bound, interval=interval, since=start - beat)  # no answer
    wait = next_wait(Outcome.FAILED, failures=1, rng=rng, **options)
    retry = ended + sleep_for(wait, started=start, now=ended)
    assert retry < interval  # before the gateway's degraded-after (1 x the interval)
    assert retry <= max(0.9 * interval, start + 0.25) + 1e-9


@pytest.mark.parametrize(
    ("gateways", "connect"),
    [
        (["http://127.0.0.1:1", "http://127.0.0.1:2"], 1.0),  # several gateways: bounded
        (["http://127.0.0.1:1"], 5.0),
        # several NATS servers are one NATS system, not gateways to move between
        (["nats://127.0.0.1:1", "nats://127.0.0.1:2"], 5.0),
    ],
)
async def test_several_nats_servers_count_as_one_gateway_for_the_call_bounds(
    gateways: list[str], connect: float
) -> None:
    async with ReachClient(gateways) as client:
        registration = register_body("agent://w-01", ["w.query"], "http://127.0.0.1:9/r", "")
        HeartbeatLine(client, registration, clock=FakeClock(), request_timeout_s=5.0)
        assert client.connect_timeout_s == pytest.approx(connect)


# --- the line, against a scripted gateway ----------------------------------------------------


@dataclass
class Seen:
    path: str
    body: Any
    authorization: str | None


@dataclass
class Scripted:
    """Answers each call with the next scripted (path, status, body: JSON, or raw bytes),
    checking that the call is to that path and that its body is what the gateway decodes; once
    the script is done, holds every call (the line parks in it) until ``release``, and sets
    ``done``."""

    script: list[tuple[str, int, Any]]
    seen: list[Seen] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    # seconds each call takes on ``clock`` (the line's), in order; then none
    took: list[float] = field(default_factory=list)
    clock: FakeClock | None = None

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if self.took and self.clock is not None:
            self.clock.advance(self.took.pop(0))
        kind = RegisterBody if request.path == "/v1/register" else EndpointIdBody
        body = decode(raw, kind)  # raises on a body the gateway would refuse
        self.seen.append(Seen(request.path, body, request.headers.get("Authorization")))
        if not self.script:
            self.done.set()
            await self.release.wait()
            return web.json_response({"ok": False, "error": "internal_error"}, status=500)
        path, status, answer = self.script.pop(0)
        assert request.path == path, (request.path, path)
        if isinstance(answer, bytes):
            return web.Response(status=status, body=answer, content_type="application/json")
        return web.json_response(answer, status=status)

    def paths(self) -> list[str]:
        return [s.path.removeprefix("/v1/") for s in self.seen]


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    gw = Scripted([])
    app = web.Application()
    app.router.add_post("/v1/{call}", gw.handle)
    async with served(app) as url:
        gw.url = url
        try:
            yield gw
        finally:
            gw.release.set()  # what still waits on it ends, so that the server can stop


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A port bound and never listening: connections are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def registered(interval: float = 2.0, **extra: Any) -> tuple[str, int, dict[str, Any]]:
    return (
        "/v1/register",
        200,
        {"ok": True, "endpoint_id": ID, "heartbeat_interval_s": interval, **extra},
    )


def beat(status: str = "healthy", **extra: Any) -> tuple[str, int, dict[str, Any]]:
    return ("/v1/heartbeat", 200, {"ok": True, "endpoint_id": ID, "status": status, **extra})


def error(path: str, status: int, code: str, **extra: Any) -> tuple[str, int, dict[str, Any]]:
    return (path, status, {"ok": False, "error": code, "detail": f"told to ({code})", **extra})


@dataclass
class Run:
    line: HeartbeatLine
    clock: FakeClock
    client: ReachClient
    first: list[AgentReachError | None]
    task: asyncio.Task[None]


@pytest.fixture
async def runs() -> AsyncIterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        await run.client.close()


async def start(
    runs: list[Run],
    gateways: list[str],
    *,
    token: str | None = None,
    rng: random.Random | None = None,
) -> Run:
    clock = FakeClock()
    client = ReachClient(gateways, token=token, clock=clock, on_failover=failover_logger(ID))
    body = register_body(ID, ["line.echo"], "http://127.0.0.1:9/reach", "a line under test")
    line = HeartbeatLine(client, body, clock=clock, rng=rng or Top())
    first: list[AgentReachError | None] = []
    run = Run(line, clock, client, first, asyncio.create_task(line.run(first.append)))
    runs.append(run)
    return run


async def parked(gw: Scripted) -> None:
    """Until the line has made every scripted call and waits in the next one."""
    await asyncio.wait_for(gw.done.wait(), 10)


async def test_failures_back_off_exponentially_then_heartbeats_keep_the_interval(
    scripted: Scripted, runs: list[Run]
) -> None:
    unavailable = error("/v1/register", 503, "backend_unavailable")
    scripted.script = [unavailable] * 6 + [registered(interval=2.0), beat(), beat()]
    run = await start(runs, [scripted.url])
    await parked(scripted)
    assert run.first == [None]  # the first attempt failed; not a refusal
    # 0.25 s doubling up to retry_max_s (5 s), then 0.8 x the interval between heartbeats
    assert run.clock.slept == pytest.approx([0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 1.6, 1.6, 1.6])
    assert scripted.paths() == ["register"] * 7 + ["heartbeat"] * 3
    assert run.line.registered and run.line.interval == 2.0 and run.line.beats == 2


async def test_a_slow_answer_does_not_push_the_next_heartbeat_back(
    scripted: Scripted, runs: list[Run]
) -> None:
    """The wait after a call counted from its end: a heartbeat answered in 1 s came 1 s late."""
    scripted.script = [registered(interval=2.0), beat(), beat(), beat()]
    scripted.took = [0.0, 0.0, 1.0, 2.5]  # register, beat, a slow beat, one slower than a period
    run = await start(runs, [scripted.url])
    scripted.clock = run.clock
    await parked(scripted)
    # 0.8 x the interval from each call's start: 1.6 - 1.0 after the slow one, none after 2.5 s
    assert run.clock.slept == pytest.approx([1.6, 1.6, 0.6, 0.0])
    assert scripted.paths() == ["register"] + ["heartbeat"] * 4


async def test_a_heartbeat_answered_404_registers_again_at_once(
    scripted: Scripted, runs: list[Run], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_reach")
    gone = error("/v1/heartbeat", 404, "endpoint_not_registered")
    scripted.script = [registered(), beat(), gone, registered(), beat()]
    run = await start(runs, [scripted.url])
    await parked(scripted)
    assert (
        scripted.paths() == ["register", "heartbeat", "heartbeat", "register"] + ["heartbeat"] * 2
    )
    assert run.clock.slept == pytest.approx([1.6, 1.6, 0.0, 1.6, 1.6])  # none after the 404
    again = scripted.seen[3].body
    assert again == scripted.seen[0].body and again.endpoint_id == ID
    events = [r.getMessage() for r in caplog.records]
    assert events.count("agent.registered") == 2 and "agent.reregistering" in events


async def test_once_registered_a_failing_gateway_is_retried_within_the_interval(
    scripted: Scripted, runs: list[Run]
) -> None:
    failing = error("/v1/heartbeat", 500, "internal_error")
    scripted.script = [registered(interval=0.5), failing, failing, failing, failing, beat()]
    run = await start(runs, [scripted.url])
    await parked(scripted)
    # 0.4 (a period), then 0.25 and 0.5, capped at the 0.5 s interval from there
    assert run.clock.slept == pytest.approx([0.4, 0.25, 0.5, 0.5, 0.5, 0.4])
    assert scripted.paths() == ["register"] + ["heartbeat"] * 6  # no registering again


async def test_an_unreachable_gateway_is_retried_with_the_backoff(
    dead_url: str, runs: list[Run], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_reach")
    run = await start(runs, [dead_url], rng=Bottom())
    for _ in range(200):
        if len(run.clock.slept) >= 4:
            break
        await asyncio.sleep(0.01)
    assert run.first == [None] and not run.line.registered
    assert run.clock.slept[:4] == pytest.approx([0.125, 0.25, 0.5, 1.0])
    warned = [r for r in caplog.records if r.getMessage() == "agent.gateway_unavailable"]
    assert warned and warned[0].data["doing"] == "register"  # type: ignore[attr-defined]
    assert "ClientConnectorError" in warned[0].data["error"]  # type: ignore[attr-defined]


async def test_a_refused_registration_is_reported_and_ends_the_line(
    scripted: Scripted, runs: list[Run]
) -> None:
    scripted.script = [error("/v1/register", 422, "invalid_request", field="endpoint_url")]
    run = await start(runs, [scripted.url])
    await asyncio.wait_for(run.task, 10)
    (refusal,) = run.first
    assert isinstance(refusal, InvalidRequest) and refusal.http_status == 422
    assert refusal.fields["field"] == "endpoint_url"
    assert run.clock.slept == [] and not run.line.registered


async def test_an_endpoint_held_elsewhere_is_waited_for_not_raised(
    scripted: Scripted, runs: list[Run]
) -> None:
    held = error("/v1/register", 403, "forbidden", reason="endpoint_held")
    scripted.script = [held, held, registered()]
    run = await start(runs, [scripted.url])
    await parked(scripted)
    assert run.first == [None] and run.line.registered
    assert run.clock.slept == pytest.approx([0.25, 0.5, 1.6])


async def test_token_mode_renews_from_heartbeats_and_reenrolls_when_refused(
    scripted: Scripted, runs: list[Run]
) -> None:
    scripted.script = [
        registered(token="ep-1", token_expires_at=2e9),
        beat(),
        beat(token="ep-2", token_expires_at=2e9),  # renewed: replaces ep-1
        error("/v1/heartbeat", 401, "unauthorized"),  # ep-2 refused (expired while paused)
        registered(token="ep-3"),
        beat(),
    ]
    run = await start(runs, [scripted.url], token="enroll-1")
    await parked(scripted)
    presented = [(s.path.removeprefix("/v1/"), s.authorization) for s in scripted.seen]
    assert presented == [
        ("register", "Bearer enroll-1"),
        ("heartbeat", "Bearer ep-1"),
        ("heartbeat", "Bearer ep-1"),
        ("heartbeat", "Bearer ep-2"),
        ("register", "Bearer enroll-1"),  # the refused endpoint token was dropped
        ("heartbeat", "Bearer ep-3"),
        ("heartbeat", "Bearer ep-3"),
    ]
    assert run.clock.slept == pytest.approx([1.6, 1.6, 1.6, 0.0, 1.6, 1.6])
    assert run.client.endpoint_token(ID) == "ep-3"


async def test_deregistering_presents_the_endpoint_token(
    scripted: Scripted, runs: list[Run]
) -> None:
    scripted.script = [registered(token="ep-1")]
    run = await start(runs, [scripted.url], token="enroll-1")
    await parked(scripted)  # in its first heartbeat
    run.task.cancel()  # as Lifeline.stop() does, in the middle of a call
    await asyncio.gather(run.task, return_exceptions=True)
    assert run.line.registered
    scripted.script.append(("/v1/deregister", 200, {"ok": True}))
    await run.line.deregister()
    assert not run.line.registered
    last = scripted.seen[-1]
    assert (last.path, last.body.endpoint_id, last.authorization) == (
        "/v1/deregister",
        ID,
        "Bearer ep-1",
    )
    assert run.client.endpoint_token(ID) is None


async def test_a_dead_first_gateway_is_passed_over_for_the_next(
    dead_url: str, scripted: Scripted, runs: list[Run], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_reach")
    # a long interval: the heartbeat that parks waits 5 s before the line moves on
    scripted.script = [registered(interval=100.0)]
    run = await start(runs, [dead_url, scripted.url])
    await parked(scripted)
    assert run.first == [None] and run.client.gateway == scripted.url
    assert run.clock.slept == pytest.approx([80.0])  # the move cost no backoff
    moves = [r.data for r in caplog.records if r.getMessage() == "agent.gateway_failover"]  # type: ignore[attr-defined]
    assert [(m["from"], m["to"], m["failed"]) for m in moves] == [
        (dead_url, scripted.url, "register")
    ]


async def test_an_answer_nested_too_deeply_is_a_bad_answer_and_backed_off(
    scripted: Scripted, runs: list[Run], caplog: pytest.LogCaptureFixture
) -> None:
    """msgspec raises RecursionError (not DecodeError) on JSON nested past its depth: read as
    an answer that is not the contract's, like any other that is not JSON."""
    caplog.set_level(logging.WARNING, logger="agent_reach")
    deep = ("/v1/heartbeat", 200, b"[" * 5000 + b"]" * 5000)
    scripted.script = [registered(interval=2.0), deep, beat()]
    run = await start(runs, [scripted.url])
    await parked(scripted)
    assert run.clock.slept == pytest.approx([1.6, 0.25, 1.6])  # backed off once, then beating
    assert run.line.registered and run.line.beats == 1
    (warned,) = [r for r in caplog.records if r.getMessage() == "agent.gateway_unavailable"]
    assert "not JSON" in warned.data["error"]  # type: ignore[attr-defined]
    assert "agent.lifeline_error" not in [r.getMessage() for r in caplog.records]


async def test_anything_else_a_call_raises_is_logged_backed_off_and_the_line_goes_on(
    scripted: Scripted, runs: list[Run], caplog: pytest.LogCaptureFixture
) -> None:
    """A call raising what no branch foresaw (a bug: injected here as the client's heartbeat
    raising RuntimeError twice; an error body with a field named ``self`` once did it, by a
    TypeError building the typed error) used to end the line for good, the agent serving on.
    It is logged, backed off, and the line goes on."""
    caplog.set_level(logging.WARNING, logger="agent_reach")
    scripted.script = [registered(interval=2.0), beat()]
    run = await start(runs, [scripted.url])  # (its task has not run yet)
    real = run.client.heartbeat
    faults = [RuntimeError("a bug"), RuntimeError("a bug")]

    async def heartbeat(*args: Any, **kwargs: Any) -> Any:
        if faults:
            raise faults.pop(0)
        return await real(*args, **kwargs)

    run.client.heartbeat = heartbeat  # type: ignore[method-assign]
    await parked(scripted)
    assert run.clock.slept == pytest.approx([1.6, 0.25, 0.5, 1.6])  # the failures' backoff
    assert run.line.registered and run.line.beats == 1
    assert scripted.paths() == ["register", "heartbeat", "heartbeat"]  # (the last one parked)
    # one line (with the traceback) for both: at most one a minute
    (line,) = [r for r in caplog.records if r.getMessage() == "agent.lifeline_error"]
    assert line.levelno == logging.ERROR and line.exc_info is not None
    assert line.data["doing"] == "heartbeat" and "RuntimeError" in line.data["error"]  # type: ignore[attr-defined]
