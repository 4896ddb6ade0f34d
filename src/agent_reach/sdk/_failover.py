"""Several gateways sharing one registry: in which order to try them, which failures allow
trying the next one, and (:class:`GatewayPool`) the client's HTTP exchange across them. The ring
and the rule are shared by the client (:mod:`.client`) and the heartbeat line (:mod:`._beat`).

Invariants of :class:`GatewayRing`:

- :meth:`~GatewayRing.order` holds every gateway exactly once: a gateway that failed recently is
  tried last, never dropped, since it is still worth a try when all the others fail too.
- The order starts from the current gateway, the last one that worked (sticky), and goes round
  in the order the gateways were given; so calls stay on one gateway while it works, and move
  on together when it fails.
- A failure is remembered for ``cooloff_s`` seconds; the oldest failures are retried first.
- No clock reads: the caller passes ``now`` (monotonic seconds).

Which failures allow trying the next gateway (:func:`never_sent`): only those where the
request cannot have reached the gateway, because the connection could not be made (refused,
DNS, no route, TLS handshake, connect timeout). A connection lost after the request was written
(reset, closed, read timeout) is ambiguous: the gateway may have acted on it. One case is not:
a pooled keep-alive connection the gateway had already closed (its ``--idle-timeout``, its
connection cap, a proxy's shorter idle time) when the request was written on it fails before
any byte of an answer, and nothing was read there (a gateway never closes a connection with a
request waiting in it). aiohttp sends such a request again by itself only for idempotent
methods; :meth:`GatewayPool._once` does it for every call (a send keeps its ``msg_id``, by
which agents drop a duplicate), on another connection, at most :data:`STALE_RESENDS` times,
and only when the failure came within :data:`STALE_WITHIN_S` of writing the request: a
connection lost later (the gateway crashed on it, a proxy cut it) may have been acted on, and
is the ambiguous case above.

Each move to the next gateway is a :class:`Failover`, handed to the pool's ``on_failover``
(by default, :func:`log_failover` logs it as ``client.gateway_failover``; the agent's heartbeat
line logs its own as ``agent.gateway_failover``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import AgentReachError, ConfigError, GatewayUnavailable
from agent_reach.observability.logs import log

__all__ = [
    "CONNECT_MARGIN_S",
    "CONNECT_TIMEOUT_S",
    "COOLOFF_S",
    "MAX_ANSWER_BYTES",
    "Failover",
    "GatewayPool",
    "GatewayRing",
    "describe",
    "log_failover",
    "never_sent",
    "read_capped",
    "unusable",
]

# how long a failed gateway is tried last
COOLOFF_S = 5.0
# a request whose pooled connection turned out closed by the gateway is sent again (on
# another connection) at most this many times: each stale connection of the pool fails once
STALE_RESENDS = 3
# ... and only when that came within this long of writing it: a connection closed before the
# request reached the gateway fails at once (its close is already there, or on its way: a
# round trip); one lost while the gateway worked on it (a crash, a proxy's cut) fails later,
# and may have been acted on: not resent
STALE_WITHIN_S = 1.0
# how long making a connection to a gateway may take before the next one is tried
CONNECT_TIMEOUT_S = 1.0
# the most of a gateway's answer read by default (ReachClient's max_answer_bytes): the whole
# list of agents at 100,000 endpoints with long descriptions fits; past it, an unusable
# answer. Nothing is decompressed, since a gateway never compresses (a small gzip body that
# expands to gigabytes is not read)
MAX_ANSWER_BYTES = 256 << 20
# the last gateway left may take the rest of the call's time to connect, less this: its
# connect timeout then fires before the call's own, and says that nothing was sent
CONNECT_MARGIN_S = 0.05


class GatewayRing:
    """The gateways of one client or agent, the current one, and the ones that failed lately."""

    def __init__(self, urls: Sequence[str], *, cooloff_s: float = COOLOFF_S) -> None:
        if not urls:
            raise ValueError("at least one gateway URL is needed")
        self.urls = tuple(urls)
        self.cooloff_s = cooloff_s
        self._current = 0
        self._failed_at: dict[str, float] = {}

    @property
    def current(self) -> str:
        """The last gateway that worked (the first one given, before any call)."""
        return self.urls[self._current]

    def order(self, now: float) -> list[str]:
        """Every gateway once, in the order to try them now: from the current one round the
        ring, those that did not fail in the last ``cooloff_s`` seconds first, then the others,
        the oldest failure first."""
        ring = self.urls[self._current :] + self.urls[: self._current]
        cooling = [url for url in ring if self._cooling(url, now)]
        cooling.sort(key=self._failed_at.__getitem__)
        return [url for url in ring if url not in cooling] + cooling

    def failed(self, url: str, now: float) -> None:
        """``url`` could not be reached (or lost the connection) at ``now``."""
        self._failed_at[url] = now

    def worked(self, url: str) -> None:
        """``url`` answered: it becomes the current gateway, and its failure is forgotten."""
        self._current = self.urls.index(url)
        self._failed_at.pop(url, None)

    def _cooling(self, url: str, now: float) -> bool:
        failed_at = self._failed_at.get(url)
        return failed_at is not None and now - failed_at < self.cooloff_s


class _Pooled:
    """Whether a request's connection came from the pool (aiohttp's trace context)."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _reused(_: object, context: Any, __: object) -> None:
    """aiohttp's ``on_connection_reuseconn``: the request goes on a pooled connection."""
    pooled = context.trace_request_ctx
    if isinstance(pooled, _Pooled):
        pooled.reused = True


def never_sent(exc: BaseException) -> bool:
    """Whether ``exc``, raised by an aiohttp request, means that nothing reached the gateway:
    the connection could not be made (refused, DNS, unreachable, TLS, connect timeout)."""
    return isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for logs and error details."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def unusable(detail: str, status: int) -> GatewayUnavailable:
    """GatewayUnavailable for an answer that is not the contract's (a proxy's HTML page, a body
    of the wrong shape): it has the answer's ``http_status``, as field and attribute, so that a
    caller can tell "answered, unusably" from "could not be reached"."""
    err = GatewayUnavailable(detail, http_status=status)
    err.http_status = status
    return err


@dataclass(frozen=True, slots=True)
class Failover:
    """One move of a call from a gateway that could not be reached to the next one."""

    source: str  # the gateway that failed
    target: str  # the gateway tried next
    error: str  # why ``source`` failed (:func:`describe` of the exception)
    method: str
    path: str
    fields: Mapping[str, Any] = field(default_factory=dict)  # a send's msg_id and trace_id


def log_failover(move: Failover) -> None:
    """The default ``on_failover``: a ``client.gateway_failover`` warning."""
    moved: dict[str, Any] = {"from": move.source, "to": move.target}
    log(
        logging.WARNING,
        "client.gateway_failover",
        **moved,
        error=move.error,
        call=f"{move.method} {move.path}",
        **move.fields,
    )


class GatewayPool:
    """The HTTP side of a client of several gateways: one pooled aiohttp session, and
    :meth:`call`, one exchange through the first gateway of the ring that answers.

    ``connect_timeout_s`` (read at each request, so it may be changed between calls) bounds
    making a connection when there is another gateway to go to; ``on_failover`` is told of each
    move to the next gateway (default :func:`log_failover`)."""

    def __init__(
        self,
        ring: GatewayRing,
        *,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        clock: Clock | None = None,
        token: Callable[[], str | None] | None = None,
        on_failover: Callable[[Failover], None] = log_failover,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.ring = ring
        self.max_answer_bytes = max_answer_bytes
        self.on_failover = on_failover
        self._token = token  # the bearer token of each call (token mode), read when it is made
        self.connect_timeout_s = connect_timeout_s
        self._clock = clock or SystemClock()
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            reuse = aiohttp.TraceConfig()
            reuse.on_connection_reuseconn.append(_reused)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                trace_configs=[reuse],
                headers=self._headers,
                json_serialize=lambda obj: msgspec.json.encode(obj).decode(),
                auto_decompress=False,  # MAX_ANSWER_BYTES counts the bytes really held
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        *,
        late: Callable[[str], AgentReachError],
        timeout_s: float,
        body: Any = None,
        retry_body: Callable[[float], Any] | None = None,
        params: Mapping[str, str] | None = None,
        resend: bool = True,
        text: bool = False,
        fields: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any, Mapping[str, str], str]:
        """One HTTP exchange with the first gateway that answers, all within ``timeout_s``.

        Returns (status, the parsed JSON body, or its text when ``text``, headers, the URL of
        the gateway that answered). A gateway whose connection cannot be made is marked failed
        and the next one is tried, with ``retry_body(seconds spent)`` as the body when given
        (None: no time left for it); after a connection lost mid-call, only when ``resend``.
        Any answer ends the call, error statuses included. Connected but no answer in time (or
        no time left for the next gateway): ``late(what happened)`` is raised. No gateway left:
        GatewayUnavailable, with ``fields`` (which each :class:`Failover` carries too). With
        several gateways, both errors list the gateways tried in ``fields["gateways"]``.
        ``headers`` go on this call's requests besides the client's own (a ``traceparent``).
        An answer whose body is not JSON (or nested too deeply to decode): :func:`unusable`.
        """
        clock = self._clock
        start = clock.monotonic()
        order = self.ring.order(start)
        tried: list[tuple[str, str]] = []
        failure: BaseException | None = None
        for index, url in enumerate(order):
            spent = clock.monotonic() - start
            payload = retry_body(spent) if index and retry_body is not None else body
            if index and (spent >= timeout_s or (retry_body is not None and payload is None)):
                # the gateways tried so far took the whole time
                what = f"no gateway could be reached ({_listing(tried)})"
                raise self._late(late, what, [u for u, _ in tried]) from failure
            last = index + 1 == len(order)
            try:
                status, raw, answer_headers = await self._once(
                    url, method, path, payload, params, timeout_s - spent, headers, last=last
                )
            except _TooLarge as exc:
                self.ring.worked(url)  # it answered
                raise unusable(
                    f"the gateway at {url} answered HTTP {exc.status} with more than"
                    f" {self.max_answer_bytes} bytes (the client's max_answer_bytes; a list"
                    " of agents can be read in pages: page_size)",
                    exc.status,
                ) from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.ring.failed(url, clock.monotonic())
                unsent = never_sent(exc)
                if not unsent and isinstance(exc, TimeoutError):
                    # connected, no answer: the time is spent
                    what = f"no answer from the gateway at {url}"
                    raise self._late(late, what, [*(u for u, _ in tried), url]) from exc
                tried.append((url, describe(exc)))
                failure = exc
                if not (unsent or resend):
                    raise self._unavailable(tried, fields, delivered=True) from exc
                if index + 1 < len(order):
                    target = order[index + 1]
                    self.on_failover(
                        Failover(url, target, describe(exc), method, path, dict(fields or {}))
                    )
                continue
            self.ring.worked(url)
            if text:
                return status, raw.decode(errors="replace"), answer_headers, url
            try:
                return status, msgspec.json.decode(raw), answer_headers, url
            # RecursionError: JSON nested deeper than the decoder goes (not a DecodeError)
            except (msgspec.DecodeError, RecursionError):
                raise unusable(
                    f"the gateway at {url} answered HTTP {status} with a body that is not JSON",
                    status,
                ) from None
        raise self._unavailable(tried, fields, delivered=False) from failure

    def _late(
        self, late: Callable[[str], AgentReachError], what: str, tried: list[str]
    ) -> AgentReachError:
        err = late(what)
        if len(self.ring.urls) > 1:
            err.fields.setdefault("gateways", tried)
        return err

    async def _once(
        self,
        url: str,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | None,
        timeout_s: float,
        extra: Mapping[str, str] | None = None,
        *,
        last: bool = True,
    ) -> tuple[int, bytes, Mapping[str, str]]:
        data = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self._token is not None and (token := self._token()):
            token = token.strip()  # a token function reading a file gets its newline too
            if not token.isprintable():
                raise ConfigError(
                    "the token holds control characters (not a token as issued): check where"
                    " it is read from"
                )
            headers["Authorization"] = f"Bearer {token}"
        if extra:
            headers.update(extra)
        # a connect timeout of its own only where there is another gateway to go to: the last
        # one left may take the whole time (a gateway whose listen queue is full answers late)
        connect = max(timeout_s - CONNECT_MARGIN_S, 0.001) if last else self.connect_timeout_s
        started = self._clock.monotonic()
        for resend in range(STALE_RESENDS + 1):
            left = timeout_s - (self._clock.monotonic() - started)
            timeout = aiohttp.ClientTimeout(total=left, sock_connect=min(connect, left))
            pooled = _Pooled()
            written = self._clock.monotonic()
            try:
                resp = await self._pool().request(
                    method,
                    url + path,
                    data=data,
                    params=params,
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,
                    trace_request_ctx=pooled,
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # a pooled connection the gateway had closed: nothing of an answer came, and
                # nothing was read there (module docstring); on another one, while time is left
                now = self._clock.monotonic()
                if (
                    not pooled.reused
                    or resend == STALE_RESENDS
                    or now - written > STALE_WITHIN_S
                    or now - started >= timeout_s - 0.001
                ):
                    raise
                log(
                    logging.DEBUG,
                    "client.stale_connection",
                    gateway=url,
                    call=f"{method} {path}",
                    error=describe(exc),
                )
                continue
            break
        async with resp:
            limit = self.max_answer_bytes
            body = None
            if resp.content_length is None or resp.content_length <= limit:
                body = await read_capped(resp.content, limit)
            if body is None:
                raise _TooLarge(resp.status)
            return resp.status, body, resp.headers

    def _unavailable(
        self, tried: list[tuple[str, str]], fields: Mapping[str, Any] | None, *, delivered: bool
    ) -> GatewayUnavailable:
        extra = dict(fields or {})
        if len(self.ring.urls) == 1:
            url, error = tried[0]
            return GatewayUnavailable(f"cannot reach the gateway at {url}: {error}", **extra)
        extra["gateways"] = [url for url, _ in tried]
        if delivered:
            *before, (url, error) = tried
            detail = (
                f"lost the connection to the gateway at {url} after sending the request ({error}):"
                " it may have been delivered, so it was not sent through another gateway"
            )
            if before:
                detail += f"; before that: {_listing(before)}"
            return GatewayUnavailable(detail, **extra)
        return GatewayUnavailable(
            f"cannot reach any of the {len(tried)} gateways: {_listing(tried)}", **extra
        )


class _TooLarge(Exception):
    """An answer over the client's bound (``status``: its HTTP status)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` bytes (chunked bodies included): a
    gateway's answer here, a delivery in the agent's server."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _listing(tried: list[tuple[str, str]]) -> str:
    return "; ".join(f"{url}: {error}" for url, error in tried)
