"""One contract suite for every transport: the Transport protocol's docstring, against real
stand-in agents on 127.0.0.1 port 0.

Each fixture param is a :class:`Rig`: a started transport, and a stand-in agent that answers
by behaviour (``ok``, ``status/404``, ``slow``, ``big``, ...), reached at ``rig.url(name)``. The
HTTP rig serves them from an aiohttp web server, once through :class:`HttpTransport` and once
through the :class:`TransportMux` the gateway uses. The NATS rig serves them from a nats-py
subscriber on a real NATS server (``AGENT_REACH_TEST_NATS``, default 127.0.0.1:4222), one
subject per behaviour under a prefix of its own, through :class:`NatsTransport` and through a
mux holding both transports.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import nats
import pytest
from aiohttp import web
from nats.aio.msg import Msg

from agent_reach.core.model import Outcome
from agent_reach.errors import ConfigError, InternalError
from agent_reach.transport import HttpTransport, Transport, TransportMux, http_mux, scheme_of
from agent_reach.transport.nats import NatsTransport

MAX_BYTES = 4096  # every rig's transport caps answers at this
NATS_URL = os.environ.get("AGENT_REACH_TEST_NATS", "nats://127.0.0.1:4222")
TIMING = 'app;dur=1, handle;dur=12.5;desc="cached"'
HEADERS = {
    "X-Reach-Trace-Id": "trace_contract",
    "X-Reach-Msg-Id": "msg_contract",
    "X-Reach-Attempt": "2",
    "X-Reach-Deadline-Ms": "1500",
}


@dataclass
class Seen:
    """One request as the stand-in agent received it."""

    headers: dict[str, str]
    body: bytes


@dataclass
class Rig:
    """A started transport and a stand-in agent it delivers to."""

    transport: Transport
    url: Callable[[str], str]  # behaviour -> the URL (or subject) of the stand-in serving it
    refused: str  # a URL where nothing answers: the connection is refused
    seen: list[Seen] = field(default_factory=list)


@asynccontextmanager
async def http_agent(seen: list[Seen]) -> AsyncIterator[tuple[Callable[[str], str], str]]:
    """The HTTP stand-in: an aiohttp server, a route per behaviour; and a refused URL (a port
    bound but not listening, held for the test)."""
    release = asyncio.Event()  # ends the slow handler at teardown

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(Seen(dict(request.headers), body))
        name = request.match_info["behaviour"]
        if name == "ok":
            return web.json_response({"got": json.loads(body or b"null")})
        if name.startswith("status-"):
            status = int(name.removeprefix("status-"))
            return web.json_response({"error": "scripted"}, status=status)
        if name == "slow":
            async with asyncio.timeout(30):
                await release.wait()
            return web.json_response({"late": True})
        if name == "big":
            return web.json_response({"blob": "x" * MAX_BYTES})
        if name == "at-cap":
            return web.Response(body=at_cap(), content_type="application/json")
        if name == "big-streamed":  # chunked: no Content-Length to refuse it by
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(b'{"blob": "')
            for _ in range(MAX_BYTES // 512 + 1):
                await resp.write(b"x" * 512)
            await resp.write(b'"}')
            await resp.write_eof()
            return resp
        if name == "not-json":
            return web.Response(text="hello, not JSON", status=200)
        if name == "timing":
            return web.json_response({"timed": True}, headers={"Server-Timing": TIMING})
        raise AssertionError(f"no behaviour {name}")

    app = web.Application()
    app.router.add_post("/{behaviour}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    try:
        yield (
            lambda name: f"http://127.0.0.1:{port}/{name.replace('/', '-')}",
            f"http://127.0.0.1:{closed.getsockname()[1]}/reach",
        )
    finally:
        release.set()
        closed.close()
        await runner.cleanup()


def at_cap() -> bytes:
    """A JSON answer of exactly ``MAX_BYTES`` bytes: the largest one a transport takes."""
    frame = b'{"blob": ""}'
    return frame[:-2] + b"x" * (MAX_BYTES - len(frame)) + frame[-2:]


@asynccontextmanager
async def nats_agent(seen: list[Seen]) -> AsyncIterator[tuple[Callable[[str], str], str]]:
    """The NATS stand-in: a nats-py subscriber answering on ``PREFIX.BEHAVIOUR`` with the status
    in ``Reach-Status``; and a subject nobody listens on (no responders: the refused URL).

    An answer is one NATS message, so there is no streamed answer to cut short: ``big-streamed``
    is the answer one byte over the cap."""
    release = asyncio.Event()  # ends the slow handler at teardown
    prefix = f"reach-contract.{secrets.token_hex(6)}"
    nc = await nats.connect(NATS_URL, connect_timeout=2, allow_reconnect=False)
    running: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        name = msg.subject.rsplit(".", 1)[1]
        if name != "ready":
            seen.append(Seen(dict(msg.headers or {}), msg.data))
        headers: dict[str, str] = {}
        if name == "ready":
            data = b"{}"
        elif name == "ok":
            data = json.dumps({"got": json.loads(msg.data or b"null")}).encode()
        elif name.startswith("status-"):
            data, headers = b'{"error": "scripted"}', {"Reach-Status": name.removeprefix("status-")}
        elif name == "slow":
            async with asyncio.timeout(30):
                await release.wait()
            data = b'{"late": true}'
        elif name == "big":
            data = json.dumps({"blob": "x" * MAX_BYTES}).encode()
        elif name == "big-streamed":
            data = at_cap()[:-2] + b'x"}'
        elif name == "at-cap":
            data = at_cap()
        elif name == "not-json":
            data = b"hello, not JSON"
        elif name == "timing":
            data, headers = b'{"timed": true}', {"Server-Timing": TIMING}
        else:
            raise AssertionError(f"no behaviour {name}")
        await nc.publish(msg.reply, data, headers=headers or None)

    async def handle(msg: Msg) -> None:  # a task each: a slow answer holds up no other
        task = asyncio.create_task(answer(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    await nc.subscribe(f"{prefix}.*", cb=handle)
    # served once a request comes back (nats-py's flush() may overtake the SUB it buffers)
    await nc.request(f"{prefix}.ready", b"{}", timeout=5)
    try:
        yield (
            lambda name: f"nats:{prefix}.{name.replace('/', '-')}",
            f"nats:{prefix}-nobody.reach",
        )
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(*running), 5)
        await nc.close()


def nats_mux() -> Transport:
    """The gateway's mux with the NATS transport added, as the node builds it."""
    mux = http_mux(max_response_bytes=MAX_BYTES)
    mux.add("nats", NatsTransport([NATS_URL], max_response_bytes=MAX_BYTES))
    return mux


StandIn = Callable[[list[Seen]], AbstractAsyncContextManager[tuple[Callable[[str], str], str]]]

# param -> (its stand-in agent, a factory of the transport under test)
RIGS: dict[str, tuple[StandIn, Callable[[], Transport]]] = {
    "http": (http_agent, lambda: HttpTransport(max_response_bytes=MAX_BYTES)),
    "mux": (http_agent, lambda: http_mux(max_response_bytes=MAX_BYTES)),
    "nats": (nats_agent, lambda: NatsTransport([NATS_URL], max_response_bytes=MAX_BYTES)),
    "nats-mux": (nats_agent, nats_mux),
}


@pytest.fixture(params=sorted(RIGS))
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    agent, make = RIGS[request.param]
    seen: list[Seen] = []
    async with agent(seen) as (url, refused):
        transport = make()
        await transport.start()
        try:
            yield Rig(transport, url, refused, seen)
        finally:
            await transport.close()


async def test_a_2xx_json_answer_is_ok_with_its_body(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("ok"), b'{"city": "Chengdu"}', HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert got.status == 200
    assert got.body is not None
    assert json.loads(got.body) == {"got": {"city": "Chengdu"}}
    assert (got.reached, got.eject) == (True, False)
    assert [s.body for s in rig.seen] == [b'{"city": "Chengdu"}']


async def test_the_reach_headers_arrive(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("ok"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    (seen,) = rig.seen
    assert {k: seen.headers.get(k) for k in HEADERS} == HEADERS


@pytest.mark.parametrize("status", [400, 404, 409, 422])
async def test_a_4xx_answer_is_an_agent_error(rig: Rig, status: int) -> None:
    got = await rig.transport.deliver(rig.url(f"status/{status}"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert got.status == status
    assert got.body is not None and json.loads(got.body) == {"error": "scripted"}
    assert (got.reached, got.eject) == (True, False)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_5xx_answer_is_a_server_error(rig: Rig, status: int) -> None:
    got = await rig.transport.deliver(rig.url(f"status/{status}"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.SERVER_ERROR, got
    assert got.status == status
    assert (got.reached, got.eject) == (True, False)


async def test_the_timeout_is_enforced(rig: Rig) -> None:
    started = time.monotonic()
    got = await rig.transport.deliver(rig.url("slow"), b"{}", HEADERS, 0.3)
    took = time.monotonic() - started
    assert got.outcome is Outcome.TIMEOUT, got
    assert 0.29 <= took < 0.3 + 0.5, took
    assert len(rig.seen) == 1  # it was delivered; only the answer was late


async def test_a_refused_connection_reaches_nothing_and_ejects(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.refused, b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert (got.reached, got.eject) == (False, True)
    assert got.detail


@pytest.mark.parametrize("behaviour", ["big", "big-streamed"])
async def test_an_answer_over_the_size_cap_is_an_agent_error(rig: Rig, behaviour: str) -> None:
    got = await rig.transport.deliver(rig.url(behaviour), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert f"larger than {MAX_BYTES} bytes" in got.detail
    assert got.reached


async def test_an_answer_of_exactly_the_size_cap_is_ok(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("at-cap"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert got.body is not None and len(got.body) == MAX_BYTES


async def test_a_2xx_answer_that_is_not_json_is_an_agent_error(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("not-json"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert got.status == 200
    assert "not JSON" in got.detail
    assert got.reached


async def test_the_agents_server_timing_becomes_agent_ms(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("timing"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert (got.agent_ms, got.agent_note) == (12.5, "cached")
    plain = await rig.transport.deliver(rig.url("ok"), b"{}", HEADERS, 2.0)
    assert (plain.agent_ms, plain.agent_note) == (None, "")


async def test_start_and_close_are_idempotent(rig: Rig) -> None:
    await rig.transport.start()  # the fixture started it already
    got = await rig.transport.deliver(rig.url("ok"), b"{}", HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    await rig.transport.close()
    await rig.transport.close()  # and the fixture closes it once more
    await rig.transport.start()  # a closed transport starts again
    again = await rig.transport.deliver(rig.url("ok"), b"{}", HEADERS, 2.0)
    assert again.outcome is Outcome.OK, again


# -- the mux itself ------------------------------------------------------------------------


async def test_the_mux_answers_a_url_no_transport_serves_without_raising() -> None:
    mux = http_mux()
    await mux.start()
    try:
        for url, scheme in [
            ("nats:weather.cn", "nats"),
            ("ftp://127.0.0.1/reach", "ftp"),
            ("127.0.0.1:9001/reach", "(none)"),
            ("", "(none)"),
        ]:
            got = await mux.deliver(url, b"{}", HEADERS, 1.0)
            assert got.outcome is Outcome.CONNECT_ERROR, (url, got)
            assert (got.reached, got.eject) == (False, True), url
            assert f"no transport for URL scheme {scheme}" in got.detail, got.detail
            assert "served: http, https" in got.detail
    finally:
        await mux.close()


def test_the_mux_says_which_urls_it_serves() -> None:
    mux = http_mux()
    assert mux.schemes == frozenset({"http", "https"})
    assert mux.supports("http://127.0.0.1:9001/reach")
    assert mux.supports("HTTPS://agents.example/reach")
    assert not mux.supports("nats:weather.cn")
    assert not mux.supports("weather.cn")
    assert mux.transport_for("http://a/b") is mux.transport_for("https://a/b") is not None
    assert mux.transport_for("nats:x") is None
    assert [scheme_of(u) for u in ("Http://a", "nats:a.b", "a/b:c", "1x:y", "")] == [
        "http",
        "nats",
        "",
        "",
        "",
    ]


async def test_the_mux_starts_and_closes_each_transport_it_holds() -> None:
    """A second transport, added like the nats: one will be, is started and closed with it."""
    seen: list[Seen] = []
    async with http_agent(seen) as (url, _):
        first, second = HttpTransport(), HttpTransport()
        mux = TransportMux({"http": first})
        mux.add("extra", second)
        assert mux.schemes == frozenset({"http", "extra"})
        await mux.start()
        try:
            assert (await mux.deliver(url("ok"), b"{}", HEADERS, 2.0)).outcome is Outcome.OK
            # started by the mux: the second delivers too (an http URL, straight to it)
            assert (await second.deliver(url("ok"), b"{}", HEADERS, 2.0)).outcome is Outcome.OK
        finally:
            await mux.close()
        await mux.close()
        with pytest.raises(InternalError):
            await second.deliver(url("ok"), b"{}", HEADERS, 2.0)
        assert len(seen) == 2


async def test_the_mux_refuses_a_bad_or_late_registration() -> None:
    mux = http_mux()
    with pytest.raises(ConfigError, match="already"):
        mux.add("HTTP", HttpTransport())
    with pytest.raises(ConfigError, match="not a URL scheme"):
        mux.add("nats:", HttpTransport())
    await mux.start()
    try:
        with pytest.raises(ConfigError, match="before start"):
            mux.add("nats", HttpTransport())
    finally:
        await mux.close()
