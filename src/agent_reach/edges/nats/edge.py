"""The gateway's API over NATS: responders on ``PREFIX.v1.register|heartbeat|deregister|send``
(and ``PREFIX.v1.keys``, the public JWKS, beyond the contract).

It receives a :class:`~agent_reach.gateway.node.Node` with a NATS link (``--nats``) and
nothing else. The wire (CONTRACT.md v1.1, "NATS transport"): a NATS request whose body is the
HTTP API's request body; the reply's body is the HTTP API's answer, its header ``Reach-Status``
the HTTP status (absent: 200; ``Retry-After`` beside a 429); in token mode the bearer token is
the request's ``Authorization`` header. Every gateway of one registry serves these subjects as
one queue group (named by the prefix), so NATS hands each request to one of them.

Like the HTTP edge, a handler only parses (the message into a
:class:`~agent_reach.gateway.service.Caller` and a wire struct), calls the service, and
renders, with the one status table of :mod:`agent_reach.wire.status`; anything unexpected is a
500 ``internal_error``, logged once with its traceback.

A gateway on the memory registry must be the prefix's only one: gateways of one queue group
each get a share of the registrations and heartbeats, so with registries of their own every
agent would be known to one of them and flap on the others. Before it joins the group,
:meth:`NatsEdge.start` asks the prefix's ``keys`` subject (``PROBE_S``): an answer means
another gateway serves it, and the start is refused (ConfigError: exit 2).

The caller's ``remote`` is ``nats:`` and the reply subject's inbox (``_INBOX.<id>``, one per
connection of nats-py and most clients): what rate limits and audit lines key on, as they key
on the peer address over HTTP. Past ``max_inflight`` requests in hand, a request is answered
503 at once (the caller's next try may find another gateway of the group); for ``send``, past
``max_inflight`` more than ``--max-inflight``, so that the gateway's admission, with its
priority shares (``high`` refused only at 100 %), is what refuses sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats import errors as nats_errors
from nats.aio.msg import Msg

from agent_reach.errors import (
    AgentReachError,
    ConfigError,
    InternalError,
    Overloaded,
    PayloadTooLarge,
)
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller, delivery_refusal, with_ids
from agent_reach.observability.logs import log
from agent_reach.wire.bodies import SendBody, decode, encode
from agent_reach.wire.status import STATUS_HEADER, headers_for, status_for

__all__ = ["OPERATIONS", "NatsEdge"]

# keys (the public JWKS) is beyond the contract: agents that verify deliveries with nothing but
# NATS fetch it there
OPERATIONS = ("register", "heartbeat", "deregister", "send", "keys")
MAX_INFLIGHT = 4096  # requests in hand per operation, past which the answer is 503 at once
PROBE_S = 0.5  # how long a memory-registry gateway waits for another to answer its prefix
_JSON = {"Content-Type": "application/json"}

Answer = tuple[bytes, Mapping[str, str]]


def _render(exc: AgentReachError) -> Answer:
    status = status_for(exc)
    return encode(exc.to_body()), {**_JSON, STATUS_HEADER: str(status), **headers_for(exc)}


def _busy(op: str) -> Answer:
    """The 503 past ``max_inflight``; a send's names ids, as every send's error does: new
    ones, since the request's body is not read (that is what the bound saves)."""
    exc = Overloaded("this gateway has too many NATS requests in hand", retry_after_s=1)
    return _render(with_ids(exc) if op == "send" else exc)


class NatsEdge:
    """The gateway's API over the node's NATS link: :meth:`start`, :meth:`close`."""

    def __init__(self, node: Node, *, max_inflight: int = MAX_INFLIGHT) -> None:
        if node.nats is None:
            raise InternalError("NatsEdge needs a node with a NATS link (--nats)")
        self.node = node
        self.service = node.service
        self.settings = node.settings
        self.link = node.nats.link
        self.prefix = node.settings.nats_prefix
        self.max_inflight = max_inflight
        self._monotonic = node.clock.monotonic
        self._count = node.metrics.nats_api
        self.busy_answers = 0  # answered 503 at once, max_inflight in hand (a metric)
        node.metrics.watch_bound("nats_api_in_hand", lambda: self.busy_answers)
        self._handlers: dict[str, Callable[[Msg, Caller], Awaitable[Any]]] = {
            "register": self._register,
            "heartbeat": self._heartbeat,
            "deregister": self._deregister,
            "send": self._send,
            "keys": self._keys,
        }
        self._responders: list[Any] = []

    def subject(self, op: str) -> str:
        return f"{self.prefix}.v1.{op}"

    def in_hand(self, op: str) -> int:
        """How many requests of ``op`` this edge holds at once before the 503: sends are in
        delivery for as long as an agent takes, up to --max-inflight of them, which admission
        bounds by priority; the edge's own bound comes on top (those being refused meanwhile)."""
        if op == "send":
            return self.max_inflight + self.settings.max_inflight
        return self.max_inflight

    async def start(self) -> None:
        """Serve every operation's subject in the prefix's queue group (BackendUnavailable
        when the link cannot subscribe; ConfigError when the registry is memory:// and another
        gateway already serves the prefix)."""
        await self._alone_on_memory()
        try:
            for op in OPERATIONS:
                responder = await self.link.serve(
                    self.subject(op),
                    self._bind(op),
                    queue=self.prefix,
                    busy=self._counted_busy(op),
                    max_inflight=self.in_hand(op),
                )
                self._responders.append(responder)
        except BaseException:
            await self.close()
            raise
        log(logging.INFO, "nats.api_serving", subjects=f"{self.prefix}.v1.*", queue=self.prefix)

    async def close(self, grace_s: float = 0.0) -> None:
        """Leave the queue group (the other gateways get the requests), give those in hand
        up to ``grace_s`` seconds; idempotent."""
        responders, self._responders = self._responders, []
        # side by side: each leave is a round trip to the server (bounded), then the grace
        await asyncio.gather(*(self.link.unserve(r, grace_s) for r in responders))

    def _counted_busy(self, op: str) -> Callable[[], Answer]:
        def busy() -> Answer:
            self._count.labels(op, "503").inc()
            self.busy_answers += 1
            return _busy(op)

        return busy

    def _bind(self, op: str) -> Callable[[Msg], Awaitable[Answer]]:
        handler = self._handlers[op]

        async def handle(msg: Msg) -> Answer:
            answer = await self._handle(op, handler, msg)
            status = answer[1].get(STATUS_HEADER, "200")
            self._count.labels(op, status).inc()
            return answer

        return handle

    async def _handle(
        self, op: str, handler: Callable[[Msg, Caller], Awaitable[Any]], msg: Msg
    ) -> Answer:
        """One request; every error becomes the contract's error body and its status."""
        received_at = self._monotonic()  # a send's deadline counts from here
        try:
            if len(msg.data) > self.settings.max_body_bytes:
                limit = self.settings.max_body_bytes
                too_large = PayloadTooLarge(f"body over the {limit} byte limit")
                # a send's error names its ids, as every send's answer does (new ones: the body
                # is not read), as the HTTP edge's does; a gateway's delivery is told the loop
                if op == "send":
                    delivery = "x-reach-attempt" in {k.lower() for k in msg.headers or {}}
                    raise with_ids(delivery_refusal() if delivery else too_large)
                raise too_large
            return encode(await handler(msg, self._caller(msg, received_at))), _JSON
        except AgentReachError as exc:
            return _render(exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "nats.unhandled", subject=msg.subject, exc_info=True)
            return _render(InternalError("unexpected error; see gateway log"))

    @staticmethod
    def _caller(msg: Msg, received_at: float) -> Caller:
        headers = {key.lower(): value for key, value in (msg.headers or {}).items()}
        # the reply's inbox: nats-py's _INBOX.<connection>.<request> less the request's token;
        # an older client's one-inbox-per-request _INBOX.<nuid> whole (cut, every such client
        # shared one key, "_INBOX", and one rate limit: a review)
        head = msg.reply.rpartition(".")[0]
        inbox = head if "." in head else msg.reply
        return Caller(
            remote=f"nats:{inbox}",
            authorization=headers.get("authorization"),
            traceparent=headers.get("traceparent"),
            received_at=received_at,
            delivery="x-reach-attempt" in headers,
            # a request carrying them is judged as over HTTP: never forwarded again
            hops=headers.get("x-reach-hops"),
            reach_origin=headers.get("x-reach-origin"),
        )

    # --- handlers: parse, call the service ---------------------------------------------------

    async def _register(self, msg: Msg, caller: Caller) -> Any:
        return await self.service.register(caller, msg.data)

    async def _heartbeat(self, msg: Msg, caller: Caller) -> Any:
        return await self.service.heartbeat(caller, msg.data)

    async def _deregister(self, msg: Msg, caller: Caller) -> Any:
        return await self.service.deregister(caller, msg.data)

    async def _alone_on_memory(self) -> None:
        """Refuse to join the prefix's queue group beside another gateway when this one's
        registry is its own (memory://): the module docstring."""
        nc = self.link.client
        if not self.settings.registry.startswith("memory:") or nc is None:
            return
        try:
            await nc.request(self.subject("keys"), b"", timeout=PROBE_S)
        except (TimeoutError, OSError, nats_errors.Error):  # no responders, or no answer
            return
        raise ConfigError(
            f"another gateway already serves {self.prefix}.v1.* over NATS, and this one's"
            " registry is memory://: gateways of one prefix share its requests, so each needs"
            " the same shared registry (--registry redis://...), or this one another prefix"
            " (--nats-prefix)",
            source="--nats-prefix",
        )

    async def _keys(self, msg: Msg, caller: Caller) -> Any:
        return self.service.keys(caller)  # as GET /v1/keys (empty in open mode)

    async def _send(self, msg: Msg, caller: Caller) -> Any:
        try:
            body = decode(msg.data, SendBody)
        except AgentReachError as exc:
            # a gateway's delivery (X-Reach-Attempt) need not decode as a send: the loop is
            # what to say, as over HTTP
            raise with_ids(delivery_refusal() if caller.delivery else exc) from None
        return await self.service.send(caller, body)
