"""The lean HTTP/1.1 client of the HTTP transport (:mod:`agent_reach.transport.h1`), against raw
asyncio servers on 127.0.0.1 that answer as each test scripts them: what the transport's
contract suite does not reach (answers ended by a close, interim answers, the pool's limits and
idle timeout, a cancelled request, what it refuses to send, the address guard on names)."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from agent_reach.transport.h1 import Client, Failure
from agent_reach.transport.h1conn import Conn

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@asynccontextmanager
async def server(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script`` on each connection; yields its URL and a list that holds
    one entry per connection accepted."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        try:
            await script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/reach", accepted
    finally:
        srv.close()
        await srv.wait_closed()


@asynccontextmanager
async def client(**kwargs: object) -> AsyncIterator[Client]:
    c = Client(**kwargs)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        await c.close()


async def keep_answering(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)


async def test_keep_alive_reuses_one_connection() -> None:
    async with server(keep_answering) as (url, accepted), client() as c:
        for _ in range(5):
            answer = await c.post(url, b'{"a":1}', {"X-Reach-Msg-Id": "m1"}, 100)
            assert (answer.status, answer.body) == (200, b"{}")
        assert len(accepted) == 1


async def test_an_answer_ended_by_the_close_is_whole_and_the_connection_not_kept() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"long": "answer"}')
        await writer.drain()

    async with server(script) as (url, accepted), client() as c:
        first = await c.post(url, b"{}", {}, 100)
        second = await c.post(url, b"{}", {}, 100)
        assert first.body == second.body == b'{"long": "answer"}'
        assert len(accepted) == 2


async def test_an_interim_answer_is_skipped() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
        await writer.drain()
        await keep_answering(reader, writer)

    async with server(script) as (url, _), client() as c:
        assert (await c.post(url, b"{}", {}, 100)).status == 200
        assert (await c.post(url, b"{}", {}, 100)).status == 200


async def test_the_answers_headers_that_matter_are_read() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 201 Created\r\nContent-Encoding: GZIP\r\nServer-Timing: app;dur=1\r\n"
            b"Server-Timing: handle;dur=2\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1\r\n{\r\n1\r\n}\r\n0\r\n\r\n"
        )
        await writer.drain()

    async with server(script) as (url, _), client() as c:
        answer = await c.post(url, b"{}", {}, 100)
        assert answer == (201, b"{}", "gzip", "app;dur=1, handle;dur=2")


async def test_garbage_is_a_protocol_failure() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(script) as (url, _), client() as c:
        with pytest.raises(Failure) as caught:
            await c.post(url, b"{}", {}, 100)
        assert caught.value.kind == "protocol" and caught.value.came_back


async def test_at_most_limit_per_host_connections_the_rest_wait_their_turn() -> None:
    open_now = peak = 0
    gate = asyncio.Event()
    two_in = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        if open_now == 2:
            two_in.set()
        try:
            await read_request(reader)
            await gate.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        finally:
            open_now -= 1

    async with server(script) as (url, accepted), client(limit_per_host=2) as c:
        calls = [asyncio.create_task(c.post(url, b"{}", {}, 100)) for _ in range(6)]
        await asyncio.wait_for(two_in.wait(), 5)  # two made: the other four wait for room
        assert c._open == 2
        assert c.pool_waits == 4  # counted (agent_reach_bound_hits_total{bound="delivery_pool"})
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*calls), 5)
        assert [a.status for a in answers] == [200] * 6
        assert peak == 2 and len(accepted) == 6


async def test_a_cancelled_request_closes_its_connection() -> None:
    got_eof = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if await reader.read() == b"":  # no answer: the client gives up and closes
            got_eof.set()

    async with server(script) as (url, _), client() as c:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await c.post(url, b"{}", {}, 100)
        await asyncio.wait_for(got_eof.wait(), 5)
        assert c._open == 0 and not any(p.idle for p in c._pools.values())


async def test_a_connection_idle_past_keepalive_is_not_reused() -> None:
    now = [100.0]
    async with (
        server(keep_answering) as (url, accepted),
        client(keepalive_s=4.0, monotonic=lambda: now[0]) as c,
    ):
        await c.post(url, b"{}", {}, 100)
        now[0] += 3.9
        await c.post(url, b"{}", {}, 100)
        assert len(accepted) == 1
        now[0] += 4.1
        await c.post(url, b"{}", {}, 100)
        assert len(accepted) == 2


@pytest.mark.parametrize(
    "headers",
    [{"X-Evil": "a\r\nHost: other"}, {"X-Evil\r\nHost": "x"}, {"Bad:Name": "x"}],
)
async def test_a_header_that_would_split_the_request_is_refused_and_nothing_sent(
    headers: dict[str, str],
) -> None:
    async with server(keep_answering) as (url, accepted), client() as c:
        with pytest.raises(ValueError):
            await c.post(url, b"{}", headers, 100)
        assert accepted == [] and c._open == 0


async def test_a_name_that_resolves_only_into_a_denied_network_is_not_connected_to() -> None:
    def deny_loopback(address: str) -> str | None:
        return "denied network (loopback)" if address in ("127.0.0.1", "::1") else None

    async with server(keep_answering) as (url, accepted), client(allow=deny_loopback) as c:
        with pytest.raises(Failure) as caught:
            await c.post(url.replace("127.0.0.1", "localhost"), b"{}", {}, 100)
        assert caught.value.kind == "connect"
        assert "denied network (loopback)" in caught.value.detail
        assert accepted == []
        # the literal address is the transport's guard's to judge (HttpTransport), not this one
        assert (await c.post(url, b"{}", {}, 100)).status == 200


async def test_past_the_deadline_a_timeout_and_the_connection_closed() -> None:
    got_eof = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if await reader.read() == b"":
            got_eof.set()

    async with server(script) as (url, _), client() as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await c.post(url, b"{}", {}, 100, deadline=started + 0.2)
        assert 0.2 <= loop.time() - started < 2.0
        await asyncio.wait_for(got_eof.wait(), 5)
        assert c._open == 0


async def test_the_deadline_bounds_the_wait_for_room_too() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # never answers

    async with server(script) as (url, _), client(limit_per_host=1) as c:
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(c.post(url, b"{}", {}, 100, deadline=loop.time() + 5))
        await asyncio.sleep(0)  # the first takes the only room
        with pytest.raises(TimeoutError):
            await c.post(url, b"{}", {}, 100, deadline=loop.time() + 0.2)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_a_connection_released_to_the_pool_goes_to_a_request_waiting_for_room() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            await asyncio.sleep(0.1)
            writer.write(OK)

    async with server(script) as (url, accepted), client(limit_per_host=1) as c:
        loop = asyncio.get_running_loop()
        started = loop.time()
        both = [c.post(url, b"{}", {}, 100, deadline=started + 2) for _ in range(2)]
        answers = await asyncio.gather(*both)
        assert [a.status for a in answers] == [200, 200]
        assert loop.time() - started < 1.0 and len(accepted) == 1  # the second took the first's


async def test_an_answer_cut_by_a_reset_is_not_taken_whole() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"result": "partial')
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async with server(script) as (url, _), client() as c:
        with pytest.raises(Failure) as caught:
            await c.post(url, b"{}", {}, 100)
        assert caught.value.kind == "reset" and caught.value.came_back


async def test_an_answer_head_over_its_cap_is_a_protocol_failure() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (200 * 1024))
        await writer.drain()
        await reader.read()

    async with server(script) as (url, _), client() as c:
        with pytest.raises(Failure) as caught:
            await c.post(url, b"{}", {}, 100)
        assert caught.value.kind == "protocol"


async def test_a_closed_connection_leaves_no_garbage_cycles() -> None:
    """Its parser held the connection's bound methods, and its transport the connection: each
    closed connection (a new endpoint's, under churn) was garbage only the collector found."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage, to count
    try:
        async with server(script) as (url, accepted), client() as c:
            for _ in range(20):
                assert (await c.post(url, b"{}", {}, 100)).status == 200
            assert len(accepted) == 20
        gc.collect()
        spent = [o for o in gc.garbage if isinstance(o, Conn)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert spent == []


async def test_the_transports_pool_waits_outlive_its_closed_client() -> None:
    # agent_reach_bound_hits_total{bound="delivery_pool"} reads them: a counter must not fall
    from agent_reach.transport.http import HttpTransport

    gate = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await gate.wait()
        writer.write(OK)
        await writer.drain()
        await keep_answering(reader, writer)

    transport = HttpTransport(pool_per_host=1)
    await transport.start()
    async with server(held) as (url, _):
        calls = [asyncio.create_task(transport.deliver(url, b"{}", {}, 5.0)) for _ in range(3)]
        for _ in range(200):  # the two behind the first wait for room
            if transport.pool_waits() >= 2:
                break
            await asyncio.sleep(0)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*calls), 5)
        waits = transport.pool_waits()
        assert waits >= 2
        await transport.close()
    assert transport.pool_waits() == waits


async def test_an_answer_followed_by_the_start_of_another_spoils_the_connection() -> None:
    """A review: the agent's write held its answer and the start of a second one. The parser
    went on into it, the connection went back to the pool mid-answer, and the next request's
    real answer (a 500) came back read as the rest of that phantom one: status 200, its body
    the 500's. Bytes that begin an answer nobody asked for now spoil the connection."""

    async def extra_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK + b"HTTP/1.1 200 OK\r\nX-A: ")
        await read_request(reader)  # a request on this connection again: the fault shows
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 14\r\n\r\n" + b'{"err":"boom"}'
        )
        await reader.read()

    async with server(extra_bytes) as (url, accepted), client() as c:
        for _ in range(3):
            answer = await c.post(url, b'{"a":1}', {"X-Reach-Msg-Id": "m1"}, 100)
            assert (answer.status, answer.body) == (200, b"{}")
        assert len(accepted) == 3  # a new connection each time
