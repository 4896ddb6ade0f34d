"""HTTP transport on one shared aiohttp session: pooled keep-alive connections, TCP_NODELAY.

Invariants:
- Every answer, good or bad, is a :class:`Delivery`; no aiohttp exception leaves
  :meth:`HttpTransport.deliver`, and the whole attempt (a resend included) fits in its timeout.
- A request that fails on a connection taken from the pool, before any of the answer came back,
  is sent once more on a fresh connection, inside the same attempt: the agent closed that idle
  connection just as the request went out on it (the keep-alive race), which says nothing about
  the agent's health. The same failure on a fresh connection is a reset (``eject``).
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import socket
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.resolver import DefaultResolver
from aiohttp.tracing import Trace
from yarl import URL

from agent_reach.core.model import Outcome
from agent_reach.core.netguard import AddressGuard, is_ip
from agent_reach.errors import InternalError
from agent_reach.observability.logs import log
from agent_reach.transport.base import Delivery, agent_answer

__all__ = ["Fetched", "GuardedResolver", "HttpTransport"]

_JSON = {"Content-Type": "application/json"}

# The ways a connection dies under a request: the agent closed it (EOF), reset it, or it was
# closing when the request was written. A refused connection (ClientConnectorError, a
# ClientOSError too) never happens on a pooled connection, so it is never resent.
_DROPPED = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientConnectionResetError,
)


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


class _Pick:
    """Whether the connection of the request in progress came from the pool, and whether the
    request was sent again on a fresh one."""

    __slots__ = ("resent", "reused")

    def __init__(self) -> None:
        self.reused = False
        self.resent = False


# set around each request, so that the connector can say what it handed out (a task each
# request: concurrent deliveries never see each other's)
_PICK: contextvars.ContextVar[_Pick | None] = contextvars.ContextVar("reach_pick", default=None)


class _PoolConnector(aiohttp.TCPConnector):
    """aiohttp's connector, noting in :data:`_PICK` whether a connection was used before."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(  # aiohttp's signature
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        if proto is not None:
            pick = _PICK.get()
            if pick is not None:
                pick.reused = proto in self._used
            self._used.add(proto)
        return conn


def _nothing_came_back(exc: BaseException) -> bool:
    """For a failure raised before the answer's head was parsed: was none of it received?

    A clean close after part of the head carries that part (aiohttp's partial message); a reset
    cannot tell, and is taken as nothing (an agent that reset a connection half-way through its
    status line is far rarer than the keep-alive race)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return isinstance(exc.message, str)  # "Server disconnected": no message parsed
    return True


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
        self._session: aiohttp.ClientSession | None = None
        # for the resend after the keep-alive race: a connection of its own each time
        self._fresh: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the pools; idempotent."""
        if self._session is None:
            self._session = self._open(
                _PoolConnector(
                    limit=self._pool_size,
                    limit_per_host=self._pool_per_host,
                    keepalive_timeout=self._keepalive_s,
                    ttl_dns_cache=60,
                    resolver=self._resolver(),
                )
            )
            self._fresh = self._open(
                aiohttp.TCPConnector(
                    limit=self._pool_size,
                    limit_per_host=self._pool_per_host,
                    force_close=True,
                    ttl_dns_cache=60,
                    resolver=self._resolver(),
                )
            )

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
        try:
            host = URL(url).raw_host or ""
        except (ValueError, TypeError):
            host = ""
        refusal = self._guard.refusal_for_address(host) if is_ip(host) else None
        if len(self._literal) >= 4096:
            self._literal.clear()
        self._literal[url] = refusal
        return refusal

    async def close(self) -> None:
        """Close the pools; idempotent."""
        session, fresh = self._session, self._fresh
        self._session = self._fresh = None
        if session is not None:
            await session.close()
        if fresh is not None:
            await fresh.close()

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """POST ``body`` to ``url``: :meth:`agent_reach.transport.base.Transport.deliver`."""
        pick = _Pick()
        delivery = await self._deliver(url, body, headers, timeout_s, pick)
        return delivery._replace(resent=True) if pick.resent else delivery

    async def _deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float, pick: _Pick
    ) -> Delivery:
        if self._session is None:
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
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._post(url, body, {**_JSON, **headers}, pick)
                async with resp:
                    status = resp.status
                    encoding = resp.headers.get("Content-Encoding", "identity").lower()
                    timing = resp.headers.get("Server-Timing")
                    data = await self._read_capped(resp)
        except TimeoutError:
            return Delivery(Outcome.TIMEOUT, detail=f"no answer within {timeout_s * 1000:.0f} ms")
        except aiohttp.ClientConnectorError as exc:
            return Delivery(
                Outcome.CONNECT_ERROR,
                detail=f"cannot connect: {exc.os_error}",
                reached=False,
                eject=True,
            )
        except aiohttp.ServerDisconnectedError:
            # the agent dropped a request in flight on a fresh connection (or on a pooled one
            # after part of its answer): its process died, a reset for the passive check
            return Delivery(Outcome.CONNECT_ERROR, detail="agent closed the connection", eject=True)
        except aiohttp.ClientConnectionResetError as exc:
            return Delivery(Outcome.CONNECT_ERROR, detail=f"connection reset: {exc}", eject=True)
        except aiohttp.ClientOSError as exc:
            reset = exc.errno in (errno.ECONNRESET, errno.EPIPE)
            return Delivery(Outcome.CONNECT_ERROR, detail=f"connection error: {exc}", eject=reset)
        except _TooLarge:
            # the agent did the work: a retry could repeat its side effects, so none is made
            return Delivery(
                Outcome.AGENT_ERROR,
                detail=f"answer larger than {self.max_response_bytes} bytes",
            )
        except (ValueError, UnicodeError) as exc:  # a URL the resolver cannot encode
            return Delivery(
                Outcome.CONNECT_ERROR, detail=f"cannot connect: {exc}", reached=False, eject=True
            )
        except aiohttp.ClientError as exc:
            return Delivery(Outcome.SERVER_ERROR, detail=f"bad HTTP answer: {exc}")
        return agent_answer(status, data, encoding, timing)

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
        except _TooLarge:
            return Fetched(None, b"", {}, f"larger than {self.max_response_bytes} bytes")
        except aiohttp.ClientConnectorError as exc:
            return Fetched(None, b"", {}, f"cannot connect: {exc.os_error}")
        except (aiohttp.ClientError, ValueError, UnicodeError) as exc:
            return Fetched(None, b"", {}, f"cannot fetch: {exc}")

    async def _post(
        self, url: str, body: bytes, headers: Mapping[str, str], pick: _Pick
    ) -> aiohttp.ClientResponse:
        """The answer's head, the keep-alive race taken care of (module docstring)."""
        assert self._session is not None and self._fresh is not None
        token = _PICK.set(pick)
        try:
            return await self._session.post(url, data=body, headers=headers, allow_redirects=False)
        except _DROPPED as exc:
            if not pick.reused or not _nothing_came_back(exc):
                raise
            log(logging.INFO, "transport.stale_connection", url=url, error=repr(exc))
            pick.resent = True
        finally:
            _PICK.reset(token)
        return await self._fresh.post(url, data=body, headers=headers, allow_redirects=False)

    async def _read_capped(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.max_response_bytes
        if resp.content_length is not None:
            if resp.content_length > limit:
                raise _TooLarge
            return await resp.read()  # the length is known and within the limit
        chunks: list[bytes] = []  # chunked: count while reading, stop past the limit
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)


class _TooLarge(Exception):
    """The answer is over ``max_response_bytes`` (internal to this adapter)."""
