"""HTTP transport on one shared aiohttp session: pooled keep-alive connections, TCP_NODELAY."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Mapping

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from agent_reach.core.model import Outcome
from agent_reach.core.netguard import AddressGuard, is_ip
from agent_reach.transport.base import Delivery

__all__ = ["GuardedResolver", "HttpTransport"]

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


class HttpTransport:
    """Delivers over HTTP/1.1 with a pool per agent host.

    ``keepalive_s`` is kept below the 5 s idle timeout common in agent servers (uvicorn), so the
    gateway rarely writes on a connection the agent is closing.
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

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._pool_size,
                limit_per_host=self._pool_per_host,
                keepalive_timeout=self._keepalive_s,
                ttl_dns_cache=60,
                resolver=None if self._guard is None else GuardedResolver(self._guard),
            )
            self._session = aiohttp.ClientSession(
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
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        session = self._session
        if session is None:
            raise RuntimeError("HttpTransport.start() was not called")
        if self._guard is not None:
            refusal = self._literal_refusal(url)
            if refusal is not None:
                return Delivery(
                    Outcome.CONNECT_ERROR,
                    detail=f"not delivered: {refusal}",
                    reached=False,
                    eject=True,
                )
        timing: str | None = None
        try:
            async with asyncio.timeout(timeout_s):
                async with session.post(
                    url, data=body, headers={**_JSON, **headers}, allow_redirects=False
                ) as resp:
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
            # the agent dropped a request in flight (process died): a reset for the passive
            # check. Idle pooled connections are retired before common servers' 5 s idle close.
            return Delivery(Outcome.CONNECT_ERROR, detail="agent closed the connection", eject=True)
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
        agent_ms, agent_note = server_timing(timing)
        if status >= 500:
            return Delivery(
                Outcome.SERVER_ERROR,
                status,
                data,
                f"agent answered {status}",
                True,
                False,
                agent_ms,
                agent_note,
            )
        if status >= 400:
            return Delivery(
                Outcome.AGENT_ERROR,
                status,
                data,
                f"agent answered {status}",
                True,
                False,
                agent_ms,
                agent_note,
            )
        # Past here the agent took the request: an unusable answer is not retried, so that a
        # side effect is not repeated (only timeouts, connection errors and 5xx are retryable).
        if status < 200 or status >= 300:
            note = " (redirects are not followed)" if 300 <= status < 400 else ""
            return Delivery(Outcome.AGENT_ERROR, status, None, f"agent answered {status}{note}")
        if encoding != "identity":
            return Delivery(
                Outcome.AGENT_ERROR,
                status,
                None,
                f"agent answered with Content-Encoding {encoding}",
            )
        try:
            msgspec.json.decode(data)
        except (msgspec.DecodeError, RecursionError):
            return Delivery(
                Outcome.AGENT_ERROR,
                status,
                None,
                f"agent answered {status} with a body that is not JSON",
            )
        return Delivery(Outcome.OK, status, data, "", True, False, agent_ms, agent_note)

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


def server_timing(value: str | None) -> tuple[float | None, str]:
    """The ``handle`` metric of a ``Server-Timing`` header: (duration in ms, its description).

    ``handle;dur=12.3;desc="cached"`` -> (12.3, "cached"); anything else -> (None, "").
    Agents that do not send the header (or send other metrics) simply give nothing.
    """
    if not value:
        return None, ""
    for metric in value.split(","):
        name, _, params = metric.strip().partition(";")
        if name.strip() != "handle":
            continue
        dur: float | None = None
        desc = ""
        for param in params.split(";"):
            key, _, raw = param.strip().partition("=")
            raw = raw.strip().strip('"')
            if key == "dur":
                try:
                    dur = float(raw)
                except ValueError:
                    return None, ""
                if not 0 <= dur < 1e9:  # NaN and nonsense from an agent: ignored
                    return None, ""
            elif key == "desc":
                desc = raw[:32]
        return (dur, desc) if dur is not None else (None, "")
    return None, ""
