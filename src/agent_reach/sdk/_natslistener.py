"""Serving an agent's deliveries over NATS: :class:`NatsListener`, and the agent's subject.

The agent opens no port: it answers NATS requests to its subject (CONTRACT.md v1.1, "NATS
transport"), one member of the queue group named by its endpoint id, so that replicas of one
agent (same id, same subject) share its deliveries. Each request goes through the same
:meth:`~agent_reach.sdk._delivery.Dispatcher.deliver` as over HTTP (context, dedup by
``msg_id``, the error table); only reading the request and writing the reply live here.

Invariants:
- The reply's body is the answer's JSON; its headers are ``Content-Type: application/json``,
  ``Reach-Status`` when the status is not 200, ``Server-Timing`` when the answer has one, and
  never ``Status`` (nats-py reads ``Status: 503`` as "no responders").
- Past ``max_inflight`` deliveries in hand, a request is answered at once with 503
  ``backend_unavailable`` (the gateway retries elsewhere), never queued behind the others.
- A body over ``max_body_bytes`` is answered 413 without being parsed, as over HTTP.
- Replicas share one registration: an agent that stops leaves its queue group first, and
  deregisters only when no other member answers a presence probe then (a request to the
  subject with the header ``Reach-Presence``, answered by a listener without a handler, made
  once this member is out of the group); otherwise the id stays registered, heartbeated by the
  others. Deregistering the id while replicas serve it would leave them out of routing until
  their next heartbeat.
- The default subject is ``agents.<NAME>`` with every character that is not valid in a NATS
  token mapped injectively (two endpoint ids never share a subject, :func:`agent_subject`).
- The link is this module's own :class:`~agent_reach.transport.natslink.NatsLink`, on the
  agent's event loop; the heartbeat line reaches the gateway on a link of its own, made on its
  own thread (:mod:`._lifeline`), so that blocked handlers cannot delay it.

This module imports nats-py: :mod:`agent_reach.sdk.agent` imports it only for an agent that
serves over NATS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from nats import errors as nats_errors
from nats.aio.msg import Msg

from agent_reach.errors import InternalError
from agent_reach.observability.logs import log
from agent_reach.sdk._delivery import Answer, Dispatcher, from_error, too_large
from agent_reach.settings import DEFAULT_NATS_PREFIX
from agent_reach.transport.nats import subject_refusal
from agent_reach.transport.natslink import Answer as Reply
from agent_reach.transport.natslink import NatsLink, NatsState, Responder, check_server
from agent_reach.wire.status import STATUS_HEADER

__all__ = [
    "PRESENCE_HEADER",
    "SUBJECT_ROOT",
    "NatsListener",
    "agent_subject",
    "check_servers",
    "check_subject",
    "render",
]

SUBJECT_ROOT = "agents"  # default subjects: agents.<NAME>
PRESENCE_HEADER = "Reach-Presence"  # a request asking "does a member still serve this?"
PROBE_S = 0.5  # how long leave() waits for another member's answer
# NAME is [a-z0-9._-]: "." separates NATS tokens, and is the only character to map. "~" is
# not in NAME's alphabet, so the mapping is one to one (with "_" agent://a.b and agent://a_b
# would share a subject, and each would get the other's deliveries)
_TOKEN_MAP = str.maketrans({".": "~"})
# the gateway's own API is under its --nats-prefix (GatewaySettings' default, this one): refused
# at once here; under another prefix the gateway refuses the registration (422)
_RESERVED = (DEFAULT_NATS_PREFIX,)


def agent_subject(endpoint_id: str) -> str:
    """The default subject of ``agent://NAME``: ``agents.NAME`` with ``.`` mapped to ``~``
    (``agent://weather.cn-01`` -> ``agents.weather~cn-01``): always two tokens, so
    ``agents.*`` is every agent."""
    name = endpoint_id.removeprefix("agent://")
    return f"{SUBJECT_ROOT}.{name.translate(_TOKEN_MAP)}"


def check_subject(subject: str) -> str:
    """``subject`` if an agent may serve on it, else ValueError saying why
    (:func:`~agent_reach.transport.nats.subject_refusal`, with the gateway's default prefix
    reserved)."""
    refusal = subject_refusal(f"nats:{subject}", _RESERVED)
    if refusal is not None:
        raise ValueError(f"subject {subject!r} cannot be served: {refusal}")
    return subject


def check_servers(servers: Sequence[str]) -> tuple[str, ...]:
    """The NATS server URLs, each checked (ConfigError for an unusable one)."""
    return tuple(check_server(url) for url in servers)


def render(answer: Answer) -> Reply:
    """The NATS reply of a delivery's answer: its body and headers."""
    headers = {"Content-Type": "application/json"}
    if answer.status != 200:
        headers[STATUS_HEADER] = str(answer.status)
    timing = answer.server_timing()
    if timing is not None:
        headers["Server-Timing"] = timing
    return answer.body, headers


class NatsListener:
    """Deliveries to ``subject``, in the queue group ``queue``, answered by ``dispatcher``.

    :meth:`start` connects (bounded: BackendUnavailable when no server takes the connection
    within ``connect_timeout_s``) and subscribes; :meth:`leave` leaves the queue group, gives
    deliveries in hand a grace period and says whether replicas remain; :meth:`stop` closes
    the link.
    """

    def __init__(
        self,
        servers: Sequence[str],
        subject: str,
        *,
        queue: str,
        dispatcher: Dispatcher,
        max_body_bytes: int,
        max_inflight: int,
        connect_timeout_s: float = 2.0,
    ) -> None:
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        self.subject = subject
        self.queue = queue
        self.dispatcher = dispatcher
        self.max_body_bytes = max_body_bytes
        self.max_inflight = max_inflight
        self.link = NatsLink(
            list(servers), connect_timeout_s=connect_timeout_s, name=f"agent-reach {queue}"
        )
        self._responder: Responder | None = None

    async def start(self) -> None:
        """Connect and serve ``subject``; BackendUnavailable when NATS cannot be reached."""
        await self.link.start()
        try:
            self._responder = await self.link.serve(
                self.subject,
                self._handle,
                queue=self.queue,
                busy=self._busy,
                max_inflight=self.max_inflight,
            )
        except BaseException:
            await self.link.close()
            raise
        log(
            logging.INFO,
            "agent.nats_serving",
            subject=self.subject,
            queue=self.queue,
            server=self.link.state().server,
        )

    async def leave(self, grace_s: float) -> bool:
        """Leave the queue group (its other members take the new requests), let deliveries in
        hand finish within ``grace_s`` seconds and cancel the rest; then say whether another
        member still serves the subject (a replica): False when none answers a presence probe
        within ``PROBE_S``, or the link is down. Idempotent (False once left)."""
        responder, self._responder = self._responder, None
        if responder is None:
            return False
        await self.link.unserve(responder, grace_s)
        nc = self.link.client
        if nc is None or not nc.is_connected:
            return False
        try:
            await nc.request(self.subject, b"", timeout=PROBE_S, headers={PRESENCE_HEADER: "1"})
        except (TimeoutError, OSError, nats_errors.Error):  # no responders, or no answer
            return False
        return True

    async def stop(self) -> None:
        """Leave the queue group (at once, if :meth:`leave` was not called) and close the
        link; idempotent."""
        await self.leave(0.0)
        await self.link.close()

    def state(self) -> NatsState:
        """The link's state (connected, server, reconnects, last error, slow consumers)."""
        return self.link.state()

    async def _handle(self, msg: Msg) -> Reply:
        if msg.headers and PRESENCE_HEADER in msg.headers:  # a replica leaving: "still here"
            return b'{"ok":true}', {"Content-Type": "application/json"}
        if len(msg.data) > self.max_body_bytes:
            return render(too_large(self.max_body_bytes))
        # the Dispatcher looks headers up by lower-case name; NATS keeps the sender's case
        headers: Mapping[str, str] = {k.lower(): v for k, v in (msg.headers or {}).items()}
        try:
            answer = await self.dispatcher.deliver(msg.data, headers)
        except asyncio.CancelledError:
            raise
        except Exception:  # the Dispatcher answers every error itself: this is a bug of ours
            log(logging.ERROR, "agent.delivery_crashed", subject=msg.subject, exc_info=True)
            answer = from_error(InternalError("the agent failed to answer; see its log"))
        return render(answer)

    def _busy(self) -> Reply:
        # counted and logged with the dispatcher's own refusals: one count of them all
        detail = f"{self.queue} has {self.max_inflight} deliveries in hand"
        return render(self.dispatcher.refuse(detail, self.max_inflight, subject=self.subject))
