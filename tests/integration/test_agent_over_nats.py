"""The agent SDK serving over NATS, with a real gateway (``--nats``) and real agent processes:
registration of ``nats:<subject>`` and no open port, ``/v1/send`` reaching the handler with its
context, the outcomes of a Reject and of a crash, two replicas in one queue group sharing the
load, a replica SIGKILLed under load losing no request, the 503 past ``max_inflight``, one run
of a msg_id delivered again across a reconnect, and heartbeats that stay on time while the
handlers block every worker thread or the event loop."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from agent_reach.errors import BackendUnavailable, ConfigError
from agent_reach.sdk import Agent
from agent_reach.settings import gateway_urls
from tests.agents.sdk_support import SDK_AGENT, agent_record, events, key
from tests.nats_support import NATS_URL, ask, new_prefix, private_server
from tests.support import (
    BEHAVE,
    Proc,
    free_port,
    gateway,
    http,
    metric,
    start_sdk_agent,
    status_of,
    until,
    wait_until,
)

INTERVAL = 0.5  # the gateway's heartbeat interval where heartbeats are watched
WATCH_S = 4.5 * INTERVAL


# --- processes --------------------------------------------------------------------------------


def behave(gw: str, endpoint_id: str, mode: str = "ok", *flags: str, serve: str = NATS_URL) -> Proc:
    """tests/agents/behave.py serving over NATS (``--serve``), once it printed the ``nats:`` URL
    it registered (after its first registration attempt)."""
    cmd = [sys.executable, str(BEHAVE), "--gateway", gw, "--id", endpoint_id, "--mode", mode]
    proc = start_sdk_agent([*cmd, "--intents", "nats.echo", "--serve", serve, *flags])
    assert proc.url.startswith("nats:"), proc.url
    return proc


def sdk_agent(gw: str, endpoint_id: str, serve: str = NATS_URL, workers: int = 4) -> Proc:
    """tests/agents/sdk_agent.py, switched to NATS by $AGENT_REACH_SERVE alone (as the demo
    agents and the end-to-end suite are)."""
    cmd = [sys.executable, str(SDK_AGENT), "--gateway", gw, "--id", endpoint_id]
    return start_sdk_agent([*cmd, "--workers", str(workers)], env={"AGENT_REACH_SERVE": serve})


def listening_ports(pid: int) -> list[str]:
    """The TCP sockets process ``pid`` listens on (from /proc: state 0A is LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                found.append(cols[1])
    return found


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture
def prefix() -> str:
    return new_prefix()


@pytest.fixture
def gw(prefix: str) -> Iterator[Proc]:
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix) as proc:
        yield proc


@pytest.fixture
async def nc() -> AsyncIterator[Client]:
    client = await nats.connect(NATS_URL, connect_timeout=2, allow_reconnect=False)
    try:
        yield client
    finally:
        await client.close()


def name(what: str) -> str:
    """A fresh endpoint id (so a fresh default subject): tests do not see each other."""
    return f"agent://nats-{what}-{secrets.token_hex(3)}"


def send(gw: str, **body: Any) -> tuple[int, Any]:
    return http("POST", f"{gw}/v1/send", body)


async def deliver(
    client: Client,
    subject: str,
    intent: str,
    payload: Any = None,
    *,
    msg_id: str | None = None,
    wait_s: float = 30.0,
) -> tuple[int, Any, dict[str, str]]:
    """A NATS request to an agent's subject, as the gateway makes it: (status, body, headers)."""
    msg_id = msg_id or f"msg_{key()}"
    body = {"intent": intent, "payload": payload, "msg_id": msg_id, "trace_id": "trace_nats"}
    headers = {
        "X-Reach-Msg-Id": msg_id,
        "X-Reach-Trace-Id": "trace_nats",
        "X-Reach-Attempt": "1",
        "X-Reach-Deadline-Ms": "60000",
    }
    answer = await ask(client, subject, body, headers, wait_s)
    return answer.status, answer.body, answer.headers


# --- the tests --------------------------------------------------------------------------------


def test_an_agent_over_nats_registers_its_subject_and_is_reached_by_send(
    gw: Proc, procs: list[Proc]
) -> None:
    endpoint_id = name("echo")
    agent = behave(gw.url, endpoint_id)
    procs.append(agent)
    subject = "agents." + endpoint_id.removeprefix("agent://")
    assert agent.url == f"nats:{subject}"  # what run() prints: the URL it registered
    code, record = agent_record(gw.url, endpoint_id)
    assert (code, record["endpoint_url"], record["status"]) == (200, agent.url, "healthy")
    assert listening_ports(agent.popen.pid) == []  # no inbound port at all

    status, answer = send(
        gw.url,
        intent="nats.echo",
        payload={"city": "成都"},
        trace_id="trace_over_nats_1",
        sender="agent://nats-caller-01",
    )
    assert status == 200, answer
    assert [a["outcome"] for a in answer["attempts"]] == ["ok"]
    result = answer["result"]
    assert result["payload"] == {"city": "成都"}
    assert (result["trace_id"], result["msg_id"]) == ("trace_over_nats_1", answer["msg_id"])
    assert (result["attempt"], result["sender"]) == (1, "agent://nats-caller-01")
    assert 0 < result["deadline_ms"] <= 8000
    version, trace_hex, _, _ = result["traceparent"].split("-")
    assert version == "00" and len(trace_hex) == 32


def test_a_reject_is_final_and_a_crash_is_retried_over_nats(gw: Proc, procs: list[Proc]) -> None:
    rejecting, failing = name("reject"), name("fail")
    procs.append(behave(gw.url, rejecting, "reject"))
    status, answer = send(gw.url, intent="nats.echo", recipient_hint=rejecting)
    assert (status, answer["error"]) == (502, "agent_error"), answer
    assert [a["outcome"] for a in answer["attempts"]] == ["agent_error"]  # not retried

    procs.append(behave(gw.url, failing, "fail"))
    status, answer = send(gw.url, intent="nats.echo", recipient_hint=failing, timeout_ms=8000)
    assert status >= 500, answer
    outcomes = [a["outcome"] for a in answer["attempts"]]
    assert len(outcomes) >= 2 and set(outcomes) == {"server_error"}, answer  # retried
    assert len(events(procs[-1], "agent.handler_failed")) == len(outcomes)


def test_two_replicas_of_one_id_share_the_sends(gw: Proc, procs: list[Proc]) -> None:
    endpoint_id = name("replica")
    procs.extend([behave(gw.url, endpoint_id), behave(gw.url, endpoint_id)])
    pids = Counter()
    for _ in range(40):
        status, answer = send(gw.url, intent="nats.echo")
        assert status == 200, answer
        assert answer["endpoint_id"] == endpoint_id
        pids[answer["result"]["pid"]] += 1
    # one queue group: NATS hands each request to one member at random (P(< 5 of 40) ~ 1e-7)
    assert set(pids) == {p.popen.pid for p in procs}, pids
    assert min(pids.values()) >= 5, pids
    # and to one member only: each send ran one handler, in one replica
    assert sum(len(events(p, "agent.request")) for p in procs) == 40


def test_a_replica_killed_under_load_loses_no_request(gw: Proc, procs: list[Proc]) -> None:
    endpoint_id = name("victim")
    victim = behave(gw.url, endpoint_id, "slow", "--delay-ms", "20")
    survivor = behave(gw.url, endpoint_id, "slow", "--delay-ms", "20")
    procs.extend([victim, survivor])
    results: list[tuple[int, Any]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 6.0

    def caller() -> None:
        for _ in range(60):  # bounded in count and in time
            if time.monotonic() > stop_at:
                return
            result = send(gw.url, intent="nats.echo", timeout_ms=8000)
            with lock:
                results.append(result)

    def by(pid: int) -> int:
        with lock:
            return sum(1 for s, b in results if s == 200 and b["result"]["pid"] == pid)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(caller) for _ in range(8)]
        wait_until(lambda: by(victim.popen.pid) >= 20, timeout=5)  # both are serving
        victim.popen.send_signal(signal.SIGKILL)
        killed_at = len(results)
        for future in futures:
            future.result()
    failed = [b for s, b in results if s != 200]
    assert not failed, failed[:3]
    assert len(results) - killed_at >= 40  # the load went on after the kill
    assert by(survivor.popen.pid) > 0
    # requests the victim held when it died ended as timeouts and were retried, elsewhere
    retried = [b for _, b in results if len(b["attempts"]) > 1]
    assert all(b["result"]["pid"] == survivor.popen.pid for b in retried)
    assert status_of(gw.url, endpoint_id) == "healthy"  # the survivor keeps the id alive


def test_a_replica_that_stops_leaves_the_id_to_the_others_and_the_last_deregisters(
    gw: Proc, procs: list[Proc]
) -> None:
    endpoint_id = name("rolling")
    leaving = behave(gw.url, endpoint_id, "slow", "--delay-ms", "20")
    staying = behave(gw.url, endpoint_id, "slow", "--delay-ms", "20")
    procs.extend([leaving, staying])
    results: list[tuple[int, Any]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 6.0

    def caller() -> None:
        for _ in range(40):  # bounded in count and in time
            if time.monotonic() > stop_at:
                return
            result = send(gw.url, intent="nats.echo", timeout_ms=8000)
            with lock:
                results.append(result)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(caller) for _ in range(4)]
        wait_until(lambda: len(results) >= 20, timeout=5)
        assert leaving.stop(signal.SIGTERM) == 0  # a rolling restart: one replica goes
        stopped_at = len(results)
        for future in futures:
            future.result()
    failed = [b for s, b in results if s != 200]
    assert not failed, failed[:3]  # no send found the id unregistered meanwhile
    assert len(results) - stopped_at >= 20
    assert events(leaving, "agent.replicas_remain") and not events(leaving, "agent.deregistered")
    assert status_of(gw.url, endpoint_id) == "healthy"
    assert staying.stop(signal.SIGTERM) == 0  # the last one: nobody answers its probe
    assert events(staying, "agent.deregistered")
    assert status_of(gw.url, endpoint_id) == "http 404"


async def test_in_process_start_stop_a_body_over_the_limit_and_nats_away(
    gw: Proc, nc: Client
) -> None:
    agent = Agent(name("inproc"), gateway=gw.url, serve=NATS_URL, max_body_bytes=256)
    agent.handle("nats.echo")(lambda payload, ctx: {"got": payload})
    await agent.start()
    try:
        assert agent.registered and agent.url == f"nats:{agent.subject}"
        assert agent.subject is not None
        status, body, _ = await deliver(nc, agent.subject, "nats.echo", {"n": 1})
        assert (status, body) == (200, {"got": {"n": 1}})
        status, body, _ = await deliver(nc, agent.subject, "nats.echo", "x" * 300)
        assert (status, body["error"]) == (413, "payload_too_large")
    finally:
        await agent.stop()
    assert await asyncio.to_thread(status_of, gw.url, agent.endpoint_id) == "http 404"
    await agent.stop()  # twice is fine

    # no NATS server there: start() raises within its bound, and nothing is registered
    away = Agent(name("away"), gateway=gw.url, serve=f"nats://127.0.0.1:{free_port()}")
    away.handle("nats.echo")(lambda payload, ctx: None)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="NATS"):
        await away.start()
    assert time.monotonic() - started < 5
    assert not away.registered
    assert await asyncio.to_thread(status_of, gw.url, away.endpoint_id) == "http 404"


async def test_past_max_inflight_a_delivery_is_answered_503_at_once(
    gw: Proc, procs: list[Proc], nc: Client
) -> None:
    agent = await asyncio.to_thread(
        behave, gw.url, name("busy"), "slow", "--delay-ms", "1500", "--max-inflight", "2"
    )
    procs.append(agent)
    subject = agent.url.removeprefix("nats:")
    held = [asyncio.create_task(deliver(nc, subject, "nats.echo", {"n": n})) for n in (1, 2)]
    await asyncio.to_thread(wait_until, lambda: len(events(agent, "agent.request")) == 2, 5)
    started = time.monotonic()
    status, body, headers = await deliver(nc, subject, "nats.echo", {"n": 3})
    took = time.monotonic() - started
    assert (status, body["error"]) == (503, "backend_unavailable"), body
    assert took < 1.0, took  # not queued behind the two in hand (1.5 s each)
    assert "Status" not in headers and headers["Content-Type"] == "application/json"
    assert [(await t)[0] for t in held] == [200, 200]  # those in hand were not disturbed
    assert (await deliver(nc, subject, "nats.echo", {"n": 4}))[0] == 200  # room again
    assert len(events(agent, "agent.request")) == 3  # the refused one never reached a handler


async def test_a_msg_id_delivered_again_across_a_reconnect_runs_once(procs: list[Proc]) -> None:
    with private_server() as server, gateway("--nats", server.url) as gw:
        url = server.url
        agent = await asyncio.to_thread(sdk_agent, gw.url, name("dedup"), url)
        procs.append(agent)
        subject = agent.url.removeprefix("nats:")
        k, msg_id = key(), f"msg_{key()}"
        client = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            first = await deliver(client, subject, "sdk.count", {"key": k}, msg_id=msg_id)
            joined = await asyncio.gather(
                *(deliver(client, subject, "sdk.count", {"key": k}, msg_id=msg_id) for _ in "ab")
            )
        finally:
            await client.close()
        assert first[0] == 200 and first[1]["run"] == 1
        assert [j[1] for j in joined] == [first[1], first[1]]  # same nonce: the same run
        assert all('desc="cached"' in j[2]["Server-Timing"] for j in joined)

        await asyncio.to_thread(server.restart)  # every connection drops; the agent reconnects
        client = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:

            async def answers() -> bool:
                try:
                    return (await deliver(client, subject, "sdk.runs", wait_s=0.5))[0] == 200
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    return False

            await until(answers, 10, "the agent back", interval=0.05)
            again = await deliver(client, subject, "sdk.count", {"key": k}, msg_id=msg_id)
            _, runs, _ = await deliver(client, subject, "sdk.runs")
        finally:
            await client.close()
        assert again[0] == 200 and again[1] == first[1]  # the same answer, from the memory
        assert runs[k] == 1  # the handler ran once for all four deliveries
        assert events(agent, "nats.reconnected")
        assert len(events(agent, "agent.duplicate", msg_id=msg_id)) == 3


def watch_healthy(gw: str, endpoint_id: str, seconds: float) -> list[float]:
    """Poll the gateway's record for ``seconds``: healthy throughout; the distinct
    ``last_seen_at`` values seen."""
    seen: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        code, record = agent_record(gw, endpoint_id)
        assert code == 200, record
        assert record["status"] == "healthy", (record, seen)
        if not seen or record["last_seen_at"] != seen[-1]:
            seen.append(record["last_seen_at"])
        time.sleep(0.05)  # the polling period
    return seen


def assert_beating(seen: list[float]) -> None:
    # every 0.6-0.8 x 0.5 s: at least floor(WATCH_S / 0.4) - 1 new heartbeats, none late
    assert len(seen) - 1 >= int(WATCH_S / (0.8 * INTERVAL)) - 1, seen
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert all(0 < gap < INTERVAL for gap in gaps), gaps


@pytest.fixture
def fast_gw(prefix: str) -> Iterator[Proc]:
    flags = ("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", str(INTERVAL))
    with gateway(*flags) as proc:
        yield proc


def heartbeat_url(gw: Proc, prefix: str, over: str) -> str:
    """Where the agent heartbeats: the gateway's HTTP API, or its API over NATS (skipped while
    the client SDK does not take ``nats://`` gateway URLs)."""
    if over == "http":
        return gw.url
    url = f"{NATS_URL}/{prefix}"
    try:
        gateway_urls(url)
    except ConfigError:
        pytest.skip("ReachClient does not take nats:// gateway URLs yet")
    return url


def assert_line_went(agent: Proc, gw: Proc, gw_url: str, seen: list[float]) -> None:
    """The agent registered through ``gw_url``, and its heartbeats went over NATS only if
    that is a nats:// URL."""
    assert events(agent, "agent.registered")[0]["gateway"] == gw_url
    over_nats = metric(gw, "agent_reach_nats_api_requests_total", op="heartbeat", status="200")
    if gw_url.startswith("nats://"):
        assert over_nats >= len(seen) - 1, (over_nats, seen)
    else:
        assert over_nats == 0


@pytest.mark.parametrize("over", ["http", "nats"])
async def test_heartbeats_stay_on_time_while_every_worker_is_held(
    fast_gw: Proc, prefix: str, procs: list[Proc], nc: Client, over: str
) -> None:
    endpoint_id = name("held")
    gw_url = heartbeat_url(fast_gw, prefix, over)
    agent = await asyncio.to_thread(sdk_agent, gw_url, endpoint_id, NATS_URL, 2)
    procs.append(agent)
    subject = agent.url.removeprefix("nats:")
    keys = [key(), key()]
    holds = [asyncio.create_task(deliver(nc, subject, "sdk.hold", {"key": k})) for k in keys]
    await asyncio.to_thread(wait_until, lambda: len(events(agent, "sdk.hold.entered")) == 2, 5)
    queued = asyncio.create_task(deliver(nc, subject, "sdk.echo", {}))  # no worker is free
    seen = await asyncio.to_thread(watch_healthy, fast_gw.url, endpoint_id, WATCH_S)
    assert not queued.done()  # the pool really was full the whole time
    assert_beating(seen)
    await asyncio.to_thread(assert_line_went, agent, fast_gw, gw_url, seen)
    assert (await deliver(nc, subject, "sdk.release", {"keys": keys}))[0] == 200
    assert [(await h)[1]["run"] for h in holds] == [1, 1]
    assert (await queued)[0] == 200


@pytest.mark.parametrize("over", ["http", "nats"])
async def test_heartbeats_stay_on_time_while_a_handler_blocks_the_event_loop(
    fast_gw: Proc, prefix: str, procs: list[Proc], nc: Client, over: str
) -> None:
    endpoint_id = name("blocked")
    gw_url = heartbeat_url(fast_gw, prefix, over)
    agent = await asyncio.to_thread(sdk_agent, gw_url, endpoint_id)
    procs.append(agent)
    subject = agent.url.removeprefix("nats:")
    block_s = WATCH_S + 0.5
    blocker = asyncio.create_task(deliver(nc, subject, "sdk.block-loop", {"seconds": block_s}))
    await asyncio.to_thread(wait_until, lambda: events(agent, "sdk.block_loop.entered"), 5)
    ping = asyncio.create_task(deliver(nc, subject, "sdk.aecho", {}))  # needs the loop
    seen = await asyncio.to_thread(watch_healthy, fast_gw.url, endpoint_id, WATCH_S)
    assert not ping.done()  # the event loop really was blocked the whole time
    assert_beating(seen)
    await asyncio.to_thread(assert_line_went, agent, fast_gw, gw_url, seen)
    status, answer, _ = await blocker
    assert status == 200 and answer["slept_s"] >= block_s
    assert (await ping)[0] == 200
