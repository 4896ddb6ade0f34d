"""The first reader of every connection: the hot routes served on httptools, the rest by aiohttp.

``POST /v1/send`` and ``POST /v1/heartbeat`` are most of what a gateway is asked, and aiohttp's
server spent about a quarter of the gateway's CPU on each beside the system calls (its request
handler loop, request and response objects, the answer's head). :class:`FrontProtocol` reads
a connection with llhttp (httptools), serves those two routes itself (the same
:class:`~agent_reach.edges.http.app.HttpEdge` code, answers byte for byte in the contract's
shape), and hands the connection to aiohttp's handler (:mod:`.server`) at the first request
it does not serve: any other route or method, ``Expect``, an upgrade, or bytes its parser
refuses (aiohttp then answers those as it always has, malformed HTTP included). The bytes
already read go with it, from the start of that request; the connection stays aiohttp's.

Invariants:
- Answers go out in the order the requests came (pipelining): one request is served at a time,
  the ones read meanwhile wait in line, and a hand-over waits until every answer before it is
  written.
- A body over ``max_body_bytes`` is refused (413) as soon as its length says so, and the
  connection closed: the rest of it is read and dropped (for :data:`LINGER_S` at most, so
  that a client still writing it reads the answer), never parsed.
- The connection counts toward ``--max-connections`` like aiohttp's own, and ``--idle-timeout``
  closes it after that long without a byte (before the first request or between two; the empty
  lines a parser skips between requests do not count as bytes), unless
  bytes wait unread in its socket (a stall of the loop: see :mod:`.server`). A request must
  arrive whole within ``--read-timeout`` of its first byte, or the connection is closed (a
  client trickling a byte now and then would otherwise hold it for ever); while it arrives,
  ``reading_since`` says since when, for the server's choice at ``--max-connections``.
- A request's deadline counts from when its last bytes were read (``read_at``), as aiohttp's
  handler has it. A connection lost (or closed by the client: its EOF) while its send is
  served cancels that send.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol, cast

import httptools

from agent_reach.observability.logs import Throttle, log

__all__ = ["FAST_ROUTES", "Answer", "FastEdge", "FrontProtocol", "Headers"]

FAST_ROUTES = frozenset({b"/v1/send", b"/v1/heartbeat"})
LINGER_S = 5.0  # a refused body is read and dropped this long at most, then the connection closed
MAX_QUEUED = 32  # pipelined requests read ahead at most, then reading pauses (aiohttp's too)
_RAW_TRIM = 256 * 1024  # read-ahead bytes kept before they are cut to the request in progress
# headers aiohttp refuses to see twice: such a request is handed to it (it answers 400)
_SINGLE = frozenset(
    {
        *("content-length", "content-location", "content-range", "content-type", "etag"),
        *("host", "max-forwards", "server", "transfer-encoding", "user-agent"),
    }
)
_MAX_HEAD = 8190  # bytes of a request's head served here (aiohttp's line limit); past it: aiohttp
_FAULTS = Throttle(1.0)  # http.front_fault lines: one a second at most
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}

Answer = tuple[int, bytes, dict[str, str]]  # an answer's status, JSON body and extra headers


# a request's headers by lower-case name (the first of a repeated one, as aiohttp's
# ``headers.get``): read them by lower-case name, which aiohttp's headers also take
Headers = dict[str, str]


class FastEdge(Protocol):
    """What the front calls to answer a hot route (``HttpEdge.answer``)."""

    @property
    def max_body_bytes(self) -> int: ...

    def answer(
        self, path: str, headers: Headers, remote: str, read_at: float, body: bytes
    ) -> Answer | Awaitable[Answer]:
        """The answer, or (when it must wait: a send) what to await for it."""
        ...

    def too_large(self, path: str, headers: Headers) -> Answer: ...


class Manager(Protocol):
    """The server side of a front (``ReachServer``): counts it, makes aiohttp's handler."""

    def front_made(self, front: FrontProtocol) -> None: ...

    def front_lost(self, front: FrontProtocol) -> None: ...

    def handler(self) -> asyncio.Protocol: ...

    def read_timed_out(self, remote: str, began_s_ago: float) -> None: ...

    def framing_refused(self, remote: str, size: int) -> None: ...


class _HandOver(Exception):
    """Raised from a parser callback: this request is aiohttp's."""


class _Request:
    __slots__ = ("body", "headers", "keep_alive", "old", "path", "read_at", "size")

    def __init__(self) -> None:
        self.path = ""
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.size = 0
        self.keep_alive = True
        self.old = False  # HTTP/1.0: keep-alive only when asked, and then said in the answer
        self.read_at = 0.0


# the parser of a protocol whose connection is gone: it refers to no protocol (see _detach)
_SPENT = httptools.HttpRequestParser(object())


class FrontProtocol(asyncio.Protocol):
    """One connection, as the module says."""

    def __init__(
        self,
        manager: Manager,
        edge: FastEdge,
        idle_timeout: float,
        unread: Callable[[Any], bool],
        *,
        read_timeout: float = 30.0,
    ) -> None:
        self.manager = manager
        self.edge = edge
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        # the loop time the request being read began (its first byte read), while it is read
        self.reading_since: float | None = None
        self._graced = False  # its read deadline was put off once (a stall of the loop)
        # bytes kept for the request being read at most: its head, twice the body limit (the
        # framing of a chunked body), and requests read ahead of it
        self._raw_cap = 2 * (_MAX_HEAD + edge.max_body_bytes) + _RAW_TRIM
        self._unread = unread
        self.transport: asyncio.Transport | None = None
        self.remote = "?"
        self.read_at: float | None = None  # when bytes were last read (None: never)
        self.busy = False  # a request in hand (being served, or waiting in line)
        self.closing = False
        self._parser = httptools.HttpRequestParser(self)
        self._raw = bytearray()  # bytes read since the last message boundary
        self._begun = 0  # messages begun in _raw
        self._messages = 0  # messages begun on this connection
        self._in_message = False
        self._head = 0  # bytes of the current message's head so far
        self._url = b""
        self._req: _Request | None = None
        self._line: deque[_Request] = deque()  # requests read, waiting to be served
        self._handing: int | None = None  # index in _raw's messages of the one to hand over
        self._refusal: Answer | None = None  # a 413 to send last
        self._eof = False
        self._head_done = False  # the current message's head is read
        self._head_seen = 0  # bytes read while the current message's head was open
        self._paused = False  # reading paused: too many requests in line, or writes backed up
        self._write_paused = False
        self._write_paused_at = 0.0  # since when its answers wait unread (no progress)
        self._write_size = 0  # the answers' bytes waiting then
        self._server_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._loop = asyncio.get_running_loop()

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.remote = str(peer[0])
        loop = self._loop
        self._last = loop.time()
        self._timer = loop.call_at(self._last + self.idle_timeout, self._idle_check)
        self.manager.front_made(self)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self.read_at = now
        last, self._last = self._last, self._loop.time()
        if self._refusal is not None:  # the rest of a refused body: not read
            return
        if self._handing is not None:  # waiting for the answers before a hand-over
            self._raw += data
            return
        between, messages = not self._in_message, self._messages
        self._raw += data
        if self._in_message and not self._head_done:
            self._head_seen += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _HandOver | _TooLarge):
                # a fault of ours reading the request: aiohttp reads it again and answers
                held = _FAULTS.take("http.front_fault")
                if held is not None:
                    log(logging.ERROR, "http.front_fault", exc_info=True, suppressed=held)
            if not isinstance(exc.__context__, _TooLarge):
                self._hand_over_later()
        except httptools.HttpParserUpgrade:
            self._hand_over_later()
        except httptools.HttpParserError:
            self._hand_over_later()  # aiohttp answers what it cannot read, as it always has
        if between and not self._in_message and self._messages == messages:
            # bytes between requests that begin none (the empty lines a parser skips): not a
            # sign of life, or a client dripping CRLFs would hold the connection for ever
            self._last = last
        if self._handing is None:
            if self._in_message and not self._head_done and self._head_seen > _MAX_HEAD:
                self._hand_over_later()  # a head past aiohttp's limit: it refuses it
            elif not self._in_message:
                self._raw = bytearray()  # all read so far is in whole messages: none kept
                self._begun = 0
            elif self._begun > 1 and len(self._raw) > _RAW_TRIM:
                # pipelined requests read ahead of the one in progress: keep from its start
                del self._raw[: _start_of(bytes(self._raw), self._begun - 1)]
                self._begun = 1
            if self._in_message and len(self._raw) > self._raw_cap:
                # more bytes than its head and any body allowed, with room for framing: chunk
                # extensions (no body bytes) would otherwise be kept without end
                self.manager.framing_refused(self.remote, self._raw_cap)
                self._close()
                return
        self._serve_next()

    def eof_received(self) -> bool | None:
        # the client is done sending: answer what is in hand, then close
        self._eof = True
        if self._refusal is not None and self.closing:  # lingering after a refusal: done
            return None
        task = self._server_task
        if task is not None and not task.done():
            # closed while its send is served: the caller is gone (HTTP/1.1 clients do not
            # half-close and wait; nginx answers such a request 499): the connection closes,
            # which cancels the send (connection_lost), and what it pipelined after is dropped
            self._line.clear()
            return None
        return None if not self.busy and self._handing is None else True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._server_task
        if task is not None and not task.done():
            # the caller is gone: nobody reads the answer, so its send stops here (its place
            # in admission and any slot freed now, not at its deadline; an attempt in flight is
            # cancelled, and agents dedup a send again by msg_id). Counted until it has ended,
            # for shutdown
            task.cancel()
            log(logging.DEBUG, "http.client_gone", path="/v1/send", remote=self.remote)
            task.add_done_callback(lambda _: self._gone())
        else:
            self._gone()

    def _gone(self) -> None:
        self.manager.front_lost(self)
        self._detach()

    def _detach(self) -> None:
        """Drop what refers back to this protocol once nothing of its connection runs here:
        the parser (it holds the protocol's bound methods) and the transport (which holds the
        protocol). Otherwise each connection closed or handed over left ~16 objects in
        reference cycles that only the cyclic collector frees: under a churn of short
        connections its gen-0 runs found ~40,000 of them and paused the loop 40-80 ms
        (docs/reliability.md, F11)."""
        self._parser = _SPENT
        self.transport = None
        self._line.clear()
        self._req = None

    # --- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.reading_since = now = self._last  # the loop time of the read it begins in
        self._graced = False
        timer = self._timer
        if timer is not None and timer.when() > now + self.read_timeout:
            timer.cancel()  # the check comes at the read deadline, not later
            self._timer = self._loop.call_at(now + self.read_timeout, self._idle_check)
        self._in_message = True
        self._head_done = False
        self._head_seen = 0
        self._begun += 1
        self._messages += 1
        self._head = 0
        self._url = b""
        self._req = _Request()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head += len(url)
        if self._head > _MAX_HEAD:
            raise _HandOver

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value) + 4
        if self._head > _MAX_HEAD:
            raise _HandOver
        req = self._req
        assert req is not None
        key = name.decode("latin-1").lower()
        if key in ("expect", "upgrade") or (key in _SINGLE and key in req.headers):
            raise _HandOver  # aiohttp's: it refuses a second Host, Content-Type, ...
        if key not in req.headers:
            req.headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._head_done = True
        req = self._req
        assert req is not None
        parser = self._parser
        path = self._url.split(b"?", 1)[0]
        if parser.get_method() != b"POST" or path not in FAST_ROUTES:
            raise _HandOver
        req.path = path.decode("latin-1")
        req.keep_alive = parser.should_keep_alive()
        req.old = parser.get_http_version() == "1.0"
        length = req.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.edge.max_body_bytes:
            self._refuse_too_large()

    def on_body(self, body: bytes) -> None:
        req = self._req
        assert req is not None
        req.size += len(body)
        if req.size > self.edge.max_body_bytes:
            self._refuse_too_large()
        req.body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self.reading_since = None
        req = self._req
        assert req is not None
        self._req = None
        req.read_at = self.read_at or time.monotonic()
        self._line.append(req)
        self.busy = True
        if len(self._line) >= MAX_QUEUED:  # a client pipelining without reading: wait
            self._pause()

    # --- serving ----------------------------------------------------------------------------

    def _serve_next(self) -> None:
        while self._server_task is None and not self.closing and not self._write_paused:
            if self._paused and len(self._line) < MAX_QUEUED // 2 and self._handing is None:
                self._resume()
            if self._line:
                req = self._line.popleft()
                body = req.body[0] if len(req.body) == 1 else b"".join(req.body)
                answer = self.edge.answer(req.path, req.headers, self.remote, req.read_at, body)
                if isinstance(answer, tuple):  # answered at once (a heartbeat): no task
                    if self._answered(req, answer):
                        continue
                else:
                    self._server_task = asyncio.ensure_future(self._serve(req, answer))
            elif self._refusal is not None:
                # a lingering close: the answer, our side shut, the rest of the body read and
                # dropped until the client is done (or LINGER_S), so that a client still
                # writing its body reads the answer rather than a reset
                status, body, extra = self._refusal
                self._write(status, body, extra, close=True)
                self.closing = True
                transport = self.transport
                if transport is not None and transport.can_write_eof():
                    transport.write_eof()
                asyncio.get_running_loop().call_later(LINGER_S, self._close)
            elif self._handing is not None:
                self._hand_over()
            elif self._eof:
                self._close()
            return

    async def _serve(self, req: _Request, answer: Awaitable[Answer]) -> None:
        done = await answer
        self._server_task = None
        if self._answered(req, done):
            self._serve_next()

    def _answered(self, req: _Request, answer: Answer) -> bool:
        """Write ``req``'s answer; whether the connection goes on (keep-alive)."""
        status, body, extra = answer
        if req.old and req.keep_alive:  # an HTTP/1.0 client keeps it open only when told
            extra = {**extra, "Connection": "keep-alive"}
        self._write(status, body, extra, close=not req.keep_alive)
        self._last = self._loop.time()  # idle from the answer on
        if not req.keep_alive:
            self._close()
            return False
        self.busy = bool(self._line) or self._refusal is not None
        return True

    def _write(self, status: int, body: bytes, extra: dict[str, str], *, close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head = b"HTTP/1.1 %d %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n" % (
            status,
            _REASONS.get(status, b"Unknown"),
            _date(),
            len(body),
        )
        for name, value in extra.items():
            head += f"{name}: {value}\r\n".encode("latin-1")
        if close:
            head += b"Connection: close\r\n"
        transport.write(head + b"\r\n" + body)

    def _refuse_too_large(self) -> None:
        """Refuse the request being read (its body is over the limit) once those before it
        are answered, then close (the rest of its body is never parsed)."""
        req = self._req
        assert req is not None
        self._refusal = self.edge.too_large(req.path, req.headers)
        self.busy = True
        raise _TooLarge

    # --- the hand-over to aiohttp -----------------------------------------------------------

    def _hand_over_later(self) -> None:
        """The message being read is aiohttp's: stop reading; hand over once the requests
        before it are answered."""
        self.reading_since = None  # reading is paused: aiohttp's handler reads it on
        if self._handing is None:
            # the message being read, or (bytes no message could begin with) the next one
            self._handing = self._begun - 1 if self._in_message else self._begun
            self._pause()

    def pause_writing(self) -> None:
        # the client does not read its answers: serve no more until it does (and close the
        # connection if it does not for --idle-timeout: _idle_check)
        self._write_paused = True
        self._write_paused_at = self._loop.time()
        self._write_size = self._buffered()
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._serve_next()

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self.transport is not None and not self.transport.is_closing():
            self._paused = False
            self.transport.resume_reading()

    def _hand_over(self) -> None:
        transport = self.transport
        index = self._handing or 0
        if transport is None or transport.is_closing():
            return
        raw = bytes(self._raw)
        if index > 0:  # pipelined behind requests served here: find where it starts
            raw = raw[_start_of(raw, index) :]
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.closing = True
        self.manager.front_lost(self)
        handler = self.manager.handler()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        # reading was paused since the request to hand over was seen, so a client's EOF is
        # still unread: aiohttp reads it (and, as it always does, closes at once)
        transport.resume_reading()  # before: aiohttp may pause it again while reading ``raw``
        if raw:
            handler.data_received(raw)
        self._detach()  # the connection is aiohttp's now

    # --- idleness and closing ---------------------------------------------------------------

    def _idle_check(self) -> None:
        self._timer = None
        if self.closing:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._write_paused:
            size = self._buffered()
            if size < self._write_size:  # it reads, slowly: the wait counts from now
                self._write_paused_at, self._write_size = now, size
            elif now >= self._write_paused_at + self.idle_timeout:
                # its answers unread for --idle-timeout: a client that never reads would hold
                # the connection, and a descriptor, for ever (requests in line keep it busy:
                # never idle, nor picked for the connection cap). Aborted: a close would wait
                # for the unread answers to be sent first
                self._abort()
                return
        due = self._last + self.idle_timeout
        began = self.reading_since if self._handing is None and self._refusal is None else None
        if began is not None and now >= began + self.read_timeout:
            if not self._graced and self._unread(self.transport):
                # its bytes wait unread: the loop was held; a second more, once a request (a
                # client that always has bytes in flight would otherwise never time out)
                self._graced = True
                self._timer = loop.call_at(now + 1.0, self._idle_check)
                return
            self.manager.read_timed_out(self.remote, now - began)
            self._close()
            return
        if began is not None:
            due = min(due, began + self.read_timeout)
        if now < due:
            self._timer = loop.call_at(due, self._idle_check)
        elif self.busy or self._unread(self.transport):
            later = now + self.idle_timeout
            if began is not None:
                later = min(later, began + self.read_timeout)
            self._timer = loop.call_at(later, self._idle_check)
        else:
            self._close()

    def idle(self) -> bool:
        """Whether no request is in hand (it may be closed for a new connection): none read
        whole, and none past its head; or the connection only lingers after a refusal."""
        if self._refusal is not None:
            return self.closing
        reading = self._in_message and self._head_done
        return not self.busy and not reading and self._handing is None

    def gone(self) -> bool:
        """Whether its socket is closed or closing (it no longer counts toward the cap)."""
        return self.transport is None or self.transport.is_closing()

    def _buffered(self) -> int:
        transport = self.transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()
            if self._buffered():
                # a close waits for the answers to be sent: a client that does not read them
                # would hold it, uncounted (it is closing), for ever; cut off after the idle time
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = self._loop.call_later(self.idle_timeout, self._abort)

    def _abort(self) -> None:
        self.closing = True
        self._timer = None
        if self.transport is not None:
            self.transport.abort()

    def force_close(self) -> None:
        """Close now (the connection cap, or the gateway stopping); answers still unsent go
        first, for --idle-timeout at most (:meth:`_close`)."""
        self._close()

    async def shutdown(self, timeout: float | None) -> None:  # noqa: ASYNC109 (aiohttp's)
        """Stop reading; let the request being served finish (``timeout`` at most), serve no
        other; close."""
        self.closing = True
        self._line.clear()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        task = self._server_task
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except TimeoutError:
                task.cancel()
            except asyncio.CancelledError:
                task.cancel()
                raise
        self._close()


_DATE: list[Any] = [0, b""]  # the second, and its Date header line


def _date() -> bytes:
    """The ``Date`` header line (RFC 9110 asks an origin server with a clock for one), made
    once a second."""
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[0], _DATE[1] = now, b"Date: %s\r\n" % formatdate(now, usegmt=True).encode()
    return cast(bytes, _DATE[1])


class _TooLarge(Exception):
    """Raised from a parser callback once a too-large body is refused: stop parsing."""


def _start_of(raw: bytes, index: int) -> int:
    """Where the ``index``-th request of ``raw`` (requests back to back, 0 the first) begins:
    the end of the one before it, the shortest prefix of ``raw`` a parser of its own completes
    ``index`` requests in (bytes no parser takes count as past it: the requests before
    ``index`` were read whole already). Found by halving: each try is one C call over the
    prefix (a body's bytes are skipped, not called back), ~22 of them for the 2.4 MB a
    connection may hold, where feeding a parser one byte at a time took 0.3 s of the loop a
    megabyte (a review's pipelined 1 MB bodies held `/healthz` for seconds)."""
    if index <= 0:
        return 0
    view = memoryview(raw)  # prefixes without copies

    def done_by(end: int) -> int:  # raw[:end]: 1 holds index whole requests, -1 junk, 0 not
        count = 0

        class _Count:
            def on_message_complete(self) -> None:
                nonlocal count
                count += 1

        try:
            httptools.HttpRequestParser(_Count()).feed_data(view[:end])
        except httptools.HttpParserError:
            return -1
        return 1 if count >= index else 0

    low, high = 0, len(raw)  # done_by(high), or no such prefix: high is the answer
    while low < high:
        mid = (low + high) // 2
        if done_by(mid):
            high = mid
        else:
            low = mid + 1
    # junk: raw[:high] is the shortest prefix with it, so its last byte is where it begins
    return high - 1 if high and done_by(high) < 0 else high
