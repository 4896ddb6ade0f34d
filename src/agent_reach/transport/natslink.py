"""One kept link to a NATS system, and the responders served on it: :class:`NatsLink`.

Shared by every speaker of ours on NATS: the gateway's transport (requests to agents) and its
API edge (responders on ``PREFIX.v1.*``), the agent SDK (a responder on the agent's subject;
heartbeats on a link of their own) and the client SDK (requests to the gateway's API).

Invariants:
- :meth:`NatsLink.start` is bounded by ``connect_timeout_s`` (nats-py's own first connect, set
  to reconnect forever, would never return while no server answers) and raises
  :class:`~agent_reach.errors.BackendUnavailable` past it. Once connected, the link is kept for
  good: nats-py reconnects with a wait between tries, without limit; a connection nats-py gives
  up on (it closes for good on some server errors, e.g. an authorization violation after a
  configuration reload) is replaced by a new one, tried with a growing wait, and every
  responder is subscribed again on it.
- A responder (:meth:`NatsLink.serve`) handles each request in a task of its own (nats-py calls
  a subscription's callback one message at a time), at most ``max_inflight`` at once: past that
  a request is answered at once with the responder's ``busy`` answer (503 for us: retried
  elsewhere) rather than queued. Its answer is published to the request's reply subject with
  the responder's own headers (nats-py's ``Msg.respond`` would send the request's back), and
  never to a reserved subject (``$...``: ``$JS.API``, ``$SYS``) named as the reply inbox.
  :meth:`NatsLink.unserve` drops no request: it drains (the requests the server routed here
  before it saw the UNSUB are still handled), so a queue group loses none when a member leaves.
- Messages the server or nats-py drops for a slow consumer are counted (``slow_consumers`` in
  :meth:`NatsLink.state`) and logged: their requesters time out and retry with the same msg_id.
- A message nats-py cannot read (a reply subject, or the description of an inline status,
  that is not UTF-8: any client of the NATS system can publish one) is dropped and logged; it
  never ends the connection's read loop (nats-py's own client would stop reading for good while
  still saying it is connected, until its pings fail: :class:`_Client`).
- No nats-py exception leaves this module but through :class:`BackendUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import msgspec
from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import BackendUnavailable, ConfigError
from agent_reach.observability.logs import Throttle, log
from agent_reach.settings import redacted
from agent_reach.wire.status import STATUS_HEADER

__all__ = [
    "LINK_LOST",
    "Answer",
    "NatsLink",
    "NatsState",
    "Responder",
    "check_server",
    "wire_size",
]

REVIVE_MAX_S = 30.0  # the longest wait between tries of a new connection
_REPLIES = Throttle(1.0)  # nats.reply_refused lines: one a second at most
# what nats-py raises for a request when the link is not there to carry it: nothing went out
LINK_LOST: tuple[type[Exception], ...] = (
    nats_errors.ConnectionClosedError,
    nats_errors.ConnectionReconnectingError,
    nats_errors.ConnectionDrainingError,
    nats_errors.OutboundBufferLimitError,
    nats_errors.StaleConnectionError,
)

# what a responder's handler returns: the reply's body and headers
Answer = tuple[bytes, Mapping[str, str]]
Handler = Callable[[Msg], Awaitable[Answer]]


def wire_size(body: bytes, headers: Mapping[str, str] | None) -> int:
    """What the NATS server counts against its ``max_payload`` for a message: the body and its
    header block (``NATS/1.0``, each ``Key: value``, the CRLFs), as nats-py writes it. nats-py
    checks the body alone, and the server closes the connection of a client that sends more:
    every request and answer in flight on it is lost (a review's 1 MiB send did it)."""
    if not headers:
        return len(body)
    block = 12  # b"NATS/1.0\r\n" and the closing b"\r\n"
    for key, value in headers.items():
        block += len(key.encode()) + len(value.encode()) + 4  # ": " and "\r\n"
    return len(body) + block


def check_server(url: str) -> str:
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
    slow_consumers: int = 0  # messages dropped because a responder fell behind
    unreadable: int = 0  # messages dropped because nats-py could not read them


@dataclass(eq=False)
class Responder:
    """A subject served on the link: its handler, and the requests it has in hand."""

    subject: str
    queue: str
    handler: Handler
    busy: Callable[[], Answer]
    max_inflight: int
    inflight: set[asyncio.Task[None]] = field(default_factory=set)
    sub: Subscription | None = None


class _Client(Client):
    """nats-py's client, less one fault: an exception on one message (2.16 decodes a reply
    subject and an inline status description as UTF-8) ends its read loop without a word, the
    connection still saying it is connected, until its pings fail a minute later. Here that
    message is dropped (its requester times out) and the loop reads on."""

    def __init__(self, on_unreadable: Callable[[Exception], None]) -> None:
        super().__init__()
        self.on_unreadable = on_unreadable

    async def _process_msg(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super()._process_msg(*args, **kwargs)
        except Exception as exc:  # any: nats-py would stop reading the connection for good
            self.on_unreadable(exc)


class NatsLink:
    """One connection to a NATS system, kept up for good, and the responders served on it.

    ``servers``: ``nats://[USER:PASSWORD@]HOST:PORT`` addresses of one NATS system (more are
    learnt from the servers in a cluster). ``connect_timeout_s`` bounds :meth:`start` and each
    later connection; ``reconnect_wait_s`` is the wait between tries of a server while the link
    is down; ``ping_interval_s`` how often the link is checked (a half-open link is found within
    about three intervals). ``name`` is the connection's name at the server (``nats server
    report connections``). ``clock``: what the replacement of a closed connection sleeps on.
    Raises :class:`ConfigError` for an unusable server address or setting; nothing is connected
    here.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        connect_timeout_s: float = 2.0,
        reconnect_wait_s: float = 1.0,
        ping_interval_s: float = 20.0,
        name: str = "agent-reach",
        clock: Clock | None = None,
    ) -> None:
        if isinstance(servers, str):
            servers = [part.strip() for part in servers.split(",") if part.strip()]
        if not servers:
            raise ConfigError("no NATS server given", source="nats")
        self.servers = [check_server(url) for url in servers]
        for value, what in (
            (connect_timeout_s, "connect_timeout_s"),
            (reconnect_wait_s, "reconnect_wait_s"),
            (ping_interval_s, "ping_interval_s"),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"NATS {what} must be a positive number: {value}", source="nats")
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_wait_s = reconnect_wait_s
        self.ping_interval_s = ping_interval_s
        self.name = name
        self._clock: Clock = clock or SystemClock()
        self._nc: Client | None = None  # the current client
        self._connecting: Client | None = None  # a client making its first connection
        self._started = False
        self._turning = asyncio.Lock()  # start() and close() one at a time
        self._revive: asyncio.Task[None] | None = None
        self._earlier_reconnects = 0  # of the connections replaced since start()
        self._last_error = ""
        self._slow = 0
        self._unreadable = 0
        self._responders: list[Responder] = []

    # --- the link --------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._started

    @property
    def client(self) -> Client | None:
        """The current nats-py client (None before :meth:`start`); it may be replaced."""
        return self._nc

    @property
    def connected(self) -> bool:
        nc = self._nc
        return nc is not None and nc.is_connected

    @property
    def last_error(self) -> str:
        return self._last_error

    async def start(self) -> None:
        """Connect; idempotent. Raises :class:`BackendUnavailable` when no server of
        ``servers`` takes the connection within ``connect_timeout_s``."""
        async with self._turning:
            if self._started:
                return
            self._nc = await self._connect()
            self._started = True
            self._earlier_reconnects = 0
            log(logging.INFO, "nats.connected", link=self.name, server=self.state().server)

    async def close(self, grace_s: float = 0.0) -> None:
        """Stop serving (requests in hand get up to ``grace_s`` seconds), close the connection
        and stop replacing it; idempotent. A closed link may be started again."""
        await asyncio.gather(*(self.unserve(r, grace_s) for r in list(self._responders)))
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
        error, the messages dropped for slow consumers."""
        nc = self._nc
        url = nc.connected_url if nc is not None else None
        reconnects = self._earlier_reconnects + (int(nc.stats["reconnects"]) if nc else 0)
        return NatsState(
            connected=nc is not None and nc.is_connected,
            server=redacted(url.geturl()) if url is not None else None,
            reconnects=reconnects,
            last_error=self._last_error,
            slow_consumers=self._slow,
            unreadable=self._unreadable,
        )

    async def _connect(self) -> Client:
        """A new connected client, or BackendUnavailable within ``connect_timeout_s``."""
        nc = _Client(self._note_unreadable)
        self._connecting, self._last_error = nc, ""
        ok = False
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await nc.connect(**self._options(nc))
            ok = True
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"NATS at {self.where()}: no connection within {self.connect_timeout_s:g} s"
                + (f" ({self._last_error})" if self._last_error else "")
            ) from exc
        except (OSError, nats_errors.Error) as exc:  # what nats-py does not retry itself
            raise BackendUnavailable(f"NATS at {self.where()}: {exc}") from exc
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
                log(logging.WARNING, "nats.disconnected", link=self.name, error=self._last_error)

        async def on_reconnected() -> None:
            if nc is self._nc:
                log(logging.INFO, "nats.reconnected", link=self.name, server=self.state().server)

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
        the same error is logged once, then only at debug level), and slow consumers."""
        if nc is not self._nc and nc is not self._connecting:
            return  # a client being discarded
        if isinstance(exc, nats_errors.SlowConsumerError):
            self._slow += 1
            # the first, then one in a thousand: a flood of drops must not flood the log
            if self._slow == 1 or self._slow % 1000 == 0:
                log(
                    logging.WARNING,
                    "nats.slow_consumer",
                    link=self.name,
                    subject=exc.subject,
                    dropped=self._slow,
                )
            return
        text = str(exc) or type(exc).__name__
        level = logging.DEBUG if text == self._last_error else logging.WARNING
        self._last_error = text
        log(level, "nats.error", link=self.name, servers=self.where(), error=text)

    def _note_unreadable(self, exc: Exception) -> None:
        """A message :class:`_Client` dropped: the first, then one in a thousand, logged."""
        self._unreadable += 1
        if self._unreadable == 1 or self._unreadable % 1000 == 0:
            drops = self._unreadable
            log(
                logging.WARNING,
                "nats.unreadable_message",
                link=self.name,
                error=repr(exc),
                dropped=drops,
            )

    def _closed(self, nc: Client) -> None:
        """nats-py's closed callback: a client it gave up on is replaced (not ours to close:
        :meth:`close` and :meth:`_discard` close clients that are no longer current)."""
        if not self._started or nc is not self._nc:
            return
        if nc.last_error is not None:  # what nats-py gave up on (not always told to on_error)
            self._last_error = str(nc.last_error)
        if self._revive is not None and not self._revive.done():
            return
        log(
            logging.WARNING,
            "nats.closed",
            link=self.name,
            servers=self.where(),
            error=self._last_error,
        )
        self._revive = asyncio.get_running_loop().create_task(self._replace(nc))

    async def _replace(self, dead: Client) -> None:
        """Connect again until it works (a new client, serving every responder again),
        waiting longer after each failure."""
        wait = self.reconnect_wait_s
        while True:
            nc: Client | None = None
            try:
                nc = await self._connect()
                for responder in list(self._responders):  # unserve() may remove some meanwhile
                    await self._subscribe(nc, responder)
                    if responder not in self._responders:  # unserved while subscribing
                        await self._leave_quietly(responder)
            except BaseException as exc:
                if nc is not None:  # not in use: nothing may be left connected or subscribed
                    await self._discard(nc)
                if not isinstance(exc, Exception):
                    raise  # cancelled (close()): the link is being closed
                self._replace_failed(exc, wait)
            else:
                self._earlier_reconnects += int(dead.stats["reconnects"]) + 1
                self._nc = nc
                log(logging.INFO, "nats.reconnected", link=self.name, server=self.state().server)
                return
            await self._clock.sleep(wait)
            wait = min(wait * 2, REVIVE_MAX_S)

    def _replace_failed(self, exc: Exception, wait: float) -> None:
        """A try of :meth:`_replace` failed: logged as what it was."""
        if isinstance(exc, BackendUnavailable):
            error = exc.detail
        elif isinstance(exc, OSError | nats_errors.Error):  # a subscription refused: again
            error = repr(exc)
        else:  # a fault of ours: logged with its traceback, and the link is still tried again
            log(
                logging.ERROR,
                "nats.replace_failed",
                link=self.name,
                exc_info=True,  # called in the except block: the exception in hand
                retry_in_s=wait,
            )
            return
        log(logging.WARNING, "nats.connect_failed", link=self.name, error=error, retry_in_s=wait)

    async def _leave_quietly(self, responder: Responder) -> None:
        """Drop the subscription of a responder unserved while :meth:`_replace` made it."""
        sub, responder.sub = responder.sub, None
        if sub is not None:
            with contextlib.suppress(nats_errors.Error):
                await sub.unsubscribe()

    async def _discard(self, nc: Client) -> None:
        """Close a client, within ``connect_timeout_s``; a failure is logged, not raised (the
        client is dropped either way)."""
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await nc.close()
        except (TimeoutError, OSError, nats_errors.Error) as exc:
            log(
                logging.WARNING,
                "nats.close_failed",
                link=self.name,
                servers=self.where(),
                error=repr(exc),
            )

    def where(self) -> str:
        """The servers, passwords hidden."""
        return ",".join(redacted(url) for url in self.servers)

    # --- responders ------------------------------------------------------------------------

    async def serve(
        self,
        subject: str,
        handler: Handler,
        *,
        queue: str = "",
        busy: Callable[[], Answer],
        max_inflight: int = 1024,
    ) -> Responder:
        """Answer requests to ``subject`` (as one member of the queue group ``queue``, when
        given) with ``handler``; ``busy()`` answers those past ``max_inflight`` in hand. The
        subscription is made, and confirmed by the server (a flush), before this returns;
        BackendUnavailable when the link cannot make it."""
        nc = self._nc
        if nc is None:
            raise BackendUnavailable(f"NATS at {self.where()}: serve() before start()")
        responder = Responder(subject, queue, handler, busy, max_inflight)
        try:
            await self._subscribe(nc, responder)
            async with asyncio.timeout(self.connect_timeout_s):
                await nc.flush()
        except (TimeoutError, OSError, nats_errors.Error) as exc:
            raise BackendUnavailable(
                f"NATS at {self.where()}: cannot serve {subject}: {exc}"
            ) from exc
        self._responders.append(responder)
        return responder

    async def unserve(self, responder: Responder, grace_s: float = 0.0) -> None:
        """Stop taking requests for ``responder`` (the queue group's other members get them),
        give those in hand up to ``grace_s`` seconds, then cancel the rest."""
        if responder in self._responders:
            self._responders.remove(responder)
        sub, responder.sub = responder.sub, None
        if sub is not None:
            await self._leave(sub)
        pending = set(responder.inflight)
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _leave(self, sub: Subscription) -> None:
        """Unsubscribe, dropping no request the server routed here before it saw the UNSUB
        (nats-py's ``unsubscribe`` drops them: their requesters time out though the queue group
        has other members): a drain, within ``connect_timeout_s``. Link down: an unsubscribe."""
        if self.connected:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    await sub.drain()  # type: ignore[no-untyped-call]
                return
            except (TimeoutError, nats_errors.Error) as exc:  # the link broke meanwhile
                log(logging.DEBUG, "nats.drain_failed", link=self.name, error=repr(exc))
        try:
            await sub.unsubscribe()
        except nats_errors.Error as exc:  # the connection is gone: so is the subscription
            log(logging.DEBUG, "nats.unsubscribe_failed", link=self.name, error=repr(exc))

    async def _subscribe(self, nc: Client, responder: Responder) -> None:
        async def on_message(msg: Msg) -> None:
            self._take(nc, responder, msg)

        responder.sub = await nc.subscribe(responder.subject, queue=responder.queue, cb=on_message)

    def _take(self, nc: Client, responder: Responder, msg: Msg) -> None:
        """One request: a task of its own, or the busy answer at once."""
        if not msg.reply:
            return  # a publish, not a request: nobody waits for an answer
        if len(responder.inflight) >= responder.max_inflight:
            task = asyncio.create_task(self._reply(nc, msg, responder.busy()))
        else:
            task = asyncio.create_task(self._answer(nc, responder, msg))
        responder.inflight.add(task)
        task.add_done_callback(responder.inflight.discard)

    async def _answer(self, nc: Client, responder: Responder, msg: Msg) -> None:
        try:
            answer = await responder.handler(msg)
        except asyncio.CancelledError:
            raise
        except Exception:  # the handler's own table should have caught it: a bug of ours
            log(
                logging.ERROR,
                "nats.responder_failed",
                link=self.name,
                subject=msg.subject,
                exc_info=True,
            )
            return
        await self._reply(nc, msg, answer)

    async def _reply(self, nc: Client, msg: Msg, answer: Answer) -> None:
        """Publish the answer to the request's reply subject, on the current client (the one
        the request came on may have been replaced meanwhile)."""
        reply = msg.reply
        if not reply or reply.startswith("$"):
            # no reply asked for; or a reserved subject ($JS.API.*, $SYS.*, ...) named as the
            # inbox: this link would publish there with its own permissions, for the caller
            held = _REPLIES.take("nats.reply_refused")
            if held is not None:
                log(
                    logging.WARNING,
                    "nats.reply_refused",
                    link=self.name,
                    subject=msg.subject,
                    reply=reply[:64],
                    suppressed=held,
                )
            return
        body, headers = answer
        client = self._nc or nc
        try:
            size = wire_size(body, headers)
            if size > client.max_payload:
                body, headers = _too_large(size, client.max_payload, body)
            await client.publish(msg.reply, body, headers=dict(headers) or None)
        except (OSError, nats_errors.Error) as exc:
            # the requester times out, and may try again with the same msg_id
            log(
                logging.WARNING,
                "nats.reply_failed",
                link=self.name,
                subject=msg.subject,
                error=repr(exc),
            )


class _Ids(msgspec.Struct):
    """What a send's answer names, kept in the error that replaces one too big to go."""

    msg_id: str | None = None
    trace_id: str | None = None
    attempts: list[msgspec.Raw] | None = None


_ids = msgspec.json.Decoder(_Ids)


def _too_large(size: int, limit: int, answer: bytes) -> Answer:
    """An answer over the server's max_payload: refused (413, never retried: the work is
    done), small enough to go; a send's keeps its ``msg_id``, ``trace_id`` and ``attempts``
    (every send's error carries them: with them the caller can read the trace, and knows the
    work was done under that msg_id)."""
    detail = f"answer of {size} bytes over the NATS server's max_payload of {limit}"
    error: dict[str, Any] = {"ok": False, "error": "payload_too_large", "detail": detail}
    try:
        ids = _ids.decode(answer)
    except (msgspec.DecodeError, msgspec.ValidationError):
        ids = _Ids()
    if ids.msg_id is not None and ids.trace_id is not None:
        error.update(msg_id=ids.msg_id, trace_id=ids.trace_id, attempts=ids.attempts or [])
    return msgspec.json.encode(error), {STATUS_HEADER: "413", "Content-Type": "application/json"}
