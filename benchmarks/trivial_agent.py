"""A trivial agent for the benchmarks: answers every HTTP/1.1 request with one small JSON body.

It is a raw asyncio ``Protocol`` (on uvloop when installed) that parses just enough HTTP/1.1 to
find where each request ends (headers, then ``Content-Length`` bytes of body), keeps
connections alive and answers pipelined requests in order with one write. That costs a few
microseconds of CPU per request, so the agent does not steal CPU from the gateway under test.

It registers itself with every ``--register`` gateway URL (Agent-Reach and the seed gateway take
the same ``POST /v1/register`` body), then prints one line::

    trivial agent listening on http://127.0.0.1:PORT/reach

and serves until SIGINT/SIGTERM. It sends no heartbeats: start the gateways with a heartbeat
interval longer than the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import urllib.request
from collections.abc import Awaitable, Callable

BODY = b'{"ok":true,"answer":"pong"}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)
CLOSE_RESPONSE = RESPONSE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
MAX_HEAD = 64 * 1024


class TrivialHttp(asyncio.Protocol):
    """One connection: buffer bytes, answer each complete request."""

    __slots__ = ("buf", "transport")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        close = False
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    out.append(BAD_REQUEST)
                    close = True
                break
            head = bytes(buf[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                try:
                    length = int(head[at + 17 : stop if stop >= 0 else len(head)])
                except ValueError:
                    out.append(BAD_REQUEST)
                    close = True
                    break
            total = end + 4 + length
            if len(buf) < total:
                break
            del buf[:total]
            if b"\r\nconnection: close" in head:
                out.append(CLOSE_RESPONSE)
                close = True
                break
            out.append(RESPONSE)
        if out and self.transport is not None:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            if close:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def register(gateway: str, endpoint_id: str, intents: list[str], url: str) -> None:
    """POST /v1/register to ``gateway``; raise unless it answers 200."""
    body = json.dumps(
        {
            "endpoint_id": endpoint_id,
            "capabilities": intents,
            "endpoint_url": url,
            "description": "benchmark trivial agent",
        }
    ).encode()
    req = urllib.request.Request(
        gateway.rstrip("/") + "/v1/register",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        if resp.status != 200:
            raise RuntimeError(f"register at {gateway} answered {resp.status}")


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        TrivialHttp, args.host, args.port, backlog=1024, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    url = f"http://{args.host}:{port}/reach"
    for gateway in args.register:
        await loop.run_in_executor(None, register, gateway, args.id, args.intent, url)
    print(f"trivial agent listening on {url}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def agent_args(parser: argparse.ArgumentParser, default_id: str, register_help: str) -> None:
    """The flags every trivial agent takes: its id, the intents it declares, where it registers
    (shared with trivial_nats_agent.py)."""
    parser.add_argument("--id", default=default_id)
    parser.add_argument(
        "--intent",
        action="append",
        default=None,
        help="intent to declare (repeatable; default bench.echo)",
    )
    parser.add_argument(
        "--register", action="append", default=[], metavar="GATEWAY_URL", help=register_help
    )


def run(serve: Callable[[argparse.Namespace], Awaitable[None]], args: argparse.Namespace) -> None:
    """``serve(args)`` on uvloop when installed, asyncio's loop otherwise."""
    args.intent = args.intent or ["bench.echo"]
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(args))


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    agent_args(parser, "agent://bench-agent", "gateway to register with (repeatable)")
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
