"""One aiohttp request served by an ASGI application (the ``mcp`` SDK's streamable HTTP).

Written here rather than taken from ``aiohttp-asgi``: that package brings a forking server and
its CLI (``forklib``) for what is, for one mounted path, about a hundred lines. What it does:

- the scope: HTTP/1.1 method, path, query, headers (as received), client and server
  addresses, and ``extra`` keys (the edge's ``agent_reach.caller``, the SDK's ``user``);
- ``receive``: the body as it arrives (bounded by the caller: the edge checks the length
  first, the SDK counts again), then ``http.disconnect`` once the client has gone, the answer
  is complete or the edge stops (a client gone mid-body is a disconnect, not an error); the
  disconnect is noticed within :data:`DISCONNECT_POLL_S` (aiohttp's low-level server does not
  cancel a handler when its client leaves), so that an abandoned event stream ends and its
  session can expire;
- ``send``: the status and headers, then the body, streamed chunk by chunk (server-sent
  events) through one ``StreamResponse``; a client gone while it is written ends the answer
  quietly (nothing is logged: a client that closes after its last event is the usual case).
- An answer that is an event stream (``text/event-stream``) holds a place of ``streams``
  (:class:`Streams`) for as long as it is open. Such a stream holds its connection as long as
  the client likes (the 2026 protocol's ``subscriptions/listen`` has no session to bound it
  by), and enough of them would fill the gateway's connection table. The place is taken
  *before* the application runs (the edge does, ``held``) for a request that may be answered
  so: the SDK hands a request to the server as it begins its answer, so an answer refused for
  want of a place would come after the work had started, and ``overloaded`` promises that
  nothing was delivered. An answer that turns out not to be a stream gives its place back as
  it begins (a call answered with plain JSON holds it while it runs). A stream begun without
  one (a request the edge did not expect to stream) takes one then, and with none left is not
  begun: 503 ``overloaded``, and the application sees a disconnect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from agent_reach.errors import InternalError
from agent_reach.observability.logs import log

__all__ = ["DISCONNECT_POLL_S", "FULL_DETAIL", "Streams", "may_stream", "serve_asgi"]

DISCONNECT_POLL_S = 1.0
Message = dict[str, Any]
AsgiApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


class Streams:
    """Places for event streams open at once: at most ``bound``; ``refused`` counts the
    streams not begun for want of one (a metric)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.open = 0
        self.refused = 0

    def take(self) -> bool:
        """A place for one more stream (False: none left, counted)."""
        if self.open >= self.bound:
            self.refused += 1
            return False
        self.open += 1
        return True

    def give(self) -> None:
        """A stream has ended."""
        self.open -= 1


FULL_DETAIL = (
    "too many MCP event streams are open at once (twice --mcp-max-sessions): try again later"
)
_FULL = b'{"ok":false,"error":"overloaded","detail":"' + FULL_DETAIL.encode() + b'"}'


def may_stream(request: web.BaseRequest) -> bool:
    """Whether the answer to ``request`` may be an event stream: a GET (a session's stream), or
    a POST whose client takes one (``Accept: text/event-stream``: a request's answer, or the
    2026 protocol's ``subscriptions/listen``)."""
    if request.method == "GET":
        return True
    return request.method == "POST" and "text/event-stream" in request.headers.get("Accept", "")


def _scope(request: web.BaseRequest, extra: Mapping[str, Any]) -> dict[str, Any]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    sock = transport.get_extra_info("sockname") if transport is not None else None
    raw_path, _, _ = request.raw_path.partition("?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": raw_path.encode("latin-1", "replace"),
        "root_path": "",
        "query_string": request.query_string.encode("latin-1", "replace"),
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if peer else None,
        "server": tuple(sock[:2]) if sock else None,
        "state": {},
        **extra,
    }


async def serve_asgi(
    app: AsgiApp,
    request: web.BaseRequest,
    extra: Mapping[str, Any],
    closing: asyncio.Event | None = None,
    streams: Streams | None = None,
    *,
    held: bool = False,
) -> web.StreamResponse:
    """Serve ``request`` with ``app``; the answer it wrote (already sent when returned).

    ``closing`` set (the edge stops) is a disconnect too: an open event stream then ends.
    ``held``: the caller took a place of ``streams`` for this request, given back here (as
    the answer begins when it is not a stream, else when it ends). An error of ``app`` before
    its answer started goes up (the edge's error table renders it); after, the connection is
    closed, since a second answer cannot follow a first."""
    response: web.StreamResponse | None = None
    finished = asyncio.Event()
    body_done = False
    holding = held and streams is not None  # this request holds a place of ``streams``

    def gone() -> bool:
        transport = request.transport
        return (
            finished.is_set()
            or (closing is not None and closing.is_set())
            or transport is None
            or transport.is_closing()
        )

    async def receive() -> Message:
        nonlocal body_done
        if not body_done:
            try:
                chunk, _ = await request.content.readchunk()
            except (ConnectionError, HttpProcessingError):  # the client left mid-body
                body_done = True
                finished.set()
                return {"type": "http.disconnect"}
            more = not request.content.at_eof()
            if not more:
                body_done = True
            return {"type": "http.request", "body": chunk, "more_body": more}
        while not gone():
            try:
                await asyncio.wait_for(finished.wait(), DISCONNECT_POLL_S)
            except TimeoutError:
                continue
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal response, holding
        kind = message["type"]
        if kind == "http.response.start":
            if response is not None:
                raise RuntimeError("the ASGI application started its answer twice")
            headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", ())
            ]
            stream = any(
                name.lower() == "content-type" and value.startswith("text/event-stream")
                for name, value in headers
            )
            if streams is not None and holding and not stream:
                streams.give()  # not a stream after all: its place is free again
                holding = False
            elif streams is not None and stream and not holding:
                if not streams.take():
                    # not begun: the client is told, the application sees its client gone
                    response = web.Response(
                        status=503,
                        body=_FULL,
                        headers={"Content-Type": "application/json", "Retry-After": "1"},
                    )
                    finished.set()
                    return
                holding = True
            response = web.StreamResponse(status=message["status"])
            for name, value in headers:
                response.headers.add(name, value)
            return
        if kind != "http.response.body" or response is None:
            return
        if finished.is_set():
            return  # the client has gone: nothing more reaches it
        try:
            if not response.prepared:
                await response.prepare(request)
            body = message.get("body", b"")
            if body:
                await response.write(body)
            if not message.get("more_body", False):
                await response.write_eof()
                finished.set()
        except ConnectionResetError:
            # gone as the answer ended (a client closes once it has its event): as uvicorn
            # does, the application is not told; receive() says http.disconnect from now on
            finished.set()

    try:
        await app(_scope(request, extra), receive, send)
    except Exception:
        if response is None or not response.prepared:
            raise
        # part of an answer is out: end the connection rather than write a second one
        log(logging.WARNING, "mcp.answer_broken", path=request.path, exc_info=True)
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        finished.set()
        if holding and streams is not None:
            streams.give()
    if response is None:
        raise InternalError("the MCP server gave no answer")
    if not response.prepared:  # a start without a body
        await response.prepare(request)
        await response.write_eof()
    return response
