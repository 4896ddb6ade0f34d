"""The NATS transport's traps, against real NATS servers.

The contract suite (tests/contract/test_transport.py) holds the outcomes every transport shares;
here is what is NATS's own: the bounded first connect (nats-py's, set to reconnect forever,
would not return), the attempt's timeout as the request's (never nats-py's 0.5 s default), "no
responders" as a refused connection, a server restarted under a connected transport, and a
connection nats-py closes for good (an authorization violation after a configuration reload),
replaced without restarting the transport.

The shared server is ``AGENT_REACH_TEST_NATS`` (default 127.0.0.1:4222); the restart tests run
private servers (``AGENT_REACH_TEST_NATS_SERVER``, default /usr/sbin/nats-server) on free ports.
Every wait is on a condition, with a bound.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import nats
import pytest
from nats.aio.msg import Msg

from agent_reach.core.model import Outcome
from agent_reach.errors import BackendUnavailable, ConfigError, InternalError
from agent_reach.transport import TransportMux
from agent_reach.transport.nats import NatsTransport, subject_refusal
from tests.nats_support import NATS_URL, Reply, private_server, responder, unique
from tests.support import free_port, until

T = TypeVar("T")
HEADERS = {"X-Reach-Trace-Id": "trace_nats", "X-Reach-Msg-Id": "msg_nats", "X-Reach-Attempt": "1"}


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    started = time.monotonic()
    result = await call
    return result, time.monotonic() - started


async def echo(msg: Msg) -> Reply:
    """A stand-in agent's answer: ``{"echo": body}`` after the body's ``delay_s``."""
    body = json.loads(msg.data)
    delay = float(body.get("delay_s", 0))
    if delay:
        await asyncio.sleep(delay)  # the agent's own slowness under test, not a settle
    return json.dumps({"echo": body}).encode(), None


# --- the first connect -------------------------------------------------------------------------


async def test_the_first_connect_to_a_dead_port_fails_fast_and_clearly() -> None:
    port = free_port()
    transport = NatsTransport([f"nats://gw:secret@127.0.0.1:{port}"], connect_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as raised:
        await transport.start()
    took = time.monotonic() - started
    assert 0.45 <= took < 1.0, took  # nats-py alone: tries forever (or 60 tries, 2 s apart)
    assert raised.value.code == "backend_unavailable"
    detail = raised.value.detail
    assert f"NATS at nats://gw:***@127.0.0.1:{port}: no connection within 0.5 s" in detail
    assert "Connect call failed" in detail, detail  # the last error nats-py saw, told
    assert "secret" not in str(raised.value)
    assert not isinstance(raised.value, nats.errors.Error | OSError | TimeoutError)
    assert transport.state().connected is False
    with pytest.raises(InternalError):  # never started
        await transport.deliver(f"nats:{unique('x')}", b"{}", HEADERS, 1.0)
    await transport.close()


async def test_the_first_connect_to_a_server_that_never_speaks_is_bounded() -> None:
    """A port that takes connections (the kernel's backlog) and never sends INFO: nats-py's
    per-server timeout is whole seconds, and it would try again forever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        transport = NatsTransport([f"nats://127.0.0.1:{port}"], connect_timeout_s=0.6)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match=r"no connection within 0\.6 s"):
            await transport.start()
        took = time.monotonic() - started
    assert 0.55 <= took < 1.2, took


@pytest.mark.parametrize(
    "servers",
    [
        [],
        ["http://127.0.0.1:4222"],
        ["nats://127.0.0.1:99999"],
        ["nats://127.0.0.1:4222/path"],
        ["nats://"],
    ],
)
def test_an_unusable_server_list_is_a_config_error(servers: list[str]) -> None:
    with pytest.raises(ConfigError):
        NatsTransport(servers)


def test_a_bad_setting_is_a_config_error() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="connect_timeout_s"):
            NatsTransport([NATS_URL], connect_timeout_s=bad)


# --- deliveries on the shared server ------------------------------------------------------------


@pytest.fixture
async def linked() -> AsyncIterator[NatsTransport]:
    transport = NatsTransport([NATS_URL], reserved=["agent-reach"])
    await transport.start()
    try:
        yield transport
    finally:
        await transport.close()


async def test_the_request_timeout_is_the_attempts_not_nats_pys_default(
    linked: NatsTransport,
) -> None:
    subject = unique("echo")
    async with responder(NATS_URL, subject, echo):
        url = f"nats:{subject}"
        got, took = await timed(linked.deliver(url, b'{"delay_s": 1.5}', HEADERS, 2.0))
        assert got.outcome is Outcome.OK, got
        assert got.body is not None and json.loads(got.body) == {"echo": {"delay_s": 1.5}}
        assert 1.5 <= took < 2.0, took
        got, took = await timed(linked.deliver(url, b'{"delay_s": 0.7}', HEADERS, 0.5))
        assert got.outcome is Outcome.TIMEOUT, got
        assert got.reached
        assert 0.49 <= took < 0.8, took  # the reply would come at 0.7 s: not waited for


async def test_no_responders_is_a_connect_error_that_ejects_at_once(
    linked: NatsTransport,
) -> None:
    got, took = await timed(linked.deliver(f"nats:{unique('nobody')}", b"{}", HEADERS, 2.0))
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert (got.reached, got.eject) == (False, True)
    assert "no responders" in got.detail
    assert took < 0.5, took  # the server says so: no waiting out the attempt


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("nats:", "no subject"),
        ("nats://127.0.0.1:4222", "not nats://HOST"),
        ("nats:weather.*", "wildcard"),
        ("nats:weather.>", "wildcard"),
        ("nats:weather..cn", "empty token"),
        ("nats:weather cn", "printable ASCII"),
        ("nats:wea\u00efther", "printable ASCII"),
        ("nats:$JS.API.STREAM.DELETE.orders", "under $"),
        ("nats:$SYS.REQ.SERVER.PING", "under $"),
        ("nats:_INBOX.abc.def", "_INBOX"),
        ("nats:agent-reach.v1.send", "reserved"),
        ("nats:agent-reach", "reserved"),
        ("nats:" + "a" * 257, "longer than 256"),
        ("http://127.0.0.1/reach", "not a nats: URL"),
    ],
)
async def test_a_subject_no_agent_may_own_is_not_delivered_to(
    linked: NatsTransport, url: str, why: str
) -> None:
    refusal = linked.refusal(url)
    assert refusal is not None and why in refusal, refusal
    got = await linked.deliver(url, b"{}", HEADERS, 1.0)
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert (got.reached, got.eject) == (False, True)
    assert why in got.detail


def test_the_subjects_an_agent_may_own() -> None:
    for url in ("nats:weather.cn", "NATS:weather", "nats:agent-reach-x.v1", "nats:a-b_c.D9~!"):
        assert subject_refusal(url, ["agent-reach"]) is None, url


async def test_the_mux_delivers_nats_urls_through_it() -> None:
    transport = NatsTransport([NATS_URL])
    mux = TransportMux({"nats": transport})
    subject = unique("echo")
    await mux.start()
    try:
        assert transport.state().connected
        async with responder(NATS_URL, subject, echo):
            got = await mux.deliver(f"nats:{subject}", b"{}", HEADERS, 2.0)
        assert got.outcome is Outcome.OK, got
    finally:
        await mux.close()
    assert transport.state().connected is False


async def test_the_state_tells_the_link() -> None:
    transport = NatsTransport([NATS_URL.replace("nats://", "nats://nobody:pw@", 1)])
    before = transport.state()
    assert (before.connected, before.server, before.reconnects) == (False, None, 0)
    # the shared server has no authorization: the user is ignored, and hidden in the state
    await transport.start()
    try:
        now = transport.state()
        assert now.connected and now.reconnects == 0
        assert now.server == NATS_URL.replace("nats://", "nats://nobody:***@", 1)
    finally:
        await transport.close()
    assert transport.state().connected is False


# --- a server restarted under the transport -----------------------------------------------------


async def test_a_restarted_server_fails_deliveries_cleanly_then_serves_them_again() -> None:
    with private_server() as server:
        transport = NatsTransport([server.url], connect_timeout_s=1.0, reconnect_wait_s=0.1)
        await transport.start()
        subject = unique("echo")
        url = f"nats:{subject}"
        try:
            back = asyncio.Event()
            async with responder(server.url, subject, echo, back) as received:
                assert (await transport.deliver(url, b"{}", HEADERS, 2.0)).outcome is Outcome.OK

                # in flight when the server dies: the answer never comes
                flight = asyncio.create_task(
                    timed(transport.deliver(url, b'{"delay_s": 3}', HEADERS, 1.5))
                )
                await until(
                    lambda: any(m.data == b'{"delay_s": 3}' for m in received),
                    5,
                    "the agent got it",
                )
                await asyncio.to_thread(server.stop)
                got, took = await flight
                assert got.outcome in (Outcome.TIMEOUT, Outcome.CONNECT_ERROR), got
                assert took < 1.5 + 0.2, took

                # during the outage: refused at once, nothing raised, nobody ejected
                await until(lambda: not transport.state().connected, 5, "the link seen down")
                outage = transport.state()
                assert (outage.connected, outage.server) == (False, None)
                assert outage.last_error
                for _ in range(3):
                    got, took = await timed(transport.deliver(url, b"{}", HEADERS, 1.0))
                    assert got.outcome is Outcome.CONNECT_ERROR, got
                    assert (got.reached, got.eject, got.blameless) == (False, False, True)
                    assert "no NATS connection" in got.detail
                    assert took < 0.1, took

                await asyncio.to_thread(server.start)
                await until(lambda: transport.state().connected, 10, "the transport back")
                await asyncio.wait_for(back.wait(), 10)  # and the agent's subscription
                got = await transport.deliver(url, b'{"after": "restart"}', HEADERS, 2.0)
                assert got.outcome is Outcome.OK, got
                assert got.body is not None and json.loads(got.body) == {
                    "echo": {"after": "restart"}
                }
                assert transport.state().reconnects == 1
                assert transport.state().server == server.url
        finally:
            await transport.close()


AUTH = """authorization {{
  users = [
    {{user: "gateway", password: "{password}"}}
    {{user: "agent", password: "agent"}}
  ]
}}"""


async def test_a_connection_nats_py_closes_for_good_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A configuration reload that revokes the gateway's password: the server kicks it with an
    authorization violation, on which nats-py closes the connection and never reconnects. The
    transport makes a new one, trying until the password works again."""
    caplog.set_level(logging.INFO, logger="agent_reach")
    with private_server(AUTH.format(password="one")) as server:
        gateway_url = server.url.replace("nats://", "nats://gateway:one@", 1)
        agent_url = server.url.replace("nats://", "nats://agent:agent@", 1)
        transport = NatsTransport([gateway_url], connect_timeout_s=0.5, reconnect_wait_s=0.1)
        await transport.start()
        subject = unique("echo")
        url = f"nats:{subject}"
        try:
            async with responder(agent_url, subject, echo):
                assert (await transport.deliver(url, b"{}", HEADERS, 2.0)).outcome is Outcome.OK

                server.configure(AUTH.format(password="two"))
                server.reload()
                await until(lambda: not transport.state().connected, 5, "the gateway kicked")
                got = await transport.deliver(url, b"{}", HEADERS, 1.0)
                assert got.outcome is Outcome.CONNECT_ERROR, got
                assert (got.reached, got.eject) == (False, False)
                await until(
                    lambda: "nats.closed" in [r.getMessage() for r in caplog.records],
                    5,
                    "nats-py gave the connection up",
                )
                await until(
                    lambda: "authoriz" in transport.state().last_error.lower(),
                    5,
                    "the refusal told in the state",
                )

                server.configure(AUTH.format(password="one"))
                server.reload()
                await until(lambda: server.reloaded(2), 5, "the second reload")
                await until(lambda: transport.state().connected, 10, "a new connection")
                got = await transport.deliver(url, b"{}", HEADERS, 2.0)
                assert got.outcome is Outcome.OK, got
                assert transport.state().reconnects >= 1
        finally:
            await transport.close()
        assert transport.state().connected is False
