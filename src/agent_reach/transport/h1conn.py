"""One connection of the lean HTTP/1.1 client (:mod:`.h1`): the request's head made once per
URL, the answer parsed with llhttp (httptools) as it arrives, the failures named.

Invariants:
- A connection carries one request at a time (:meth:`Conn.begin`); its answer completes the
  future it was given, or fails it with :class:`Failure` (the network, a bad answer),
  :class:`TooLarge` (the body past its cap) or TimeoutError (:func:`expire`).
- An answer's head is read up to :data:`MAX_HEAD` bytes, its body up to the cap of the request;
  an answer ended by a close counts as whole only when the close is clean (not a reset).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import NamedTuple, cast
from urllib.parse import quote, urlsplit

import httptools

from agent_reach.core.netguard import is_ip

__all__ = ["MAX_HEAD", "Answer", "Conn", "Failure", "Target", "TooLarge", "expire", "target_of"]

MAX_HEAD = 64 * 1024  # bytes of an answer's head read at most (the body has its own cap)
_PATH_SAFE = "/%:@!$&'()*+,;=-._~?"  # kept as they are in a path or query; the rest quoted


class Answer(NamedTuple):
    """An answer read whole."""

    status: int
    body: bytes
    encoding: str  # Content-Encoding, lower case ("identity" when absent)
    timing: str | None  # Server-Timing


class Failure(Exception):
    """The request failed on the network: ``kind`` is ``connect`` (no connection was made),
    ``closed`` (the agent closed the connection), ``reset``, ``io`` (another socket error) or
    ``protocol`` (an answer that is not HTTP/1.1)."""

    def __init__(
        self, kind: str, detail: str, *, came_back: bool = False, reused: bool = False
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.came_back = came_back
        self.reused = reused
        self.errno: int | None = None


class TooLarge(Exception):
    """The answer is over the size cap."""


def expire(future: asyncio.Future[Answer]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class Target(NamedTuple):
    key: tuple[str, str, int]  # scheme, host, port: one pool each
    prefix: bytes  # "POST path HTTP/1.1\r\nHost: ...\r\n"
    literal: bool  # host is an IP address (never resolved)


def target_of(url: str) -> Target:
    """What every request to ``url`` starts with (ValueError for a URL it cannot send to)."""
    parts = urlsplit(url)  # drops tabs and line breaks (CPython's URL sanitising)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    if not host.isascii():
        host = host.encode("idna").decode("ascii")  # UnicodeError (a ValueError) when it can't
    port = parts.port or (443 if scheme == "https" else 80)
    path = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        path += "?" + quote(parts.query, safe=_PATH_SAFE)
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    head = f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\n"
    return Target((scheme, host, port), head.encode("ascii"), is_ip(host))


# the parser of a connection that is gone: it refers to no protocol (Conn.connection_lost)
_SPENT = httptools.HttpResponseParser(object())


class Conn(asyncio.Protocol):
    """One connection: feeds what arrives to the parser, completes the request's future."""

    __slots__ = (
        "_body",
        "_chunked",
        "_encoding",
        "_head",
        "_keep",
        "_length",
        "_limit",
        "_parser",
        "_size",
        "_status",
        "_timing",
        "came_back",
        "closed",
        "counted",
        "future",
        "idle_since",
        "key",
        "lost",
        "transport",
    )

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.future: asyncio.Future[Answer] | None = None
        self.closed = False
        self.counted = True  # counted among the client's open connections
        self.came_back = False
        self.idle_since = 0.0
        self.lost: asyncio.Future[None] | None = None  # set when the transport is gone
        self._limit = 0
        self._reset()

    def _reset(self) -> None:
        self._body: list[bytes] = []
        self._size = 0
        self._status = 0
        self._encoding = "identity"
        self._timing: str | None = None
        self._length: int | None = None
        self._chunked = False
        self._keep = False
        self._head = 0

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.came_back = True
        future = self.future
        if future is None or future.done():  # bytes nobody asked for: the connection is spoilt
            self.close()
            return
        if not self._status:
            self._head += len(data)
        try:
            self._parser.feed_data(data)
        except TooLarge as exc:
            self._fail(exc)
        except httptools.HttpParserError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, TooLarge):
                self._fail(cause)
            else:
                self._fail(Failure("protocol", f"bad HTTP answer: {exc}", came_back=True))
        except httptools.HttpParserUpgrade:
            self._fail(Failure("protocol", "bad HTTP answer: an upgrade", came_back=True))
        else:
            if not self._status and self._head > MAX_HEAD:  # the head still has no end
                too_long = "bad HTTP answer: a head over 64 KiB"
                self._fail(Failure("protocol", too_long, came_back=True))

    def connection_lost(self, exc: Exception | None) -> None:
        # the parser holds this protocol's bound methods, the transport holds the protocol:
        # cycles that only the cyclic collector would free (a new endpoint's connection each,
        # under churn; docs/reliability.md, F11). Nothing below needs either.
        self._parser = _SPENT
        self.transport = None
        self.closed = True
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)
        future = self.future
        if future is None or future.done():
            return
        if exc is None and self._status and self._length is None and not self._chunked:
            self._complete()  # an answer delimited by the close (a clean one: not a reset)
            return
        if isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE):
            failure = Failure("reset", f"connection reset: {exc}", came_back=self.came_back)
            failure.errno = exc.errno
        elif exc is not None:
            failure = Failure("io", f"connection error: {exc}", came_back=self.came_back)
            failure.errno = getattr(exc, "errno", None)
        else:
            failure = Failure("closed", "agent closed the connection", came_back=self.came_back)
        future.set_exception(failure)

    # --- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        future = self.future
        if future is None or future.done():
            # a second answer begins in the bytes that ended the first (nobody asked for it):
            # pooled, the parser would be mid-answer, and the next request's answer read as
            # the rest of this one (its status or its body another's). The connection is spoilt
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname == b"content-length":
            try:
                self._length = int(value)
            except ValueError:
                self._length = -1  # llhttp refuses it
            if self._length > self._limit:
                raise TooLarge
        elif lname == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()
        elif lname == b"content-encoding":
            self._encoding = value.decode("latin-1").strip().lower() or "identity"
        elif lname == b"server-timing":
            timing = value.decode("latin-1")
            self._timing = timing if self._timing is None else f"{self._timing}, {timing}"

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._keep = self._parser.should_keep_alive()  # read here: llhttp resets it later

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._limit:
            raise TooLarge
        self._body.append(body)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer (100 Continue): the real one follows
            self._reset()
            return
        self._complete()

    # --- inside -----------------------------------------------------------------------------

    def _complete(self) -> None:
        future = self.future
        if future is None or future.done():
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        future.set_result(Answer(self._status, body, self._encoding, self._timing))

    def _fail(self, exc: BaseException) -> None:
        future = self.future
        if future is not None and not future.done():
            future.set_exception(exc)
        self.close()

    def begin(self, future: asyncio.Future[Answer], limit: int) -> None:
        self.future = future
        self._limit = limit
        self.came_back = False
        self._reset()

    def reusable(self) -> bool:
        return not self.closed and self._keep

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
