"""The client and agent SDKs given several gateways: real gateway processes, real agent processes,
real sockets. Each gateway here has its own in-memory registry, so where an agent is registered
shows which gateway its line went through.

Stand-ins for broken gateways (external edges): a closed port (connection refused), a server that
accepts connections and never answers (the request may have reached it), a listening socket whose
accept queue is full (connections hang: a connect timeout), and a gateway process stopped with
SIGSTOP (connects, never answers)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from agent_reach import AllAttemptsFailed, DeadlineExceeded, GatewayUnavailable, NoCapableAgent
from agent_reach.sdk import ReachClient
from agent_reach.sdk.client import Failover
from tests.agents.sdk_support import events
from tests.support import ROOT, Proc, _start, gateway, http, start_agent, status_of, wait_until

INTERVAL = 0.5
GW_FLAGS = ("--heartbeat-interval", str(INTERVAL))


@pytest.fixture(scope="module")
def gw2() -> Iterator[Proc]:
    """The gateway that stays up, with agent://fo-two serving fo.echo."""
    with gateway(*GW_FLAGS) as proc:
        agent = start_agent(proc.url, "agent://fo-two", intents="fo.echo")
        try:
            yield proc
        finally:
            agent.stop()


@pytest.fixture
def gw1() -> Iterator[Proc]:
    """A gateway of its own for each test, which the test may stop."""
    with gateway(*GW_FLAGS) as proc:
        yield proc


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture
def dead_url() -> Iterator[Callable[[], str]]:
    """Makes URLs of ports that refuse connections: bound, never listening, and held until the
    test ends, so that no process started meanwhile can take them."""
    held: list[socket.socket] = []

    def make() -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        held.append(sock)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield make
    for sock in held:
        sock.close()


def failovers(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [
        r.data  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == event
    ]


async def trace_on(gw: Proc, trace_id: str) -> tuple[int, Any]:
    return await asyncio.to_thread(http, "GET", f"{gw.url}/v1/traces/{trace_id}")


def received(trace: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in trace["events"] if e["kind"] == "received")


class Silent:
    """Accepts connections, reads what comes, never answers."""

    def __init__(self) -> None:
        self.seen = b""
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        while chunk := await reader.read(65536):
            self.seen += chunk

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()


@pytest.fixture
async def silent() -> AsyncIterator[tuple[Silent, str]]:
    server = Silent()
    async with server as url:
        yield server, url


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A listening socket whose accept queue is full: new connections hang (the kernel drops
    their SYNs), as with a host that is down behind a firewall."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    probe = socket.socket()
    probe.settimeout(0.3)
    try:
        probe.connect(("127.0.0.1", port))
    except TimeoutError:
        pass
    else:
        pytest.skip("this kernel accepts connections past a full accept queue")
    finally:
        probe.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in [*fillers, listener]:
            s.close()


# --- the client ---------------------------------------------------------------------------------


async def test_a_dead_gateway_is_skipped_and_the_client_sticks_to_the_next(
    gw2: Proc, dead_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = dead_url()
    caplog.set_level(logging.WARNING, logger="agent_reach")
    # no cool-off: what keeps later calls off the dead gateway is stickiness alone
    async with ReachClient(f"{dead}, {gw2.url}/", cooloff_s=0) as client:
        assert client.gateways == (dead, gw2.url) and client.gateway == dead
        reply = await client.send("fo.echo", {"n": 1}, msg_id="msg_fo_skip", timeout_ms=3000)
        assert (reply.endpoint_id, reply.msg_id) == ("agent://fo-two", "msg_fo_skip")
        assert reply.result["msg_id"] == "msg_fo_skip"  # the same message, not a new one
        assert client.gateway == gw2.url
        moves = failovers(caplog, "client.gateway_failover")
        assert [(m["from"], m["to"], m["call"]) for m in moves] == [
            (dead, gw2.url, "POST /v1/send")
        ]
        assert "ClientConnectorError" in moves[0]["error"]
        # one deadline across gateways: the second got what was left of the 3000 ms
        code, trace = await trace_on(gw2, reply.trace_id)
        assert code == 200 and 2000 <= received(trace)["timeout_ms"] < 3000

        for _ in range(3):
            assert "agent://fo-two" in {a.endpoint_id for a in await client.agents()}
            assert (await client.send("fo.echo")).endpoint_id == "agent://fo-two"
        assert len(failovers(caplog, "client.gateway_failover")) == 1  # sticky


async def test_when_the_current_gateway_stops_the_next_calls_go_to_the_next(
    gw1: Proc, gw2: Proc, procs: list[Proc]
) -> None:
    procs.append(start_agent(gw1.url, "agent://fo-one", intents="fo.echo"))
    async with ReachClient([gw1.url, gw2.url]) as client:
        assert (await client.send("fo.echo")).endpoint_id == "agent://fo-one"
        assert client.gateway == gw1.url
        await asyncio.to_thread(gw1.stop)
        assert (await client.send("fo.echo")).endpoint_id == "agent://fo-two"
        assert client.gateway == gw2.url
        listed = {a.endpoint_id for a in await client.agents()}
        assert "agent://fo-two" in listed and "agent://fo-one" not in listed


async def test_an_answer_is_never_failed_over_not_even_a_5xx(
    gw1: Proc, gw2: Proc, procs: list[Proc], caplog: pytest.LogCaptureFixture
) -> None:
    # gw2 could serve fo.echo; gw1 only has an agent that fails it
    procs.append(start_agent(gw1.url, "agent://fo-failing", "fail", intents="fo.echo"))
    caplog.set_level(logging.WARNING, logger="agent_reach")
    async with ReachClient([gw1.url, gw2.url]) as client:
        with pytest.raises(AllAttemptsFailed) as failed:  # 502, the contract's error body
            await client.send("fo.echo", timeout_ms=3000, trace_id="trace_fo_502")
        assert failed.value.http_status == 502
        with pytest.raises(NoCapableAgent):  # 404
            await client.send("fo.nobody", trace_id="trace_fo_404", fallback=False)
        assert client.gateway == gw1.url
    assert failovers(caplog, "client.gateway_failover") == []
    for trace_id in ("trace_fo_502", "trace_fo_404"):
        assert (await trace_on(gw1, trace_id))[0] == 200
        assert (await trace_on(gw2, trace_id))[0] == 404


async def test_a_send_that_may_have_reached_a_silent_gateway_is_not_sent_again(
    gw2: Proc, silent: tuple[Silent, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, hung = silent
    caplog.set_level(logging.WARNING, logger="agent_reach")
    async with ReachClient([hung, gw2.url]) as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as late:
            await client.send(
                "fo.echo", timeout_ms=300, msg_id="msg_fo_silent", trace_id="trace_fo_silent"
            )
        took = time.monotonic() - start
        assert 1.3 <= took < 1.3 + 0.7  # the deadline and the allowance, once
        assert late.value.msg_id == "msg_fo_silent" and hung in late.value.detail
        assert late.value.fields["gateways"] == [hung]  # tried, and the others not
        assert b"msg_fo_silent" in server.seen  # it did reach the silent one
        assert failovers(caplog, "client.gateway_failover") == []
        code, answer = await trace_on(gw2, "trace_fo_silent")  # never sent through gw2
        assert (code, answer["error"]) == (404, "trace_not_found")

        # the silent gateway is tried last for a while: the next call does not wait on it
        start = time.monotonic()
        assert (await client.send("fo.echo", timeout_ms=3000)).endpoint_id == "agent://fo-two"
        assert time.monotonic() - start < 1.0
        assert client.gateway == gw2.url


async def test_a_connect_timeout_moves_on_within_the_same_deadline(
    gw2: Proc, blackhole: str
) -> None:
    async with ReachClient([blackhole, gw2.url], connect_timeout_s=0.3) as client:
        start = time.monotonic()
        reply = await client.send("fo.echo", timeout_ms=2000)
        assert 0.3 <= time.monotonic() - start < 1.5
        assert reply.endpoint_id == "agent://fo-two"
        code, trace = await trace_on(gw2, reply.trace_id)
        assert code == 200 and 1000 <= received(trace)["timeout_ms"] <= 1700

    # a deadline shorter than the connect timeout: nothing is left for the next gateway
    async with ReachClient([blackhole, gw2.url], connect_timeout_s=0.3) as client:
        with pytest.raises(DeadlineExceeded) as late:
            await client.send("fo.echo", timeout_ms=200, trace_id="trace_fo_no_time")
        assert "no gateway could be reached" in late.value.detail
        assert blackhole in late.value.detail
    assert (await trace_on(gw2, "trace_fo_no_time"))[0] == 404


async def test_no_gateway_reachable_is_gateway_unavailable_naming_them_all(
    dead_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = [dead_url(), dead_url()]
    caplog.set_level(logging.WARNING, logger="agent_reach")
    async with ReachClient(",".join(dead)) as client:
        with pytest.raises(GatewayUnavailable) as listing:
            await client.agents()
        assert listing.value.fields["gateways"] == dead
        assert all(url in listing.value.detail for url in dead)
        with pytest.raises(GatewayUnavailable) as sending:
            await client.send("fo.echo", msg_id="msg_fo_nowhere")
        assert sending.value.fields["gateways"] == dead
        assert sending.value.fields["msg_id"] == "msg_fo_nowhere"
    moves = failovers(caplog, "client.gateway_failover")
    assert [(m["from"], m["to"]) for m in moves] == [(dead[0], dead[1])] * 2


async def test_each_move_is_handed_to_on_failover_instead_of_the_log_line(
    gw2: Proc, dead_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = dead_url()
    moves: list[Failover] = []
    caplog.set_level(logging.WARNING, logger="agent_reach")
    async with ReachClient([dead, gw2.url], on_failover=moves.append) as client:
        await client.send("fo.echo", msg_id="msg_fo_hook", trace_id="trace_fo_hook")
        await client.agents()  # sticky: no second move
    assert [(m.source, m.target, m.method, m.path) for m in moves] == [
        (dead, gw2.url, "POST", "/v1/send")
    ]
    assert "ClientConnectorError" in moves[0].error
    assert moves[0].fields == {"msg_id": "msg_fo_hook", "trace_id": "trace_fo_hook"}
    assert failovers(caplog, "client.gateway_failover") == []


# --- the agent SDK ------------------------------------------------------------------------------


def assert_moved(
    agent: Proc, endpoint_id: str, old: Proc, new: Proc, *, since: float, within: float
) -> None:
    """The agent is registered and healthy on ``new`` within two heartbeat intervals, and
    registered there less than ``within`` seconds after ``since`` (the wall time by which
    ``old`` had failed); it keeps heartbeating there, and requests through ``new`` reach it."""
    wait_until(lambda: status_of(new.url, endpoint_id) == "healthy", timeout=2 * INTERVAL)
    # the agent logs its registration once the gateway has answered: a moment after
    registered = wait_until(lambda: events(agent, "agent.registered", gateway=new.url), 2.0)
    assert registered[0]["ts"] - since < within, (registered, since)
    moves = events(agent, "agent.gateway_failover", to=new.url)
    assert moves and moves[0]["from"] == old.url, moves
    end = time.monotonic() + 3 * INTERVAL
    while time.monotonic() < end:
        assert status_of(new.url, endpoint_id) == "healthy"
        time.sleep(0.05)  # the polling period, not a wait for anything to happen
    status, body = http(
        "POST", f"{new.url}/v1/send", {"intent": "fo.move", "payload": {}, "timeout_ms": 3000}
    )
    assert (status, body["endpoint_id"]) == (200, endpoint_id), body


def test_an_agent_moves_to_the_next_gateway_when_its_gateway_stops(
    gw1: Proc, gw2: Proc, procs: list[Proc]
) -> None:
    name = "agent://fo-mover"
    agent = start_agent(f"{gw1.url},{gw2.url}", name, intents="fo.move")
    procs.append(agent)
    assert status_of(gw1.url, name) == "healthy"
    assert status_of(gw2.url, name) == "http 404"  # one gateway at a time
    gw1.stop()
    # a refused connection fails fast: the registration elsewhere keeps the heartbeat's time
    assert_moved(agent, name, gw1, gw2, since=time.time(), within=INTERVAL)
    # and it deregisters through the gateway it is on when it stops
    assert agent.stop() == 0
    assert status_of(gw2.url, name) == "http 404"
    assert events(agent, "agent.deregistered", gateway=gw2.url)


def test_an_agent_moves_on_when_its_gateway_hangs(gw1: Proc, gw2: Proc, procs: list[Proc]) -> None:
    name = "agent://fo-unstuck"
    agent = start_agent(f"{gw1.url},{gw2.url}", name, intents="fo.move")
    procs.append(agent)
    assert status_of(gw1.url, name) == "healthy"
    gw1.popen.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does), never answers
    try:
        # a heartbeat waits 0.25 s for its answer here, then the agent registers elsewhere
        assert_moved(agent, name, gw1, gw2, since=time.time(), within=2 * INTERVAL)
        assert "TimeoutError" in events(agent, "agent.gateway_failover")[0]["error"]
    finally:
        gw1.popen.send_signal(signal.SIGCONT)


def test_an_agent_deregisters_through_the_next_gateway_when_its_own_is_gone(
    procs: list[Proc],
) -> None:
    name = "agent://fo-leaving"
    # the default 10 s interval: no heartbeat notices the first gateway is gone before the stop
    with gateway() as one, gateway() as two:
        agent = start_agent(f"{one.url},{two.url}", name, intents="fo.leave")
        procs.append(agent)
        # as a shared registry would have it: the record is known through the second gateway
        code, _ = http(
            "POST",
            f"{two.url}/v1/register",
            {"endpoint_id": name, "capabilities": ["fo.leave"], "endpoint_url": agent.url},
        )
        assert code == 200
        one.stop()
        assert agent.stop() == 0
        assert status_of(two.url, name) == "http 404"
        moves = events(agent, "agent.gateway_failover", failed="deregister")
        assert [(m["from"], m["to"]) for m in moves] == [(one.url, two.url)]
        assert events(agent, "agent.deregistered", gateway=two.url)


def test_an_agent_whose_first_gateway_is_dead_registers_on_the_next(
    gw2: Proc, dead_url: Callable[[], str], procs: list[Proc]
) -> None:
    dead = dead_url()
    agent = start_agent(f"{dead},{gw2.url}", "agent://fo-second", intents="fo.second")
    procs.append(agent)
    assert status_of(gw2.url, "agent://fo-second") == "healthy"  # at start, not later
    assert events(agent, "agent.gateway_failover", to=gw2.url)[0]["from"] == dead


def test_ctx_reach_fails_over_too(
    gw2: Proc, dead_url: Callable[[], str], procs: list[Proc]
) -> None:
    dead = dead_url()
    relay = _start(
        [
            sys.executable,
            str(ROOT / "tests/agents/relay_agent.py"),
            "--gateway",
            f"{dead},{gw2.url}",
            "--id",
            "agent://fo-relay",
        ]
    )
    procs.append(relay)
    status, body = http(
        "POST",
        f"{gw2.url}/v1/send",
        {
            "intent": "relay.async",
            "payload": {"intent": "fo.echo", "payload": {"n": 2}, "options": {}},
            "timeout_ms": 5000,
        },
    )
    assert status == 200, body
    assert body["result"]["endpoint_id"] == "agent://fo-two"
    assert body["result"]["result"]["payload"] == {"n": 2}
    moves = events(relay, "client.gateway_failover", to=gw2.url)
    assert moves and moves[0]["from"] == dead
