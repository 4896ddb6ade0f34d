"""NATS transport: a delivery is a NATS request to the subject of a ``nats:SUBJECT`` endpoint URL.

The wire (docs: CONTRACT.md, "NATS transport"): the request carries the same JSON body as over
HTTP and the same ``X-Reach-*`` headers (and ``traceparent``) as NATS headers; the reply's body
is the answer, its header ``Reach-Status`` the HTTP status (absent: 200), so outcomes are
those of HTTP. "No responders" is a refused connection.

Invariants:
- Every answer, good or bad, is a :class:`Delivery`; no nats-py exception leaves
  :meth:`NatsTransport.deliver`, which waits at most the attempt's timeout (never nats-py's
  0.5 s default).
- :meth:`NatsTransport.start` is bounded by ``connect_timeout_s`` (nats-py's own first connect,
  set to reconnect forever, would never return while no server answers) and raises
  :class:`~agent_reach.errors.BackendUnavailable` past it. Once connected, the link is kept
  for good: nats-py reconnects with a wait between tries, without limit; a connection nats-py
  gives up on (it closes for good on some server errors, e.g. an authorization violation after
  a configuration reload) is replaced by a new one, tried with a growing wait.
- While the link is down a delivery is ``connect_error``, not reached, not ejected: the
  gateway's link is at fault, not the agent. A request is never queued for a link to come.
- Only subjects an agent may own are delivered to: no wildcards, nothing under ``$`` (the
  server's and JetStream's APIs: ``$JS.API.STREAM.DELETE.X`` would run with the gateway's
  rights), ``_INBOX`` (other requesters' replies) or a reserved prefix (the gateway's own API).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from agent_reach.clock import Clock, SystemClock
from agent_reach.core.model import Outcome
from agent_reach.errors import BackendUnavailable, ConfigError, InternalError
from agent_reach.observability.logs import log
from agent_reach.settings import redacted
from agent_reach.transport.base import Delivery, agent_answer

__all__ = ["NatsState", "NatsTransport", "subject_refusal"]

STATUS_HEADER = "Reach-Status"
MAX_SUBJECT = 256
REVIVE_MAX_S = 30.0  # the longest wait between tries of a new connection
_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space: what every NATS client can use
_WILDCARD = re.compile(r"[*>]")


def subject_refusal(url: str, reserved: Sequence[str] = ()) -> str | None:
    """Why ``url`` is not a ``nats:SUBJECT`` endpoint URL an agent may register (None: it is).

    SUBJECT: dot-separated tokens of printable ASCII, no wildcards (``*``, ``>``), at most
    :data:`MAX_SUBJECT` characters, not under ``$`` or ``_INBOX``, nor under a ``reserved``
    subject prefix (``agent-reach`` refuses ``agent-reach`` and ``agent-reach.v1.send``).
    """
    scheme, colon, subject = url.partition(":")
    if not colon or scheme.lower() != "nats":
        return "not a nats: URL"
    if not subject:
        return "no subject after nats:"
    if subject.startswith("//"):
        return "nats:SUBJECT takes a subject, not nats://HOST (a server address)"
    if len(subject) > MAX_SUBJECT:
        return f"subject longer than {MAX_SUBJECT} characters"
    tokens = subject.split(".")
    for token in tokens:
        if not token:
            return f"empty token in subject {subject!r}"
        if not _TOKEN.fullmatch(token):
            return f"subject {subject!r} has a space or a character other than printable ASCII"
        if _WILDCARD.search(token):
            return f"subject {subject!r} has a wildcard (* or >)"
    if tokens[0].startswith("$"):
        return f"subject {subject!r} is under $ (the NATS server's and JetStream's APIs)"
    if tokens[0] == "_INBOX":
        return f"subject {subject!r} is under _INBOX (replies to other requests)"
    for prefix in reserved:
        head = prefix.split(".")
        if tokens[: len(head)] == head:
            return f"subject {subject!r} is under {prefix!r}, reserved for the gateway's API"
    return None


def _check_server(url: str) -> str:
    """``url`` if it is a usable ``nats://`` or ``tls://`` server address, else ConfigError."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"unusable NATS server {redacted(url)!r}: {exc}", source="nats") from exc
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        raise ConfigError(
            f"unusable NATS server {redacted(url)!r}: use nats://HOST:PORT or tls://HOST:PORT",
            source="nats",
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or port == 0:
        raise ConfigError(f"unusable NATS server {redacted(url)!r}", source="nats")
    return url


class NatsState(NamedTuple):
    """The link to NATS, for ``/healthz`` and ``/metrics``."""

    connected: bool
    server: str | None  # the server connected to (password hidden), None when not connected
    reconnects: int  # links made again since start(): nats-py's reconnects and new connections
    last_error: str  # the last error the link saw, "" when none


class NatsTransport:
    """Delivers to ``nats:SUBJECT`` endpoints over one NATS connection.

    ``servers``: ``nats://[USER:PASSWORD@]HOST:PORT`` addresses of one NATS system (more are
    learnt from the servers in a cluster). ``max_response_bytes`` caps an answer's body.
    ``connect_timeout_s`` bounds :meth:`start` and each later connection; ``reconnect_wait_s``
    is the wait between tries of a server while the link is down; ``ping_interval_s`` how often
    the link is checked (a half-open link is found within about three intervals). ``reserved``:
    subject prefixes never delivered to (the gateway's own API, ``--nats-prefix``). ``clock``:
    what the replacement of a closed connection sleeps on. Raises :class:`ConfigError` for an
    unusable server address or setting; nothing is connected here.
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        max_response_bytes: int = 1 << 20,
        connect_timeout_s: float = 2.0,
        reconnect_wait_s: float = 1.0,
        ping_interval_s: float = 20.0,
        name: str = "agent-reach-gateway",
        reserved: Sequence[str] = (),
        clock: Clock | None = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [servers]
        if not servers:
            raise ConfigError("no NATS server given", source="nats")
        self.servers = [_check_server(url) for url in servers]
        for value, what in (
            (connect_timeout_s, "connect_timeout_s"),
            (reconnect_wait_s, "reconnect_wait_s"),
            (ping_interval_s, "ping_interval_s"),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"NATS {what} must be a positive number: {value}", source="nats")
        self.max_response_bytes = max_response_bytes
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_wait_s = reconnect_wait_s
        self.ping_interval_s = ping_interval_s
        self.name = name
        self.reserved = tuple(reserved)
        self._clock: Clock = clock or SystemClock()
        self._nc: Client | None = None  # the current client
        self._connecting: Client | None = None  # a client making its first connection
        self._started = False
        self._turning = asyncio.Lock()  # start() and close() one at a time
        self._revive: asyncio.Task[None] | None = None
        self._earlier_reconnects = 0  # of the connections replaced since start()
        self._last_error = ""
        self._refusals: dict[str, str | None] = {}  # url -> subject_refusal(url)

    # --- the link --------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect; idempotent. Raises :class:`BackendUnavailable` when no server of
        ``servers`` takes the connection within ``connect_timeout_s``."""
        async with self._turning:
            if self._started:
                return
            self._nc = await self._connect()
            self._started = True
            self._earlier_reconnects = 0
            log(logging.INFO, "nats.connected", server=self.state().server)

    async def close(self) -> None:
        """Close the connection (and stop replacing it); idempotent. A closed transport may be
        started again."""
        async with self._turning:
            self._started = False
            revive, self._revive = self._revive, None
            if revive is not None:
                revive.cancel()
                await asyncio.wait([revive])  # raises only if our caller is cancelled
            nc, self._nc = self._nc, None
            if nc is not None:
                await self._discard(nc)

    def state(self) -> NatsState:
        """Whether the link is up, to which server, how often it was made again, its last
        error."""
        nc = self._nc
        url = nc.connected_url if nc is not None else None
        reconnects = self._earlier_reconnects + (int(nc.stats["reconnects"]) if nc else 0)
        return NatsState(
            connected=nc is not None and nc.is_connected,
            server=redacted(url.geturl()) if url is not None else None,
            reconnects=reconnects,
            last_error=self._last_error,
        )

    async def _connect(self) -> Client:
        """A new connected client, or BackendUnavailable within ``connect_timeout_s``."""
        nc = Client()
        self._connecting, self._last_error = nc, ""
        ok = False
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await nc.connect(**self._options(nc))
            ok = True
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"NATS at {self._where()}: no connection within {self.connect_timeout_s:g} s"
                + (f" ({self._last_error})" if self._last_error else "")
            ) from exc
        except (OSError, nats_errors.Error) as exc:  # what nats-py does not retry itself
            raise BackendUnavailable(f"NATS at {self._where()}: {exc}") from exc
        finally:
            self._connecting = None
            if not ok:  # a timeout, an error, or our caller cancelled: nothing is left open
                await self._discard(nc)
        return nc

    def _options(self, nc: Client) -> dict[str, Any]:
        """nats-py's connect options (a mapping: nats-py annotates seconds as int, yet uses
        them as float, through asyncio's sleep and wait_for)."""

        async def on_error(exc: Exception) -> None:
            self._note_error(nc, exc)

        async def on_disconnected() -> None:
            if self._started and nc is self._nc:
                log(logging.WARNING, "nats.disconnected", error=self._last_error)

        async def on_reconnected() -> None:
            if nc is self._nc:
                log(logging.INFO, "nats.reconnected", server=self.state().server)

        async def on_closed() -> None:
            self._closed(nc)

        return {
            "servers": self.servers,
            "name": self.name,
            "error_cb": on_error,
            "disconnected_cb": on_disconnected,
            "reconnected_cb": on_reconnected,
            "closed_cb": on_closed,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,  # forever: the first connect is bounded by start()
            "reconnect_time_wait": self.reconnect_wait_s,
            # per try of one server; start() bounds them all
            "connect_timeout": self.connect_timeout_s,
            "ping_interval": self.ping_interval_s,
            "max_outstanding_pings": 2,
        }

    def _note_error(self, nc: Client, exc: Exception) -> None:
        """nats-py's error callback: each failed try of a server while the link is down (so
        the same error is logged once, then only at debug level)."""
        if nc is not self._nc and nc is not self._connecting:
            return  # a client being discarded
        text = str(exc) or type(exc).__name__
        level = logging.DEBUG if text == self._last_error else logging.WARNING
        self._last_error = text
        log(level, "nats.error", servers=self._where(), error=text)

    def _closed(self, nc: Client) -> None:
        """nats-py's closed callback: a client it gave up on is replaced (not ours to close:
        :meth:`close` and :meth:`_discard` close clients that are no longer current)."""
        if not self._started or nc is not self._nc:
            return
        if nc.last_error is not None:  # what nats-py gave up on (not always told to on_error)
            self._last_error = str(nc.last_error)
        if self._revive is not None and not self._revive.done():
            return
        log(logging.WARNING, "nats.closed", servers=self._where(), error=self._last_error)
        self._revive = asyncio.get_running_loop().create_task(self._replace(nc))

    async def _replace(self, dead: Client) -> None:
        """Connect again until it works (a new client), waiting longer after each failure."""
        wait = self.reconnect_wait_s
        while True:
            try:
                nc = await self._connect()
            except BackendUnavailable as exc:
                log(logging.WARNING, "nats.connect_failed", error=exc.detail, retry_in_s=wait)
            except Exception:  # a fault of ours: logged, and the link is still tried again
                log(logging.ERROR, "nats.replace_failed", exc_info=True, retry_in_s=wait)
            else:
                self._earlier_reconnects += int(dead.stats["reconnects"]) + 1
                self._nc = nc
                log(logging.INFO, "nats.reconnected", server=self.state().server)
                return
            await self._clock.sleep(wait)
            wait = min(wait * 2, REVIVE_MAX_S)

    async def _discard(self, nc: Client) -> None:
        """Close a client, within ``connect_timeout_s``; a failure is logged, not raised (the
        client is dropped either way)."""
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await nc.close()
        except (TimeoutError, OSError, nats_errors.Error) as exc:
            log(logging.WARNING, "nats.close_failed", servers=self._where(), error=repr(exc))

    def _where(self) -> str:
        return ",".join(redacted(url) for url in self.servers)

    # --- deliveries ------------------------------------------------------------------------

    def refusal(self, url: str) -> str | None:
        """Why this transport does not deliver to ``url`` (None: it does):
        :func:`subject_refusal` with this transport's reserved prefixes."""
        if url in self._refusals:
            return self._refusals[url]
        refusal = subject_refusal(url, self.reserved)
        if len(self._refusals) >= 4096:
            self._refusals.clear()
        self._refusals[url] = refusal
        return refusal

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """Request ``url``'s subject: :meth:`agent_reach.transport.base.Transport.deliver`."""
        if not self._started:
            raise InternalError("NatsTransport.deliver() before start()")
        refusal = self.refusal(url)
        if refusal is not None:
            return Delivery(
                Outcome.CONNECT_ERROR, detail=f"not delivered: {refusal}", reached=False, eject=True
            )
        nc = self._nc
        if nc is None or not nc.is_connected:
            # the gateway's link is down, not the agent: not ejected (every NATS agent would be)
            return _unlinked(f"not delivered: no NATS connection ({self._last_error or 'down'})")
        if len(body) > nc.max_payload:
            return _unlinked(f"request of {len(body)} bytes over NATS max_payload {nc.max_payload}")
        subject = url.partition(":")[2]
        try:
            # nats-py's own timeout bounds the wait for the reply; this one the publish too
            async with asyncio.timeout(timeout_s):
                msg = await nc.request(subject, body, timeout=timeout_s, headers=dict(headers))
        except TimeoutError:  # nats-py's TimeoutError (and FlushTimeoutError) is one too
            return Delivery(Outcome.TIMEOUT, detail=f"no answer within {timeout_s * 1000:.0f} ms")
        except nats_errors.NoRespondersError:
            return Delivery(
                Outcome.CONNECT_ERROR,
                detail=f"no responders on {subject}",
                reached=False,
                eject=True,
            )
        except (
            nats_errors.ConnectionClosedError,
            nats_errors.ConnectionReconnectingError,
            nats_errors.ConnectionDrainingError,
            nats_errors.OutboundBufferLimitError,
            nats_errors.StaleConnectionError,
        ) as exc:
            return _unlinked(f"not delivered: NATS connection lost ({exc})")
        except (nats_errors.BadSubjectError, nats_errors.BadHeaderError) as exc:
            return _unlinked(f"not delivered: {exc}")
        except (OSError, nats_errors.Error) as exc:  # the request may have gone out
            return Delivery(Outcome.CONNECT_ERROR, detail=f"NATS request failed: {exc!r}")
        return self._answer(msg)

    def _answer(self, msg: Msg) -> Delivery:
        """The delivery of a reply: the HTTP transport's outcomes, by ``Reach-Status``."""
        data = msg.data
        got = _headers(msg.headers)
        if len(data) > self.max_response_bytes:
            # the agent did the work: a retry could repeat its side effects, so none is made
            return Delivery(
                Outcome.AGENT_ERROR, detail=f"answer larger than {self.max_response_bytes} bytes"
            )
        raw = got.get("reach-status")
        status = _status(raw)
        if status is None:
            return Delivery(
                Outcome.AGENT_ERROR,
                detail=f"agent answered with {STATUS_HEADER} {raw!r}, not an HTTP status",
            )
        encoding = got.get("content-encoding", "identity")
        return agent_answer(status, data, encoding, got.get("server-timing"))


def _unlinked(detail: str) -> Delivery:
    """Nothing went out: the link (or the request) is the gateway's problem, not the agent's."""
    return Delivery(Outcome.CONNECT_ERROR, detail=detail, reached=False, eject=False)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Reply headers by lower-case name (NATS keeps the case an agent wrote)."""
    return {key.lower(): value for key, value in (headers or {}).items()}


def _status(raw: str | None) -> int | None:
    """The HTTP status of a ``Reach-Status`` value: absent is 200; None when unusable."""
    if raw is None:
        return 200
    raw = raw.strip()
    if len(raw) != 3 or not raw.isdigit() or not 100 <= int(raw) <= 599:
        return None
    return int(raw)
