"""A lean HTTP/1.1 client for deliveries: asyncio protocols, httptools' parser, keep-alive pools.

Why not aiohttp's client (which the gateway used before, and still uses for :meth:`fetch
<agent_reach.transport.http.HttpTransport.fetch>`): a delivery is always the same exchange
(one POST with a JSON body, one answer read whole within a size cap), and aiohttp's general
client spends most of a delivery's cost on what this exchange never needs (request and response
objects, multidicts, cookie and redirect handling, two writes per request). This client writes
each request with one ``write`` (its head is a cached prefix plus a few headers) and parses the
answer with llhttp (httptools) in ``data_received``. benchmarks/RESULTS.md has the measurement.

Invariants:
- A connection carries one request at a time; it goes back to its pool only when its answer
  was read whole and both sides keep it alive. Anything else (a timeout, a cancellation, an
  answer over the cap, a parse error) closes it.
- Pools are LIFO (the most recently used connection first: the one least likely to have been
  closed by the agent's idle timeout) and hold no connection longer than ``keepalive_s``.
- At most ``limit`` connections are open, ``limit_per_host`` to one host; a request past either
  waits for one to close or be released (FIFO).
- Names are resolved with the loop's ``getaddrinfo`` and cached for ``dns_ttl_s``; ``allow``
  filters the addresses (the address guard: a name that resolves into a denied network now is
  not connected to).
- :class:`Failure` is the only exception :meth:`Client.post` raises for what the network or the
  agent does; ``came_back`` says whether any byte of the answer had arrived, and ``reused``
  whether the connection came from the pool (the keep-alive race: the caller decides a resend).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple, cast
from urllib.parse import quote, urlsplit

import httptools

__all__ = ["Answer", "Client", "Failure", "TooLarge"]

MAX_HEAD = 64 * 1024  # bytes of an answer's head read at most (the body has its own cap)
_CACHE_MAX = 4096  # parsed URLs and resolved names kept at most (each cache cleared when full)
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


def _expire(future: asyncio.Future[Answer]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class _Target(NamedTuple):
    key: tuple[str, str, int]  # scheme, host, port: one pool each
    prefix: bytes  # "POST path HTTP/1.1\r\nHost: ...\r\n"
    literal: bool  # host is an IP address (never resolved)


def _is_ip(host: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return True
    return False


def _target(url: str) -> _Target:
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
    return _Target((scheme, host, port), head.encode("ascii"), _is_ip(host))


class _Conn(asyncio.Protocol):
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


class _Pool:
    """The idle connections to one host (LIFO) and how many are open."""

    __slots__ = ("idle", "open")

    def __init__(self) -> None:
        self.idle: deque[_Conn] = deque()
        self.open = 0


class Client:
    """POSTs JSON bodies over pooled HTTP/1.1 connections (module docstring)."""

    def __init__(
        self,
        *,
        limit: int = 1024,
        limit_per_host: int = 256,
        keepalive_s: float = 4.0,
        dns_ttl_s: float = 60.0,
        allow: Callable[[str], str | None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.limit_per_host = limit_per_host
        self.keepalive_s = keepalive_s
        self.dns_ttl_s = dns_ttl_s
        self._allow = allow  # address -> refusal (None: allowed)
        self._monotonic = monotonic
        self._pools: dict[tuple[str, str, int], _Pool] = {}
        self._open = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._targets: dict[str, _Target] = {}
        self._names: dict[tuple[str, int], tuple[float, list[tuple[int, str]]]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._busy: set[_Conn] = set()
        self.closed = False

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        limit: int,
        *,
        fresh: bool = False,
        deadline: float | None = None,
    ) -> Answer:
        """POST ``body`` to ``url`` and read the whole answer (at most ``limit`` bytes of body:
        :class:`TooLarge` past it); ``fresh``: on a new connection, not one from the pool.
        Raises :class:`Failure` for the network, ValueError for a URL or header it cannot
        send, TimeoutError past ``deadline`` (the loop's clock). A timeout or a cancellation
        closes the connection.

        The deadline is one timer on the answer's future (and ``asyncio.timeout`` only around
        a connection being made): 1.5 µs a request against 4 for ``asyncio.timeout``."""
        target = self._targets.get(url)
        if target is None:
            target = _target(url)
            if len(self._targets) >= _CACHE_MAX:
                self._targets.clear()
            self._targets[url] = target
        parts = [target.prefix]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise ValueError(f"bad header {name!r}")
            parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        parts.append(body)
        conn = None if fresh else self._idle(target)
        reused = conn is not None
        if conn is None:
            if deadline is None:
                conn, reused = await self._take(target, fresh)
            else:
                async with asyncio.timeout_at(deadline):
                    conn, reused = await self._take(target, fresh)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        conn.begin(future, limit)
        timer = None if deadline is None else loop.call_at(deadline, _expire, future)
        done = False
        try:
            assert conn.transport is not None
            conn.transport.write(b"".join(parts))
            answer = await future
            done = True
        except Failure as exc:
            exc.reused = reused
            raise
        finally:
            if timer is not None:
                timer.cancel()
            conn.future = None
            self._busy.discard(conn)
            pool = self._pools.get(target.key)
            if done and conn.reusable() and not self.closed and pool is not None:
                conn.idle_since = self._monotonic()
                pool.idle.append(conn)
                self._sweep_later()
                if self._waiting:  # a request waiting for room may take it
                    self._wake()
            else:
                conn.close()
                self._gone(conn)
        return answer

    async def close(self) -> None:
        """Close every connection, idle or busy, and wait (at most a second) until their
        transports are gone; idempotent."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        closing = list(self._busy)
        for pool in self._pools.values():
            closing.extend(pool.idle)
            pool.idle.clear()
        loop = asyncio.get_running_loop()
        lost: list[asyncio.Future[None]] = []
        for conn in closing:
            if conn.transport is not None and not conn.transport.is_closing():
                conn.lost = loop.create_future()
                lost.append(conn.lost)
            conn.close()
        for waiter in self._waiting:
            if not waiter.done():
                waiter.set_exception(Failure("connect", "the client is closed"))
        self._waiting.clear()
        if lost:
            await asyncio.wait(lost, timeout=1.0)

    # --- connections ------------------------------------------------------------------------

    def _idle(self, target: _Target) -> _Conn | None:
        """The most recently used idle connection to the target's host that is still fresh."""
        pool = self._pools.get(target.key)
        if pool is None:
            return None
        stale_before = self._monotonic() - self.keepalive_s
        while pool.idle:
            conn = pool.idle.pop()
            if not conn.closed and conn.idle_since > stale_before:
                self._busy.add(conn)
                return conn
            conn.close()
            self._gone(conn)
        return None

    async def _take(self, target: _Target, fresh: bool) -> tuple[_Conn, bool]:
        """A new connection to the target's host once there is room for one, or (unless
        ``fresh``) one released to the pool meanwhile; and whether it came from the pool."""
        key = target.key
        pool = self._pools.setdefault(key, _Pool())
        while self._open >= self.limit or pool.open >= self.limit_per_host:
            holder = pool if pool.open >= self.limit_per_host else self._idlest()
            if holder is not None and holder.idle:  # room held by an idle connection: close it
                oldest = holder.idle.popleft()
                oldest.close()
                self._gone(oldest)
                continue
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
            if not fresh and (conn := self._idle(target)) is not None:
                return conn, True  # released while this request waited
            pool = self._pools.setdefault(key, _Pool())  # (the sweeper may have dropped it)
        if self.closed:
            raise Failure("connect", "the client is closed")
        self._open += 1
        pool.open += 1
        try:
            conn = await self._connect(target)
        except BaseException:
            self._open -= 1
            pool.open -= 1
            self._wake()
            raise
        self._busy.add(conn)
        return conn, False

    async def _connect(self, target: _Target) -> _Conn:
        scheme, host, port = target.key
        loop = asyncio.get_running_loop()
        addresses = [(0, host)] if target.literal else await self._resolve(host, port)
        tls = self._tls() if scheme == "https" else None
        error: OSError | None = None
        for family, address in addresses:
            try:
                _, conn = await loop.create_connection(
                    lambda: _Conn(target.key),
                    address,
                    port,
                    family=family,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
            except OSError as exc:
                error = exc
                continue
            return conn
        raise Failure("connect", f"cannot connect: {error}")

    async def _resolve(self, host: str, port: int) -> list[tuple[int, str]]:
        now = self._monotonic()
        cached = self._names.get((host, port))
        if cached is not None and cached[0] > now:
            return cached[1]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise Failure("connect", f"cannot connect: {host}: {exc}") from None
        found: list[tuple[int, str]] = []
        refusal: str | None = None
        for family, _, _, _, sockaddr in infos:
            address = str(sockaddr[0])
            why = self._allow(address) if self._allow is not None else None
            if why is not None:
                refusal = refusal or why
            elif (family, address) not in found:
                found.append((family, address))
        if not found:
            raise Failure("connect", f"cannot connect: {host}: {refusal or 'no address'}")
        if len(self._names) >= _CACHE_MAX:
            self._names.clear()
        self._names[(host, port)] = (now + self.dns_ttl_s, found)
        return found

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _gone(self, conn: _Conn) -> None:
        """``conn`` is closed: its room goes to the first request waiting for one."""
        if not conn.counted:
            return
        conn.counted = False
        self._open -= 1
        pool = self._pools.get(conn.key)
        if pool is not None:
            pool.open -= 1
        self._wake()

    def _wake(self) -> None:
        """Every request waiting for room looks again (in order of arrival: the first that
        fits takes it; the others wait again)."""
        waiting, self._waiting = self._waiting, deque()
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def _idlest(self) -> _Pool | None:
        """The pool whose oldest idle connection is the oldest of all (None: none idle)."""
        best: _Pool | None = None
        for pool in self._pools.values():
            if pool.idle and (best is None or pool.idle[0].idle_since < best.idle[0].idle_since):
                best = pool
        return best

    def _sweep_later(self) -> None:
        if self._sweeper is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self.keepalive_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for ``keepalive_s`` (their agent may close them any
        moment now, and each holds a file descriptor)."""
        self._sweeper = None
        stale_before = self._monotonic() - self.keepalive_s
        left = False
        for pool in self._pools.values():
            while pool.idle and (pool.idle[0].closed or pool.idle[0].idle_since <= stale_before):
                conn = pool.idle.popleft()
                conn.close()
                self._gone(conn)
            left = left or bool(pool.idle)
        if not self._waiting:  # (a request waiting for room holds on to its pool)
            for key in [k for k, p in self._pools.items() if not p.open and not p.idle]:
                del self._pools[key]
        if left:
            self._sweep_later()
