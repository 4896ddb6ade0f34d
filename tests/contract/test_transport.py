"""One contract suite for every transport: the Transport protocol's docstring, against real
stand-in agents on 127.0.0.1 port 0.

Each fixture param is a :class:`Rig`: a started transport, and a stand-in agent that answers
by behaviour (``ok``, ``status/404``, ``slow``, ``big``, ...), reached at ``rig.url(name)``. The
HTTP rig serves them from an aiohttp web server, once through :class:`HttpTransport` and once
through the :class:`TransportMux` the gateway uses. The NATS rig serves them from a nats-py
subscriber on a real NATS server (``AGENT_REACH_TEST_NATS``, default 127.0.0.1:4222), one
subject per behaviour under a prefix of its own, through :class:`NatsTransport` and through a
mux holding both transports. The A2A rigs deliver to ``a2a+http://`` URLs of the same aiohttp
server speaking A2A 1.0 JSON-RPC, through :class:`A2aTransport` over an HttpTransport and through
the mux as the gateway's node builds it.

A rig says how the suite's payloads and answers look on its wire (:meth:`Rig.body`,
:meth:`Rig.sent`, :meth:`Rig.answer`, :meth:`Rig.at_cap_body`, :attr:`Rig.adds`): as they are
for HTTP and NATS, wrapped for A2A (:class:`A2aRig`: a v1 delivery body in, a SendMessage result
out). So every test means the same for every rig. The A2A stand-in answers JSON-RPC where a
test is about a good answer (``ok``, ``at-cap``, ``timing``, ``slow``) and plain HTTP where it
is about an HTTP-level outcome (``status/NNN``, ``big``, ``big-streamed``, ``not-json``: what
A2A passes on unchanged).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec
import nats
import pytest
from aiohttp import web
from nats.aio.msg import Msg

from agent_reach.core.model import Outcome
from agent_reach.errors import ConfigError, InternalError
from agent_reach.transport import HttpTransport, Transport, TransportMux, http_mux, scheme_of
from agent_reach.transport.a2a import A2aTransport
from agent_reach.transport.nats import NatsTransport
from agent_reach.wire.bodies import DeliveryBody

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
    """A started transport and a stand-in agent it delivers to; and how the suite's payloads
    and answers look on that transport's wire: here as they are (HTTP, NATS)."""

    transport: Transport
    url: Callable[[str], str]  # behaviour -> the URL (or subject) of the stand-in serving it
    refused: str  # a URL where nothing answers: the connection is refused
    seen: list[Seen] = field(default_factory=list)
    adds: ClassVar[Mapping[str, str]] = {}  # headers the transport adds to the given ones

    def body(self, payload: bytes) -> bytes:
        """The body to deliver that carries the suite's ``payload``."""
        return payload

    def sent(self, request: bytes) -> bytes:
        """The payload carried by a request body the stand-in saw."""
        return request

    def answer(self, body: bytes) -> Any:
        """The stand-in's answer (a JSON value) in the body of an ok delivery."""
        return json.loads(body)

    def at_cap_body(self) -> bytes:
        """The body of an ok delivery of the ``at-cap`` answer (exactly ``MAX_BYTES`` bytes on
        the wire)."""
        return at_cap()


class A2aRig(Rig):
    """A rig whose transport speaks A2A: the payload goes in a v1 delivery body (which the
    transport makes a SendMessage of), the answer comes back as a SendMessage result."""

    adds = {"A2A-Version": "1.0"}

    def body(self, payload: bytes) -> bytes:
        """A v1 delivery body, as the gateway sends it, with ``payload``."""
        return msgspec.json.encode(
            DeliveryBody(
                msg_id=MSG_ID,
                trace_id=HEADERS["X-Reach-Trace-Id"],
                sender="agent://contract",
                recipient_hint=None,
                intent="contract.echo",
                payload=msgspec.Raw(payload),
                priority="normal",
                timeout_ms=1500,
            )
        )

    def sent(self, request: bytes) -> bytes:
        """The payload in the data part of a SendMessage, byte for byte."""
        return sent_payload(request)

    def answer(self, body: bytes) -> Any:
        """The data of the one part of a SendMessage result's message."""
        (part,) = json.loads(body)["message"]["parts"]
        return part["data"]

    def at_cap_body(self) -> bytes:
        """The result in the SendMessage answer of exactly ``MAX_BYTES`` bytes."""
        return a2a_at_cap(MSG_ID)[1]


@asynccontextmanager
async def http_agent(
    seen: list[Seen], *, a2a: bool = False
) -> AsyncIterator[tuple[Callable[[str], str], str]]:
    """The HTTP stand-in: an aiohttp server, a route per behaviour; and a refused URL (a port
    bound but not listening, held for the test).

    With ``a2a``, the A2A stand-in: the same server at ``a2a+http://`` URLs, whose behaviours
    about a good answer (:data:`RPC_BEHAVIOURS`) read the request as a SendMessage (one that is
    not fails there: a 500) and answer a JSON-RPC result; its others answer as without."""
    release = asyncio.Event()  # ends the slow handler at teardown

    async def rpc(name: str, body: bytes) -> web.Response:
        """A behaviour about a good answer, as an A2A agent gives it."""
        rid = decode_send(body).id
        headers: dict[str, str] = {}
        if name == "ok":
            data = rpc_response(rid, rpc_result(rid, {"got": json.loads(sent_payload(body))}))
        elif name == "slow":
            async with asyncio.timeout(30):
                await release.wait()
            data = rpc_response(rid, rpc_result(rid, {"late": True}))
        elif name == "at-cap":
            data = a2a_at_cap(rid)[0]
        elif name == "timing":
            data = rpc_response(rid, rpc_result(rid, {"timed": True}))
            headers["Server-Timing"] = TIMING
        else:
            raise AssertionError(f"no A2A behaviour {name}")
        return web.Response(body=data, content_type="application/json", headers=headers)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(Seen(dict(request.headers), body))
        name = request.match_info["behaviour"]
        if a2a and name in RPC_BEHAVIOURS:
            return await rpc(name, body)
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
    scheme = "a2a+http" if a2a else "http"
    try:
        yield (
            lambda name: f"{scheme}://127.0.0.1:{port}/{name.replace('/', '-')}",
            f"{scheme}://127.0.0.1:{closed.getsockname()[1]}/reach",
        )
    finally:
        release.set()
        closed.close()
        await runner.cleanup()


def at_cap() -> bytes:
    """A JSON answer of exactly ``MAX_BYTES`` bytes: the largest one a transport takes."""
    frame = b'{"blob": ""}'
    return frame[:-2] + b"x" * (MAX_BYTES - len(frame)) + frame[-2:]


def a2a_agent(seen: list[Seen]) -> AbstractAsyncContextManager[tuple[Callable[[str], str], str]]:
    """The A2A stand-in (:func:`http_agent` with ``a2a``)."""
    return http_agent(seen, a2a=True)


MSG_ID = HEADERS["X-Reach-Msg-Id"]  # an A2A rig's deliveries: the JSON-RPC request's id
RPC_BEHAVIOURS = frozenset({"ok", "at-cap", "timing", "slow"})  # answered in JSON-RPC by A2A


class _Part(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A data part: the only kind a delivery of a payload carries."""

    data: msgspec.Raw
    media_type: Literal["application/json"]


class _Message(msgspec.Struct, rename="camel"):
    message_id: str
    role: Literal["ROLE_USER"]
    parts: list[_Part]
    metadata: dict[str, Any]


class _Params(msgspec.Struct):
    message: _Message


class SendMessage(msgspec.Struct):
    """An A2A 1.0 JSON-RPC SendMessage request, as much of it as the stand-in checks."""

    jsonrpc: Literal["2.0"]
    id: str
    method: Literal["SendMessage"]
    params: _Params


decode_send = msgspec.json.Decoder(SendMessage).decode


def sent_payload(request: bytes) -> bytes:
    """The payload of a SendMessage's one data part, the bytes as they came."""
    (part,) = decode_send(request).params.message.parts
    return bytes(part.data)


def rpc_result(rid: str, data: Any) -> bytes:
    """A SendMessage result: a message of one data part."""
    message = {
        "messageId": f"answer-{rid}",
        "role": "ROLE_AGENT",
        "parts": [{"data": data, "mediaType": "application/json"}],
    }
    return msgspec.json.encode({"message": message})


def rpc_response(rid: str, result: bytes) -> bytes:
    """The JSON-RPC response to request ``rid`` carrying ``result`` as it is."""
    return b'{"jsonrpc":"2.0","id":' + msgspec.json.encode(rid) + b',"result":' + result + b"}"


def a2a_at_cap(rid: str) -> tuple[bytes, bytes]:
    """A SendMessage answer of exactly ``MAX_BYTES`` bytes (the largest the HTTP transport
    under A2A takes), and the result in it (what an ok delivery of it carries)."""
    frame = rpc_response(rid, rpc_result(rid, {"blob": ""}))
    result = rpc_result(rid, {"blob": "x" * (MAX_BYTES - len(frame))})
    response = rpc_response(rid, result)
    assert len(response) == MAX_BYTES, len(response)
    return response, result


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


def a2a_mux() -> Transport:
    """The gateway's mux with the A2A transport added over its HTTP one, as the node builds
    it."""
    mux = http_mux(max_response_bytes=MAX_BYTES)
    http = mux.transport_for("http://x")
    assert isinstance(http, HttpTransport), http
    a2a = A2aTransport(http)
    mux.add("a2a+http", a2a)
    mux.add("a2a+https", a2a)
    return mux


StandIn = Callable[[list[Seen]], AbstractAsyncContextManager[tuple[Callable[[str], str], str]]]

# param -> (its stand-in agent, a factory of the transport under test, its kind of rig)
RIGS: dict[str, tuple[StandIn, Callable[[], Transport], type[Rig]]] = {
    "http": (http_agent, lambda: HttpTransport(max_response_bytes=MAX_BYTES), Rig),
    "mux": (http_agent, lambda: http_mux(max_response_bytes=MAX_BYTES), Rig),
    "nats": (nats_agent, lambda: NatsTransport([NATS_URL], max_response_bytes=MAX_BYTES), Rig),
    "nats-mux": (nats_agent, nats_mux, Rig),
    "a2a": (a2a_agent, lambda: A2aTransport(HttpTransport(max_response_bytes=MAX_BYTES)), A2aRig),
    "a2a-mux": (a2a_agent, a2a_mux, A2aRig),
}


@pytest.fixture(params=sorted(RIGS))
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    agent, make, kind = RIGS[request.param]
    seen: list[Seen] = []
    async with agent(seen) as (url, refused):
        transport = make()
        await transport.start()
        try:
            yield kind(transport, url, refused, seen)
        finally:
            await transport.close()


async def test_a_2xx_json_answer_is_ok_with_its_body(rig: Rig) -> None:
    payload = b'{"city": "Chengdu"}'
    got = await rig.transport.deliver(rig.url("ok"), rig.body(payload), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert got.status == 200
    assert got.body is not None
    assert rig.answer(got.body) == {"got": {"city": "Chengdu"}}
    assert (got.reached, got.eject) == (True, False)
    assert [rig.sent(s.body) for s in rig.seen] == [payload]


async def test_the_reach_headers_arrive(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("ok"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    (seen,) = rig.seen
    want = {**HEADERS, **rig.adds}
    assert {k: seen.headers.get(k) for k in want} == want


@pytest.mark.parametrize("status", [400, 404, 409, 422])
async def test_a_4xx_answer_is_an_agent_error(rig: Rig, status: int) -> None:
    got = await rig.transport.deliver(rig.url(f"status/{status}"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert got.status == status
    assert got.body is not None and json.loads(got.body) == {"error": "scripted"}
    assert (got.reached, got.eject) == (True, False)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_5xx_answer_is_a_server_error(rig: Rig, status: int) -> None:
    got = await rig.transport.deliver(rig.url(f"status/{status}"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.SERVER_ERROR, got
    assert got.status == status
    assert (got.reached, got.eject) == (True, False)


async def test_the_timeout_is_enforced(rig: Rig) -> None:
    started = time.monotonic()
    got = await rig.transport.deliver(rig.url("slow"), rig.body(b"{}"), HEADERS, 0.3)
    took = time.monotonic() - started
    assert got.outcome is Outcome.TIMEOUT, got
    assert 0.29 <= took < 0.3 + 0.5, took
    assert len(rig.seen) == 1  # it was delivered; only the answer was late


async def test_a_refused_connection_reaches_nothing_and_ejects(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.refused, rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert (got.reached, got.eject) == (False, True)
    assert got.detail


@pytest.mark.parametrize("behaviour", ["big", "big-streamed"])
async def test_an_answer_over_the_size_cap_is_an_agent_error(rig: Rig, behaviour: str) -> None:
    got = await rig.transport.deliver(rig.url(behaviour), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert f"larger than {MAX_BYTES} bytes" in got.detail
    assert got.reached


async def test_an_answer_of_exactly_the_size_cap_is_ok(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("at-cap"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert got.body == rig.at_cap_body()  # the whole answer, or (A2A) the result in it


async def test_a_2xx_answer_that_is_not_json_is_an_agent_error(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("not-json"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert got.status == 200
    assert "not JSON" in got.detail
    assert got.reached


async def test_the_agents_server_timing_becomes_agent_ms(rig: Rig) -> None:
    got = await rig.transport.deliver(rig.url("timing"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert (got.agent_ms, got.agent_note) == (12.5, "cached")
    plain = await rig.transport.deliver(rig.url("ok"), rig.body(b"{}"), HEADERS, 2.0)
    assert (plain.agent_ms, plain.agent_note) == (None, "")


async def test_start_and_close_are_idempotent(rig: Rig) -> None:
    await rig.transport.start()  # the fixture started it already
    got = await rig.transport.deliver(rig.url("ok"), rig.body(b"{}"), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    await rig.transport.close()
    await rig.transport.close()  # and the fixture closes it once more
    await rig.transport.start()  # a closed transport starts again
    again = await rig.transport.deliver(rig.url("ok"), rig.body(b"{}"), HEADERS, 2.0)
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


def test_the_gateways_mux_serves_a2a_urls_over_its_http_transport() -> None:
    """As the node builds it: a2a+http(s) URLs go to one A2aTransport, which delivers through
    the mux's own HttpTransport (one pool, one guard and cap), and plain HTTP stays plain."""
    mux = a2a_mux()
    assert isinstance(mux, TransportMux)
    assert mux.schemes == frozenset({"http", "https", "a2a+http", "a2a+https"})
    a2a = mux.transport_for("A2A+HTTP://127.0.0.1:9001/a2a")
    assert isinstance(a2a, A2aTransport)
    assert mux.transport_for("a2a+https://agents.example/a2a") is a2a
    assert a2a.http is mux.transport_for("http://x") is mux.transport_for("https://x")
    assert not mux.supports("a2a+nats:weather.cn")
