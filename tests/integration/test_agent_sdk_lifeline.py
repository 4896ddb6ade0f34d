"""The agent SDK's heartbeat line with real processes: heartbeats stay on time while business
work blocks every worker thread or the event loop itself, the agent registers again after a
gateway restart or once a late gateway comes up, and it deregisters on SIGTERM and SIGINT.

The gateway runs with ``--heartbeat-interval 1``: the agent beats every 0.6-0.8 s and is
``degraded`` at the gateway after 1 s without one, so a single late heartbeat shows. (At 0.5 s
the slack was 0.1 s, and a loaded two-core CI machine, stalling every process for 0.3 s, once
made a heartbeat "late" with the agent doing nothing wrong.)"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Iterator

import pytest

from agent_reach.errors import InvalidRequest
from agent_reach.sdk import Agent
from tests.agents.sdk_support import (
    Background,
    agent_record,
    deliver,
    events,
    free_port,
    key,
    send,
    start_sdk_agent,
)
from tests.support import Proc, gateway, status_of, wait_until

INTERVAL = 1.0
WATCH_S = 4.5 * INTERVAL  # more than four heartbeat intervals


@pytest.fixture(scope="module")
def fast_gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", str(INTERVAL)) as proc:
        yield proc


@pytest.fixture(scope="module")
def slow_gw() -> Iterator[Proc]:
    """The default 10 s interval: a heartbeat sleep is 6-8 s long."""
    with gateway() as proc:
        yield proc


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def watch_heartbeats(gw: str, endpoint_id: str, seconds: float) -> list[float]:
    """Poll the gateway's record for ``seconds``: it must stay healthy throughout. Returns the
    distinct ``last_seen_at`` values seen, in order."""
    seen: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        code, record = agent_record(gw, endpoint_id)
        assert code == 200, record
        assert record["status"] == "healthy", (record, seen)
        if not seen or record["last_seen_at"] != seen[-1]:
            seen.append(record["last_seen_at"])
        time.sleep(0.05)  # the polling period, not a wait for anything to happen
    return seen


def assert_beating(seen: list[float], seconds: float) -> None:
    # 0.6-0.8 x INTERVAL apart: at least floor(seconds / (0.8 x INTERVAL)) new ones, none late
    assert len(seen) - 1 >= int(seconds / (0.8 * INTERVAL)) - 1, seen
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert all(0 < gap < INTERVAL for gap in gaps), gaps


def test_heartbeats_stay_on_time_while_every_worker_thread_is_blocked(
    fast_gw: Proc, procs: list[Proc]
) -> None:
    agent = start_sdk_agent(fast_gw.url, "agent://sdk-busy-01", workers=2)
    procs.append(agent)
    keys = [key(), key()]
    holds = [Background(lambda k=k: deliver(agent.url, "sdk.hold", {"key": k})) for k in keys]
    wait_until(lambda: len(events(agent, "sdk.hold.entered")) == 2, timeout=5)
    queued = Background(lambda: deliver(agent.url, "sdk.echo", {}))  # no worker is free
    seen = watch_heartbeats(fast_gw.url, "agent://sdk-busy-01", WATCH_S)
    assert not queued.done()  # the pool really was full the whole time
    assert_beating(seen, WATCH_S)
    assert deliver(agent.url, "sdk.release", {"keys": keys})[0] == 200  # async: no worker
    assert [h.join(5)[1]["run"] for h in holds] == [1, 1]
    assert queued.join(5)[0] == 200


def test_heartbeats_stay_on_time_while_a_handler_blocks_the_event_loop(
    fast_gw: Proc, procs: list[Proc]
) -> None:
    agent = start_sdk_agent(fast_gw.url, "agent://sdk-blocked-01")
    procs.append(agent)
    block_s = WATCH_S + 0.5
    blocker = Background(lambda: deliver(agent.url, "sdk.block-loop", {"seconds": block_s}))
    wait_until(lambda: events(agent, "sdk.block_loop.entered"), timeout=5)
    ping = Background(lambda: deliver(agent.url, "sdk.aecho", {}))  # needs the loop
    seen = watch_heartbeats(fast_gw.url, "agent://sdk-blocked-01", WATCH_S)
    assert not ping.done()  # the event loop really was blocked the whole time
    assert_beating(seen, WATCH_S)
    status, answer = blocker.join(block_s + 5)
    assert status == 200 and answer["slept_s"] >= block_s
    assert ping.join(5)[0] == 200


def test_the_agent_registers_again_after_the_gateway_restarts(procs: list[Proc]) -> None:
    port = free_port()
    flags = ("--port", str(port), "--heartbeat-interval", str(INTERVAL))
    with gateway(*flags) as first:
        agent = start_sdk_agent(first.url, "agent://sdk-phoenix-01")
        procs.append(agent)
        assert status_of(first.url, "agent://sdk-phoenix-01") == "healthy"
    # the first gateway is gone, and its in-memory registry with it: the agent keeps trying
    wait_until(lambda: events(agent, "agent.gateway_unavailable"), timeout=5)
    with gateway(*flags) as second:
        wait_until(lambda: status_of(second.url, "agent://sdk-phoenix-01") == "healthy", 5)
        assert agent.popen.poll() is None  # the same agent process, never restarted
        # the agent logs its registration after the gateway has recorded it
        wait_until(lambda: len(events(agent, "agent.registered")) == 2, timeout=5)
        assert events(agent, "agent.reregistering")  # its heartbeat was answered 404
        status, body = send(second.url, intent="sdk.aecho", payload={"n": 1})
        assert (status, body["endpoint_id"]) == (200, "agent://sdk-phoenix-01")


def test_an_agent_started_before_its_gateway_serves_and_registers_once_it_is_up(
    procs: list[Proc],
) -> None:
    port = free_port()
    gw_url = f"http://127.0.0.1:{port}"
    agent = start_sdk_agent(gw_url, "agent://sdk-early-01")  # nothing listens on port yet
    procs.append(agent)
    wait_until(lambda: events(agent, "agent.gateway_unavailable", doing="register"), 5)
    assert deliver(agent.url, "sdk.aecho", {"n": 1})[0] == 200  # and it serves meanwhile
    with gateway("--port", str(port), "--heartbeat-interval", str(INTERVAL)) as gw:
        wait_until(lambda: status_of(gw.url, "agent://sdk-early-01") == "healthy", timeout=5)
        wait_until(lambda: len(events(agent, "agent.registered")) == 1, timeout=5)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_deregisters_the_agent_promptly(
    slow_gw: Proc, procs: list[Proc], sig: signal.Signals
) -> None:
    name = f"agent://sdk-leaving-{sig.name.lower()}"
    agent = start_sdk_agent(slow_gw.url, name)
    procs.append(agent)
    assert status_of(slow_gw.url, name) == "healthy"
    started = time.monotonic()
    assert agent.stop(sig, timeout=5) == 0
    assert time.monotonic() - started < 2.0  # no heartbeat sleep was waited out
    assert status_of(slow_gw.url, name) == "http 404"
    assert events(agent, "agent.deregistered")


async def test_start_and_stop_in_process_and_a_refused_registration_raises(
    fast_gw: Proc,
) -> None:
    agent = Agent("agent://sdk-inproc-01", gateway=fast_gw.url, description="in process")
    agent.handle("sdk.inproc")(lambda payload, ctx: {"ok": payload})
    await agent.start()
    try:
        assert agent.registered and agent.heartbeat_interval == INTERVAL
        code, record = await asyncio.to_thread(agent_record, fast_gw.url, agent.endpoint_id)
        assert (code, record["endpoint_url"]) == (200, agent.url)
        with pytest.raises(RuntimeError, match="before the agent starts"):
            agent.handle("sdk.late")
    finally:
        await agent.stop()
    assert not agent.registered
    assert await asyncio.to_thread(status_of, fast_gw.url, agent.endpoint_id) == "http 404"

    # a URL no resolver takes: the gateway refuses it (422), and the lifespan says so
    refused = Agent("agent://sdk-refused-01", gateway=fast_gw.url)
    refused.handle("sdk.inproc")(lambda payload, ctx: None)
    with pytest.raises(InvalidRequest, match="endpoint_url"):
        async with refused.lifespan(endpoint_url="http://a..b/reach")(None):
            pytest.fail("the app must not start")
    assert not refused.registered
