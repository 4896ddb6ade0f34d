"""A lean HTTP/1.1 client for deliveries: asyncio protocols, httptools' parser, keep-alive pools.

Why not aiohttp's client (which the gateway used before, and still uses for :meth:`fetch
<agent_reach.transport.http.HttpTransport.fetch>`): a delivery is always the same exchange
(one POST with a JSON body, one answer read whole within a size cap), and aiohttp's general
client spends most of a delivery's cost on what this exchange never needs (request and response
objects, multidicts, cookie and redirect handling, two writes per request). This client writes
each request with one ``write`` (its head is a cached prefix plus a few headers) and parses the
answer with llhttp (httptools) in ``data_received`` (:mod:`.h1conn`, one connection).
benchmarks/RESULTS.md has the measurement.

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
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping

from agent_reach.transport.h1conn import (
    Answer,
    Conn,
    Failure,
    Target,
    TooLarge,
    expire,
    target_of,
)

__all__ = ["Answer", "Client", "Failure", "TooLarge"]

_CACHE_MAX = 4096  # parsed URLs and resolved names kept at most (each cache cleared when full)


class _Pool:
    """The idle connections to one host (LIFO) and how many are open."""

    __slots__ = ("idle", "open")

    def __init__(self) -> None:
        self.idle: deque[Conn] = deque()
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
        self._targets: dict[str, Target] = {}
        self._names: dict[tuple[str, int], tuple[float, list[tuple[int, str]]]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._busy: set[Conn] = set()
        self.closed = False
        self.pool_waits = 0  # requests that waited for room for a connection (a metric)
        self.caches_cleared = 0  # the URL or name cache cleared at its bound (a metric)

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
            target = target_of(url)
            if len(self._targets) >= _CACHE_MAX:
                self._targets.clear()
                self.caches_cleared += 1
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
        timer = None if deadline is None else loop.call_at(deadline, expire, future)
        done = False
        try:
            transport = conn.transport
            if transport is None:  # lost before its first request (between loop turns)
                raise Failure("closed", "agent closed the connection", came_back=False)
            transport.write(b"".join(parts))
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

    def _idle(self, target: Target) -> Conn | None:
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

    async def _take(self, target: Target, fresh: bool) -> tuple[Conn, bool]:
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
            self.pool_waits += 1
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

    async def _connect(self, target: Target) -> Conn:
        scheme, host, port = target.key
        loop = asyncio.get_running_loop()
        addresses = [(0, host)] if target.literal else await self._resolve(host, port)
        tls = self._tls() if scheme == "https" else None
        error: OSError | None = None
        for family, address in addresses:
            try:
                _, conn = await loop.create_connection(
                    lambda: Conn(target.key),
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
            self.caches_cleared += 1
        self._names[(host, port)] = (now + self.dns_ttl_s, found)
        return found

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _gone(self, conn: Conn) -> None:
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
