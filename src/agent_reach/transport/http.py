"""HTTP transport: deliveries through the lean HTTP/1.1 client of :mod:`.h1` (pooled keep-alive
connections, TCP_NODELAY, one write per request); documents (A2A cards) through one aiohttp
session, with the same address guard and size cap.

Invariants:
- Every answer, good or bad, is a :class:`Delivery`; no client exception leaves
  :meth:`HttpTransport.deliver`, and the whole attempt (a resend included) fits in its timeout.
- A request that fails on a connection taken from the pool, before any of the answer came back,
  is sent once more on a fresh connection, inside the same attempt: the agent closed that idle
  connection just as the request went out on it (the keep-alive race), which says nothing about
  the agent's health. The same failure on a fresh connection is a reset (``eject``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from agent_reach.core.model import Outcome
from agent_reach.core.netguard import AddressGuard, is_ip
from agent_reach.errors import InternalError
from agent_reach.observability.logs import log
from agent_reach.transport.base import Delivery, agent_answer
from agent_reach.transport.h1 import Client, Failure, TooLarge

__all__ = ["Fetched", "GuardedResolver", "HttpTransport"]

_JSON = {"Content-Type": "application/json"}


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, keeping only the addresses the guard allows: an endpoint URL whose
    name resolves into a denied network now (DNS rebinding) is not connected to. Literal
    addresses never reach a resolver; registration checks those."""

    def __init__(self, guard: AddressGuard) -> None:
        self._guard = guard
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        refusals = [self._guard.refusal_for_address(item["host"]) for item in found]
        kept = [item for item, refusal in zip(found, refusals, strict=True) if refusal is None]
        if not kept:
            reason = next((r for r in refusals if r is not None), "no address")
            raise OSError(f"{host}: {reason}")
        return kept

    async def close(self) -> None:
        await self._inner.close()


class Fetched(NamedTuple):
    """The answer to :meth:`HttpTransport.fetch`: ``status`` None (and ``error`` why) when
    none came."""

    status: int | None
    body: bytes
    headers: dict[str, str]
    error: str


class HttpTransport:
    """Delivers over HTTP/1.1 with a pool per agent host.

    ``keepalive_s`` is kept below the 5 s idle timeout common in agent servers (uvicorn), so the
    gateway rarely writes on a connection the agent is closing; servers with shorter idle
    timeouts (gunicorn: 2 s) still race it, and such a request is sent again on a fresh
    connection (module docstring). Idempotence is the contract's: an agent treats a second
    delivery of a ``msg_id`` as the same request (``X-Reach-Msg-Id``).
    """

    def __init__(
        self,
        *,
        max_response_bytes: int = 1 << 20,
        pool_size: int = 1024,
        pool_per_host: int = 256,
        keepalive_s: float = 4.0,
        address_guard: AddressGuard | None = None,
    ) -> None:
        self.max_response_bytes = max_response_bytes
        self._pool_size = pool_size
        self._pool_per_host = pool_per_host
        self._keepalive_s = keepalive_s
        self._guard = address_guard
        self._literal: dict[str, str | None] = {}  # url -> refusal of its literal address
        self.literals_cleared = 0  # times _literal was cleared at its bound (a metric)
        self._closed_counts = (0, 0)  # pool waits and cache clears of clients closed before
        self._client: Client | None = None  # deliveries
        self._session: aiohttp.ClientSession | None = None  # fetches (cards)

    async def start(self) -> None:
        """Open the pools; idempotent."""
        if self._client is None:
            guard = self._guard
            self._client = Client(
                limit=self._pool_size,
                limit_per_host=self._pool_per_host,
                keepalive_s=self._keepalive_s,
                dns_ttl_s=60,
                allow=None if guard is None else guard.refusal_for_address,
            )
        if self._session is None:
            self._session = self._open(
                aiohttp.TCPConnector(
                    limit=self._pool_size,
                    limit_per_host=self._pool_per_host,
                    keepalive_timeout=self._keepalive_s,
                    ttl_dns_cache=60,
                    resolver=self._resolver(),
                )
            )

    def pool_waits(self) -> int:
        """Deliveries that waited for room for a connection (the pool's bounds), since start."""
        client = self._client
        return self._closed_counts[0] + (0 if client is None else client.pool_waits)

    def caches_cleared(self) -> int:
        """Times a cache of this transport (parsed URLs, resolved names, refusals of literal
        addresses) was cleared at its bound of 4,096, since start."""
        client = self._client
        cleared = self._closed_counts[1] + (0 if client is None else client.caches_cleared)
        return cleared + self.literals_cleared

    def _resolver(self) -> AbstractResolver | None:
        return None if self._guard is None else GuardedResolver(self._guard)

    @staticmethod
    def _open(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            # no compression: the answer-size limit counts the bytes that are really held
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            cookie_jar=aiohttp.DummyCookieJar(),  # agents' cookies are not the gateway's
        )

    def _literal_refusal(self, url: str) -> str | None:
        """The guard's refusal of a URL whose host is an address (names are checked by the
        resolver; a record may come from a gateway with other settings, through Redis)."""
        if url in self._literal:
            return self._literal[url]
        assert self._guard is not None
        try:  # parsed as the client that dials it parses it (transport/h1.py)
            host = urlsplit(url).hostname or ""
        except (ValueError, TypeError):
            host = ""
        refusal = self._guard.refusal_for_address(host) if is_ip(host) else None
        if len(self._literal) >= 4096:
            self._literal.clear()
            self.literals_cleared += 1
        self._literal[url] = refusal
        return refusal

    async def close(self) -> None:
        """Close the pools; idempotent."""
        client, session = self._client, self._session
        self._client = self._session = None
        if client is not None:  # its counts stay counted (they are counters' values)
            waits, cleared = self._closed_counts
            self._closed_counts = (waits + client.pool_waits, cleared + client.caches_cleared)
            await client.close()
        if session is not None:
            await session.close()

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """POST ``body`` to ``url``: :meth:`agent_reach.transport.base.Transport.deliver`."""
        client = self._client
        if client is None:
            raise InternalError("HttpTransport.deliver() before start()")
        if self._guard is not None:
            refusal = self._literal_refusal(url)
            if refusal is not None:
                return Delivery(
                    Outcome.CONNECT_ERROR,
                    detail=f"not delivered: {refusal}",
                    reached=False,
                    eject=True,
                )
        resent = False
        limit = self.max_response_bytes
        sent = {**_JSON, **headers}
        deadline = asyncio.get_running_loop().time() + timeout_s  # the resend's too
        try:
            try:
                answer = await client.post(url, body, sent, limit, deadline=deadline)
            except Failure as exc:
                # the keep-alive race (module docstring): once more, on a fresh connection
                if not exc.reused or exc.came_back or exc.kind == "protocol":
                    raise
                log(logging.INFO, "transport.stale_connection", url=url, error=exc.detail)
                resent = True
                answer = await client.post(url, body, sent, limit, fresh=True, deadline=deadline)
        except TimeoutError:
            return Delivery(
                Outcome.TIMEOUT,
                detail=f"no answer within {timeout_s * 1000:.0f} ms",
                resent=resent,
            )
        except Failure as exc:
            return _failed(exc)._replace(resent=resent)
        except TooLarge:
            # the agent did the work: a retry could repeat its side effects, so none is made
            return Delivery(
                Outcome.AGENT_ERROR,
                detail=f"answer larger than {self.max_response_bytes} bytes",
                resent=resent,
            )
        except (ValueError, UnicodeError) as exc:  # a URL or header that cannot be sent
            return Delivery(
                Outcome.CONNECT_ERROR, detail=f"cannot connect: {exc}", reached=False, eject=True
            )
        delivery = agent_answer(answer.status, answer.body, answer.encoding, answer.timing)
        return delivery._replace(resent=True) if resent else delivery

    async def fetch(self, url: str, headers: Mapping[str, str], timeout_s: float) -> Fetched:
        """GET ``url`` (a document an agent publishes: an A2A card) through the same guard,
        pool and size cap as deliveries; never raises for what the server does."""
        if self._session is None:
            raise InternalError("HttpTransport.fetch() before start()")
        if self._guard is not None:
            refusal = self._literal_refusal(url)
            if refusal is not None:
                return Fetched(None, b"", {}, f"not fetched: {refusal}")
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._session.get(url, headers=headers, allow_redirects=False)
                async with resp:
                    data = await self._read_capped(resp)
                    return Fetched(resp.status, data, dict(resp.headers), "")
        except TimeoutError:
            return Fetched(None, b"", {}, f"no answer within {timeout_s * 1000:.0f} ms")
        except TooLarge:
            return Fetched(None, b"", {}, f"larger than {self.max_response_bytes} bytes")
        except aiohttp.ClientConnectorError as exc:
            return Fetched(None, b"", {}, f"cannot connect: {exc.os_error}")
        except (aiohttp.ClientError, ValueError, UnicodeError) as exc:
            return Fetched(None, b"", {}, f"cannot fetch: {exc}")

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.max_response_bytes
        if resp.content_length is not None:
            if resp.content_length > limit:
                raise TooLarge
            return await resp.read()  # the length is known and within the limit
        chunks: list[bytes] = []  # chunked: count while reading, stop past the limit
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise TooLarge
            chunks.append(chunk)
        return b"".join(chunks)


def _failed(exc: Failure) -> Delivery:
    """What a network failure of an attempt means for the retry and the passive check."""
    if exc.kind == "connect":
        return Delivery(Outcome.CONNECT_ERROR, detail=exc.detail, reached=False, eject=True)
    if exc.kind == "protocol":
        return Delivery(Outcome.SERVER_ERROR, detail=exc.detail)
    if exc.kind == "io":
        reset = exc.errno in (errno.ECONNRESET, errno.EPIPE)
        return Delivery(Outcome.CONNECT_ERROR, detail=exc.detail, eject=reset)
    # closed or reset under a request: on a fresh connection (or on a pooled one after part of
    # the answer) the agent's process died or dropped it, a reset for the passive check
    return Delivery(Outcome.CONNECT_ERROR, detail=exc.detail, eject=True)
