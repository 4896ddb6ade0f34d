"""aiohttp's low-level server, with malformed HTTP answered in the contract's shape, and
bounds on the connections it holds (:class:`ReachServer`).

A request aiohttp's parser cannot read (a bad ``Content-Length``, chunked with a
``Content-Length``, the HTTP/2 preface, a NUL in a header, a header over its limit, a method
that is no method) never reaches :meth:`~agent_reach.edges.http.app.HttpEdge.handle`:
aiohttp answers it itself, by default with a text/plain ``HTTP/1.0 400`` that echoes part of
the input, and logs an ERROR line with a traceback and no trace id, a cheap way to flood the
log. Here (:class:`ReachServer`) such a request gets the contract's error body
(``invalid_request``, JSON, the status aiohttp chose, the connection closed), and one WARNING
line ``http.malformed`` (the peer, the status, the parser's reason, cut short): at most
:data:`LOG_PER_S` a second, the rest counted in the next line's ``suppressed``.

Connections: at most ``--max-connections`` open (default: the open-files limit less
:data:`FD_RESERVE`); past it the oldest idle one is closed for the new one, or with none idle
the one whose request has been arriving longest, begun :data:`SLOW_READER_S` ago at least (a
line ``http.connections_full``, rate-limited as above), so that a crowd of idle or trickling
connections cannot lock the gateway out of its descriptors; ``--idle-timeout`` closes one that
sends nothing for that long, before its first request or between two; and ``--read-timeout``
one whose request has not arrived whole that long after its first byte (on aiohttp's routes:
after its head was read, whichever handler reads the body). A connection with bytes waiting
unread in its socket is not idle, however long ago it last sent: after a stall of the loop
longer than the timeout (a SIGSTOP, a paused VM), the idle check runs before the loop reads
what clients sent meanwhile, and closing then would answer their requests with a reset.

This overrides ``RequestHandler.handle_error``, ``RequestHandler.connection_made``,
``RequestHandler._process_keepalive``, ``RequestHandler._handle_request`` and
``Server.__call__``, and reads ``Server._connections``, ``RequestHandler._current_request``
(and its ``content.is_eof()``), ``RequestHandler._messages`` (the queue the parser's
``_ErrInfo`` goes into), ``_keepalive_handle``, ``_keepalive_timeout`` and
``_next_keepalive_close_time``, which aiohttp (3.10 to 3.14) uses: check them when upgrading
aiohttp (tests/integration/test_malformed_http.py and test_connections.py fail if they stop
being used).

A body that turns out malformed after its head was read (a bad chunk size arriving later)
is answered the same way at once (aiohttp would leave its reader waiting until
``--read-timeout``), and the connection closed.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import termios
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, _ErrInfo

from agent_reach.edges.http.front import FastEdge, FrontProtocol
from agent_reach.observability.logs import Throttle
from agent_reach.wire.bodies import encode

__all__ = ["LOG_PER_S", "ReachServer", "default_max_connections"]

LOG_PER_S = 1.0  # http.malformed lines a second, at most
_REASON_MAX = 120  # characters of the parser's reason kept (it may quote the input)


_THROTTLE = Throttle(1.0 / LOG_PER_S)
FD_RESERVE = 256  # descriptors kept for the agents' pools, Redis, NATS, logs and files
# at --max-connections with none idle: a connection reading one request for this long goes
# for the new one (a client trickling bytes), before the new one is refused
SLOW_READER_S = 1.0


def default_max_connections() -> int:
    """Open connections to hold at most by default: the process's open-files limit less
    :data:`FD_RESERVE` (at least 64), so that idle connections cannot take the descriptors
    that deliveries and the registry need."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1024
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, int(soft) - FD_RESERVE)


def _reason(exc: BaseException | None, message: str | None) -> str:
    text = message or (type(exc).__name__ if exc is not None else "unreadable request")
    text = " ".join(text.split())  # one line, whatever the input held
    printable = "".join(c if c.isprintable() else "?" for c in text)
    return printable[:_REASON_MAX]


def _unread(transport: Any) -> bool:
    """Whether bytes wait unread in the socket under ``transport`` (FIONREAD)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):  # closed meanwhile: nothing to keep it for
        return False
    return count[0] > 0


class _ReachRequestHandler(RequestHandler):
    # when bytes of this connection were last read (monotonic): a request's deadline counts
    # from there, not from when its handler got to run (they differ under load)
    read_at: float | None = None
    _began = 0.0  # the loop time the request in hand was read to the end of its head

    @property
    def reading_since(self) -> float | None:
        """While the body of the request in hand is still arriving: since when (the loop time
        its head was read), for the choice at ``--max-connections``; else None."""
        request = self._current_request
        if request is None or request.content.is_eof():
            return None
        return self._began

    async def _handle_request(
        self,
        request: web.BaseRequest,
        start_time: float | None,
        request_handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
    ) -> tuple[web.StreamResponse, bool]:
        # the body must arrive within --read-timeout of the head, whichever route reads it
        # (/a2a, /mcp and the rest of aiohttp's): a client trickling it holds nothing longer
        manager = self._manager
        deadline = None
        if isinstance(manager, ReachServer):
            loop = self._loop
            self._began = began = loop.time()
            deadline = loop.call_at(
                began + manager.read_timeout, self._read_deadline, request, manager, False
            )
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            if deadline is not None:
                deadline.cancel()

    def _read_deadline(self, request: web.BaseRequest, manager: ReachServer, late: bool) -> None:
        transport = self.transport
        if request.content.is_eof() or transport is None or transport.is_closing():
            return  # arrived whole (or the connection is going anyway)
        if not late and _unread(transport):  # its bytes wait unread: the loop was held; once
            self._loop.call_later(1.0, self._read_deadline, request, manager, True)
            return
        manager.read_timed_out(request.remote or "?", self._loop.time() - self._began)
        transport.close()

    def data_received(self, data: bytes) -> None:
        self.read_at = time.monotonic()
        messages = self._messages
        queued = len(messages)
        super().data_received(data)
        if len(messages) > queued and isinstance(messages[-1][0], _ErrInfo):
            self._spoilt_body(messages[-1][0])

    def _spoilt_body(self, error: _ErrInfo) -> None:
        """Bytes that did not parse (a bad chunk size, say). When they belong to the body of
        the request in hand, aiohttp queues the error as the next request and leaves that body
        unfinished: its reader waited until ``--read-timeout`` cut the connection, with no
        answer. Here it is answered at once, as any malformed request, and the connection
        closed; the handler's read ends in ConnectionResetError (nobody left to answer)."""
        request, transport = self._current_request, self.transport
        if request is None or request.content.is_eof() or transport is None:
            return  # the next request's head: answered in its turn (handle_error)
        self._messages.pop()
        if request.writer.output_size == 0:  # else an answer has begun: only the close
            reason = _malformed(self._manager, request, error.status, error.exc, error.message)
            body = _malformed_body(reason)
            head = (
                f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            transport.write(head.encode() + body)
        transport.close()
        request.content.set_exception(ConnectionResetError("malformed request body"))

    def _process_keepalive(self) -> None:
        if _unread(self.transport):
            # a request sent while the loop was held: the loop reads it next; look again one
            # timeout from now (a response in between moves the close time on as usual)
            self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
            self._keepalive_handle = self._loop.call_at(
                self._next_keepalive_close_time, self._process_keepalive
            )
            return
        super()._process_keepalive()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        manager = self._manager
        if isinstance(manager, ReachServer):
            manager.admit(self)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # a fault of ours (our handler catches its own): aiohttp's way
            return super().handle_error(request, status, exc, message)
        reason = _malformed(self._manager, request, status, exc, message)
        if request.writer.output_size > 0:  # part of an answer went out: nothing more can
            raise ConnectionError("malformed request after an answer had started")
        body = _malformed_body(reason)
        resp = web.Response(status=status, body=body, content_type="application/json")
        resp.force_close()
        return resp


def _malformed(
    manager: Any,
    request: web.BaseRequest,
    status: int,
    exc: BaseException | None,
    message: str | None,
) -> str:
    """Count and log (rate-limited) a malformed request; its reason, cut short."""
    reason = _reason(exc, message)
    if isinstance(manager, ReachServer):
        manager.on_malformed()
    _THROTTLE.log(
        logging.WARNING,
        "http.malformed",
        remote=request.remote or "?",
        status=status,
        reason=reason,
    )
    return reason


def _malformed_body(reason: str) -> bytes:
    return encode(
        {"ok": False, "error": "invalid_request", "detail": f"malformed HTTP request: {reason}"}
    )


def _closing(handler: RequestHandler) -> bool:
    transport = handler.transport
    return transport is None or transport.is_closing()


def _idle(conn: RequestHandler | FrontProtocol) -> bool:
    if isinstance(conn, FrontProtocol):
        return conn.idle()
    return conn._current_request is None


class ReachServer(web.Server):
    """``web.Server`` whose connections answer malformed HTTP as the module says, and that
    holds at most ``max_connections`` open: past it, an idle connection (none of its requests
    in hand) is closed for the new one, the oldest of those that never sent a byte first, else
    the oldest idle one; with none idle, the new one is.

    ``keepalive_timeout`` (aiohttp's, counted from the connection's start too) closes a
    connection that sends nothing for that long, before its first request or between two.

    With ``fast`` (the HTTP edge), each connection is first read by a
    :class:`~agent_reach.edges.http.front.FrontProtocol`, which serves the hot routes itself
    and hands the connection to aiohttp's handler at the first request it does not serve
    (:mod:`.front`); both kinds count toward ``max_connections`` and stop with the server.

    ``on_malformed`` and ``on_evicted`` are called at each malformed request answered and at
    each connection closed for the bound (the gateway counts them in ``/metrics``).

    Request bodies are never decompressed (``Content-Encoding`` is not honoured).
    """

    def __init__(
        self,
        handler: Any,
        *,
        max_connections: int,
        fast: FastEdge | None = None,
        read_timeout: float = 30.0,
        on_malformed: Callable[[], None] = lambda: None,
        on_evicted: Callable[[], None] = lambda: None,
        on_read_timeout: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> None:
        # a request body is read as it came: aiohttp would inflate a Content-Encoding: gzip
        # body past every bound (the limits check Content-Length, the compressed size: 51 KB
        # on the wire were 52 MB read), and answer a body that is not really gzip with a 500.
        # The front ignores Content-Encoding too: such a body is not JSON, 400
        kwargs.setdefault("auto_decompress", False)
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.on_malformed = on_malformed
        self.on_evicted = on_evicted
        self._on_read_timeout = on_read_timeout
        self._read_timeouts = Throttle(1.0 / LOG_PER_S)
        self._evictions = Throttle(1.0 / LOG_PER_S)
        self._fast = fast
        self._fronts: dict[FrontProtocol, None] = {}  # in order of arrival
        if fast is not None and "keepalive_timeout" not in kwargs:
            raise TypeError("ReachServer(fast=...) needs keepalive_timeout (--idle-timeout)")
        self._idle_timeout = float(kwargs.get("keepalive_timeout", 0.0))

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]  # a front, or aiohttp's
        if self._fast is not None:
            return FrontProtocol(
                self, self._fast, self._idle_timeout, _unread, read_timeout=self.read_timeout
            )
        return self.handler()

    def handler(self) -> RequestHandler:
        """A connection's aiohttp handler (a front's connection goes to one at hand-over)."""
        kwargs: dict[str, Any] = self._kwargs
        return _ReachRequestHandler(self, loop=self._loop, **kwargs)

    def _slowest_reader(
        self, open_now: list[RequestHandler | FrontProtocol], new: object
    ) -> RequestHandler | FrontProtocol | None:
        """The connection whose request has been arriving longest, begun at least
        :data:`SLOW_READER_S` ago (a client trickling its bytes), or None."""
        readers = {
            h: began
            for h in open_now
            if h is not new and (began := getattr(h, "reading_since", None)) is not None
        }
        oldest = min(readers, key=readers.__getitem__, default=None)  # the first of equals
        if oldest is None or readers[oldest] > self._loop.time() - SLOW_READER_S:
            return None
        return oldest

    def framing_refused(self, remote: str, size: int) -> None:
        """A connection is closed: the request being read took ``size`` bytes, more than any
        body within ``--max-body-bytes`` needs (chunk extensions, say, which are no body)."""
        self.on_malformed()
        _THROTTLE.log(
            logging.WARNING,
            "http.malformed",
            remote=remote,
            status=400,
            reason=f"a request of over {size} bytes with its framing; the connection is closed",
        )

    def read_timed_out(self, remote: str, began_s_ago: float) -> None:
        """A connection is closed: its request did not arrive whole within ``read_timeout``."""
        self._on_read_timeout()
        self._read_timeouts.log(
            logging.WARNING,
            "http.read_timeout",
            peer=remote,
            read_timeout_s=self.read_timeout,
            began_s_ago=round(began_s_ago, 3),
        )

    def front_made(self, front: FrontProtocol) -> None:
        self._fronts[front] = None
        self.admit(front)

    def front_lost(self, front: FrontProtocol) -> None:
        self._fronts.pop(front, None)

    def pre_shutdown(self) -> None:
        super().pre_shutdown()
        for front in list(self._fronts):
            if front.idle():
                front.force_close()

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        fronts = [front.shutdown(timeout) for front in list(self._fronts)]
        await asyncio.gather(super().shutdown(timeout), *fronts)
        self._fronts.clear()

    def admit(self, new: RequestHandler | FrontProtocol) -> None:
        """Keep the open connections within ``max_connections`` (the class docstring)."""
        # (one closed a moment ago stays listed until its connection is lost: not counted)
        open_now: list[RequestHandler | FrontProtocol] = [
            h for h in self._connections if not _closing(h)
        ]
        open_now += [f for f in self._fronts if not f.gone()]  # lingering ones count
        if len(open_now) <= self.max_connections:
            return
        idle = [h for h in open_now if h is not new and _idle(h)]
        # one that never sent a byte goes first (what a flood of idle sockets is), then the
        # oldest idle one: a client's kept-alive connection between two requests goes last
        victim = next((h for h in idle if getattr(h, "read_at", 0.0) is None), None)
        closed = "the oldest idle connection"
        if victim is None and idle:
            victim = idle[0]
        if victim is None:  # none idle: the one reading a request for longest, past a second
            victim = self._slowest_reader(open_now, new)
            closed = "the connection whose request had been arriving longest"
        if victim is None:
            victim, closed = new, "the new one"
        self.on_evicted()
        self._evictions.log(
            logging.WARNING, "http.connections_full", limit=self.max_connections, closed=closed
        )
        victim.force_close()
