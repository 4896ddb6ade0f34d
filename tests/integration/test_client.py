"""The client SDK against a real gateway process and real agent processes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager

import msgspec
import pytest
from aiohttp import web

from agent_reach import (
    AgentError,
    AllAttemptsFailed,
    DeadlineExceeded,
    EndpointNotRegistered,
    GatewayUnavailable,
    InvalidRequest,
    NoAvailableAgent,
    NoCapableAgent,
    RecipientIncapable,
    RecipientNotFound,
    TraceNotFound,
)
from agent_reach.errors import Overloaded
from agent_reach.sdk import Agent, ReachClient, ReachContext, SyncReachClient
from tests.support import Proc, gateway, start_agent


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agents = [
            start_agent(proc.url, "agent://cl-ok-01", "ok", intents="cl.echo"),
            start_agent(proc.url, "agent://cl-fail-01", "fail", intents="cl.fail"),
            start_agent(proc.url, "agent://cl-hang-01", "hang", intents="cl.hang"),
            start_agent(proc.url, "agent://cl-reject-01", "reject", intents="cl.reject"),
        ]
        try:
            yield proc
        finally:
            for agent in agents:
                agent.stop()


@pytest.fixture
async def client(gw: Proc) -> AsyncIterator[ReachClient]:
    async with ReachClient(gw.url, sender="agent://cl-caller") as c:
        yield c


async def test_send_returns_the_agents_result_and_how_it_was_reached(client: ReachClient) -> None:
    reply = await client.send("cl.echo", {"n": 1}, trace_id="trace_cl_ok")
    assert reply.result["payload"] == {"n": 1}
    assert reply.result["trace_id"] == "trace_cl_ok" == reply.trace_id
    assert reply.endpoint_id == "agent://cl-ok-01"
    assert reply.intent == "cl.echo"
    assert [(a.endpoint_id, a.outcome) for a in reply.attempts] == [("agent://cl-ok-01", "ok")]
    assert reply.msg_id.startswith("msg_") and reply.result["msg_id"] == reply.msg_id
    assert reply.latency_ms >= reply.attempts[0].latency_ms > 0
    # no payload is {}; an explicit None is JSON null, delivered as such
    assert (await client.send("cl.echo")).result["payload"] == {}
    assert (await client.send("cl.echo", None)).result["payload"] is None


async def test_each_error_code_raises_its_typed_error_with_trace_id(client: ReachClient) -> None:
    with pytest.raises(NoCapableAgent) as no_agent:
        await client.send("cl.nobody", trace_id="trace_cl_none")
    assert no_agent.value.trace_id == "trace_cl_none"
    assert no_agent.value.attempts == [] and no_agent.value.http_status == 404

    with pytest.raises(RecipientNotFound):
        await client.send("cl.echo", recipient_hint="agent://cl-missing")
    with pytest.raises(RecipientIncapable):
        await client.send("cl.fail", recipient_hint="agent://cl-ok-01")

    with pytest.raises(AgentError) as rejected:
        await client.send("cl.reject")
    assert [a["outcome"] for a in rejected.value.attempts] == ["agent_error"]

    with pytest.raises(AllAttemptsFailed) as failed:
        await client.send("cl.fail", timeout_ms=8000)
    assert {a["outcome"] for a in failed.value.attempts} == {"server_error"}
    assert failed.value.msg_id and failed.value.trace_id

    with pytest.raises(InvalidRequest) as bad:
        await client.send("Not A Tag")
    assert bad.value.fields.get("field") == "intent"


async def test_gateway_deadline_is_a_typed_deadline_exceeded(client: ReachClient) -> None:
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded) as late:
        await client.send("cl.hang", timeout_ms=400, trace_id="trace_cl_hang")
    assert time.monotonic() - start < 0.4 + 0.5
    assert late.value.trace_id == "trace_cl_hang"
    assert [a["outcome"] for a in late.value.attempts] == ["timeout"]
    assert late.value.http_status == 504


async def test_listing_lookup_explain_and_trace(client: ReachClient) -> None:
    agents = {a.endpoint_id: a for a in await client.agents()}
    assert agents["agent://cl-ok-01"].capabilities == ["cl.echo"]
    assert agents["agent://cl-ok-01"].status == "healthy"
    one = await client.agent("cl-ok-01")
    assert one.endpoint_id == "agent://cl-ok-01"
    assert (await client.agent("agent://cl-ok-01")).endpoint_url == one.endpoint_url
    with pytest.raises(EndpointNotRegistered):
        await client.agent("cl-nobody")

    route = await client.explain("cl.echo", timeout_ms=3000)
    assert route.chosen == "agent://cl-ok-01"
    assert route.per_try_timeout_ms == 2000 and route.max_retries == 0
    assert [(c.endpoint_id, c.eligible) for c in route.candidates] == [("agent://cl-ok-01", True)]
    with pytest.raises(NoCapableAgent):
        await client.explain("cl.nobody")

    reply = await client.send("cl.echo", trace_id="trace_cl_traced")
    trace = await client.trace(reply.trace_id)
    kinds = [e["kind"] for e in trace.events]
    assert kinds[0] == "received" and "attempt" in kinds
    with pytest.raises(TraceNotFound):
        await client.trace("trace_cl_never_sent")


async def test_register_heartbeat_deregister_for_agents_without_the_sdk(
    client: ReachClient,
) -> None:
    reg = await client.register("agent://cl-manual", ["cl.manual"], "http://127.0.0.1:9/reach")
    assert reg.heartbeat_interval_s == 30.0
    assert await client.heartbeat("agent://cl-manual") == "healthy"
    await client.deregister("agent://cl-manual")
    with pytest.raises(EndpointNotRegistered):
        await client.heartbeat("agent://cl-manual")
    with pytest.raises(InvalidRequest) as refused:
        await client.register("agent://cl-manual", [], "http://127.0.0.1:9/reach")
    assert refused.value.http_status == 422  # the gateway's answer
    # a URL no HTTP client can dial: the wire type the gateway decodes with refuses it here
    with pytest.raises(InvalidRequest) as undialable:
        await client.register("agent://cl-manual", ["cl.manual"], "http://a..b/reach")
    assert undialable.value.fields["field"] == "endpoint_url"
    assert undialable.value.http_status is None  # nothing was sent
    with pytest.raises(EndpointNotRegistered):
        await client.agent("cl-manual")  # the refused registrations changed nothing


async def test_register_heartbeat_and_deregister_take_a_bound_of_their_own() -> None:
    release = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    runner, url = await _serve(never)
    try:
        async with ReachClient(url, timeout_s=30.0) as c:
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: c.register("agent://cl-b", ["cl.b"], "http://127.0.0.1:9/x", timeout_s=0.2),
                lambda: c.heartbeat("agent://cl-b", timeout_s=0.2),
                lambda: c.deregister("agent://cl-b", timeout_s=0.2),
            ]
            for call in calls:
                start = time.monotonic()
                with pytest.raises(GatewayUnavailable, match=r"within 0\.2 s"):
                    await call()
                assert time.monotonic() - start < 2.0  # not the client's 30 s
    finally:
        release.set()
        await runner.cleanup()


async def test_metrics_and_healthz(client: ReachClient) -> None:
    assert await client.healthz() is True
    assert "agent_reach_requests_total" in await client.metrics()


async def test_unreachable_gateway_is_gateway_unavailable() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now: connection refused
    async with ReachClient(f"http://127.0.0.1:{port}") as c:
        with pytest.raises(GatewayUnavailable):
            await c.agents()
        with pytest.raises(GatewayUnavailable):
            await c.send("cl.echo")


async def _serve(handler: web.Handler) -> tuple[web.AppRunner, str]:
    """A stand-in for a broken gateway or a proxy in front of one (an external edge)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_a_silent_gateway_costs_the_deadline_plus_the_allowance_not_more() -> None:
    release = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response()

    runner, url = await _serve(never)
    try:
        async with ReachClient(url) as c:
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded) as late:
                await c.send("cl.echo", timeout_ms=300, trace_id="trace_cl_silent")
            took = time.monotonic() - start
        # one timeout: 300 ms + the 1 s allowance, not a default of many seconds stacked on it
        assert 1.3 <= took < 1.3 + 0.7
        assert late.value.trace_id == "trace_cl_silent" and late.value.attempts == []
    finally:
        release.set()
        await runner.cleanup()


async def test_a_non_contract_answer_is_gateway_unavailable() -> None:
    async def proxy_error(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    runner, url = await _serve(proxy_error)
    try:
        async with ReachClient(url) as c:
            with pytest.raises(GatewayUnavailable) as exc:
                await c.send("cl.echo")
            assert exc.value.fields["http_status"] == 502
    finally:
        await runner.cleanup()


async def test_requests_share_pooled_connections() -> None:
    peers: set[object] = set()

    async def agents(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"agents": []})

    runner, url = await _serve(agents)
    try:
        async with ReachClient(url) as c:
            for _ in range(20):
                assert await c.agents() == []
            await asyncio.gather(*(c.agents() for _ in range(5)))
        # 20 sequential calls on one kept-alive connection, then at most 5 in parallel
        assert 1 <= len(peers) <= 5
    finally:
        await runner.cleanup()


def test_sync_facade_from_several_threads(gw: Proc) -> None:
    results: list[str] = []
    errors: list[BaseException] = []
    with SyncReachClient(gw.url) as c:

        def work(i: int) -> None:
            try:
                results.append(c.send("cl.echo", {"i": i}).result["payload"]["i"])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors
        assert sorted(results) == list(range(8))
        with pytest.raises(NoCapableAgent):
            c.send("cl.nobody")
        assert c.agent("cl-ok-01").status == "healthy"
    with pytest.raises(RuntimeError, match="closed"):
        c.agents()


async def test_no_available_agent_when_the_only_capable_one_is_down(gw: Proc) -> None:
    async with ReachClient(gw.url) as c:
        await c.register("agent://cl-gone", ["cl.gone"], "http://127.0.0.1:9/reach")
        await c.deregister("agent://cl-gone")
        with pytest.raises(NoCapableAgent):
            await c.send("cl.gone")
    # a down endpoint: interval 0.05 s makes it down in 0.15 s, and it is never routed to
    with gateway("--heartbeat-interval", "0.05") as fast:
        async with ReachClient(fast.url) as c:
            await c.register("agent://cl-stale", ["cl.stale"], "http://127.0.0.1:9/reach")
            deadline = time.monotonic() + 5
            while (await c.agent("cl-stale")).status != "down":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            with pytest.raises(NoAvailableAgent) as exc:
                await c.send("cl.stale")
            assert exc.value.http_status == 503


async def test_an_answer_is_read_within_a_bound_and_never_decompressed() -> None:
    # a small gzip body that expands a thousandfold: the client asks for no compression and
    # reads the bytes as sent (not JSON: unusable); a body past max_answer_bytes is not read
    bomb = gzip.compress(b"[" + b"0," * 5_000_000 + b"0]")

    async def compressed(request: web.Request) -> web.Response:
        assert "gzip" not in request.headers.get("Accept-Encoding", "")
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no length to refuse it by
        await resp.prepare(request)
        chunk = b" " * (1 << 20)
        for _ in range(20):
            await resp.write(chunk)
        return resp

    for handler, expected in ((compressed, "not JSON"), (endless, "more than")):
        runner, url = await _serve(handler)
        try:
            async with ReachClient(url, max_answer_bytes=16 << 20) as c:
                with pytest.raises(GatewayUnavailable, match=expected) as exc:
                    await c.get("/v1/anything")
                assert exc.value.http_status == 200
        finally:
            await runner.cleanup()


async def test_a_send_whose_answer_cannot_be_read_keeps_its_ids_to_send_it_again() -> None:
    # a proxy's page after the gateway may have taken the send: the caller must be able to
    # send it again with the same msg_id (the agent's dedup makes that harmless)
    async def proxy_page(request: web.Request) -> web.Response:
        return web.Response(status=504, text="<html>timeout</html>", content_type="text/html")

    async def odd_200(request: web.Request) -> web.Response:
        return web.json_response({"surprise": True})

    for handler in (proxy_page, odd_200):
        runner, url = await _serve(handler)
        try:
            async with ReachClient(url) as c:
                with pytest.raises(GatewayUnavailable) as exc:
                    await c.send("cl.echo", trace_id="trace_cl_page")
            assert str(exc.value.fields["msg_id"]).startswith("msg_")
            assert exc.value.fields["trace_id"] == "trace_cl_page"
        finally:
            await runner.cleanup()


@pytest.mark.parametrize(
    ("header", "given", "expected"),
    [
        ("2", None, 2.0),
        ("0.5", None, 0.5),
        ("\u00b2", None, None),
        ("9" * 400, None, 3600.0),
        ("soon", None, None),
        ("2", 10**400, 3600.0),  # the body's own number, too large for a float
        ("2", 7, 7.0),
        ("2", "soon", 2.0),
    ],
)
async def test_retry_after_is_read_as_seconds_within_an_hour_or_not_at_all(
    header: str, given: object, expected: float | None
) -> None:
    async def overloaded(request: web.Request) -> web.Response:
        body: dict[str, object] = {"ok": False, "error": "overloaded", "detail": "busy"}
        if given is not None:
            body["retry_after_s"] = given
        text = msgspec.json.encode(body).decode()  # json.dumps: no integer of 400 digits
        return web.Response(
            text=text, status=503, content_type="application/json", headers={"Retry-After": header}
        )

    runner, url = await _serve(overloaded)
    try:
        async with ReachClient(url) as c:
            with pytest.raises(Overloaded) as exc:
                await c.send("cl.echo")
        assert exc.value.fields.get("retry_after_s") == expected
    finally:
        await runner.cleanup()


async def test_a_200_that_says_ok_false_is_not_a_success() -> None:
    async def not_ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": False})

    runner, url = await _serve(not_ok)
    try:
        async with ReachClient(url) as c:
            with pytest.raises(GatewayUnavailable, match="ok: False"):
                await c.healthz()
            with pytest.raises(GatewayUnavailable, match="ok: False"):
                await c.deregister("agent://cl-nobody")
    finally:
        await runner.cleanup()


async def test_the_last_gateway_left_gets_the_rest_of_the_time_to_connect() -> None:
    # the first gateway refuses connections; the second's listen queue is full (a gateway
    # under a burst), so the kernel drops the client's SYN and the connect completes only at
    # a retransmission after it starts accepting (1.5 s). Each gateway but the last gets 1 s
    # to connect; the last one left gets what is left of the deadline (it gave up at 1 s)
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{refused.getsockname()[1]}"
    refused.close()  # nothing listens there: connection refused
    slow = socket.socket()
    slow.bind(("127.0.0.1", 0))
    slow.listen(0)
    fillers = []
    for _ in range(3):  # the accept queue full, and SYNs beyond it dropped
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(slow.getsockname())
        fillers.append(filler)

    async def agents(request: web.Request) -> web.Response:
        return web.json_response({"agents": []})

    app = web.Application()
    app.router.add_get("/v1/agents", agents)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()

    async def accept_later() -> None:
        await asyncio.sleep(1.5)
        await web.SockSite(runner, slow).start()

    opening = asyncio.create_task(accept_later())
    try:
        async with ReachClient([dead, f"http://127.0.0.1:{slow.getsockname()[1]}"]) as c:
            started = time.monotonic()
            assert await c.agents() == []
            assert 1.5 <= time.monotonic() - started < 8.0
    finally:
        await opening
        for filler in fillers:
            filler.close()
        await runner.cleanup()


class SilentGateway:
    """A gateway that reads requests and never answers, on a thread of its own; ``arrived``
    is set once a request's bytes came in."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.arrived = threading.Event()
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            self.held.append(conn)
            try:
                if conn.recv(65536):
                    self.arrived.set()
            except OSError:  # shut down by close()
                return

    def close(self) -> None:
        for sock in (self.server, *self.held):  # shutdown wakes the thread blocked on it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextmanager
def silent_gateway() -> Iterator[SilentGateway]:
    gateway = SilentGateway()
    try:
        yield gateway
    finally:
        gateway.close()


def test_closing_the_sync_client_ends_a_call_in_flight() -> None:
    # close() from another thread while a send waits: the call raises at once (it waited on a
    # loop that close() had stopped, for ever), and close() returns
    with silent_gateway() as silent:
        client = SyncReachClient(silent.url)
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                client.send("cl.echo", timeout_ms=20_000)
            except BaseException as exc:  # what the caller sees
                outcome.append(exc)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        assert silent.arrived.wait(5.0)  # the call is in flight
        started = time.monotonic()
        client.close()
        caller.join(timeout=3.0)
        assert not caller.is_alive(), "the call still waits after close()"
        assert time.monotonic() - started < 3.0
        assert isinstance(outcome[0], RuntimeError) and "closed" in str(outcome[0])
        with pytest.raises(RuntimeError, match="closed"):
            client.send("cl.echo")


async def test_an_onward_reach_ends_with_the_request_it_serves() -> None:
    # a handler's ctx.reach to a gateway that stalls: the client allows the network a second
    # past the onward timeout_ms, which would outlive the request; it ends at its deadline
    with silent_gateway() as silent:
        agent = Agent("agent://cl-relay", gateway=silent.url)
        ctx = ReachContext(
            msg_id="m-1",
            trace_id="trace_cl_onward",
            intent="cl.relay",
            sender=None,
            priority="normal",
            attempt=1,
            deadline_ms=500,
            deadline_at=time.monotonic() + 0.5,
            _agent=agent,
        )
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as late:
            await ctx.reach("cl.echo", {})
        took = time.monotonic() - started
        await agent.stop()
    assert 0.4 <= took < 1.2, took  # with the network's allowance it took 1.45 s
    assert late.value.trace_id == "trace_cl_onward"
    assert str(late.value.fields["msg_id"]).startswith("msg_")


async def test_a_call_on_a_pooled_connection_the_gateway_closed_is_sent_again() -> None:
    """A review: the gateway closes an idle keep-alive connection (--idle-timeout); a client
    whose event loop was busy meanwhile took that connection from its pool, and the send
    failed with GatewayUnavailable (``ServerDisconnectedError``), though nothing had reached
    the gateway; aiohttp resends only idempotent methods. It is now sent again on another
    connection, once delivered, with its msg_id; a register and a deregister too."""
    with gateway("--idle-timeout", "1") as gw:
        agent = start_agent(gw.url, "agent://cl-stale-01", "ok", intents="cl.stale")
        try:
            async with ReachClient(gw.url, sender="agent://cl-caller") as c:
                assert (await c.send("cl.stale", {"n": 0})).endpoint_id == "agent://cl-stale-01"
                # the input: a client busy for longer than the gateway's idle timeout (blocking
                # work on its event loop), so that the closed connection is still pooled
                time.sleep(1.6)  # noqa: ASYNC251 (the blocking is the test's input)
                reply = await c.send("cl.stale", {"n": 1})
                assert reply.result["payload"] == {"n": 1}
                time.sleep(1.6)  # noqa: ASYNC251 (the blocking is the test's input)
                await c.register("agent://cl-stale-02", ["cl.stale2"], "http://127.0.0.1:9/x")
                time.sleep(1.6)  # noqa: ASYNC251 (the blocking is the test's input)
                await c.deregister("agent://cl-stale-02")
            delivered = [
                line["msg_id"] for line in agent.log_lines() if line.get("event") == "agent.request"
            ]
            assert delivered.count(reply.msg_id) == 1, delivered
        finally:
            agent.stop()


def test_a_sync_client_dropped_without_close_lets_its_thread_go(gw: Proc) -> None:
    """A review: a SyncReachClient never closed kept its loop's thread (and its pool) for
    ever; one forgotten close() per request of a web handler grew without bound."""

    def threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "agent-reach-client")

    before = threads()

    def use_and_drop() -> None:
        client = SyncReachClient(gw.url)
        assert client.send("cl.echo", {"n": 1}).result["payload"] == {"n": 1}

    for _ in range(3):
        use_and_drop()
    gc.collect()
    deadline = time.monotonic() + 5.0
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.02)  # polling interval
    assert threads() == before
