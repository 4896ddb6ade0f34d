"""NATS transport: a delivery is a NATS request to the subject of a ``nats:SUBJECT`` endpoint URL.

The wire (docs: CONTRACT.md, "NATS transport"): the request carries the same JSON body as over
HTTP and the same ``X-Reach-*`` headers (and ``traceparent``) as NATS headers; the reply's body
is the answer, its header ``Reach-Status`` the HTTP status (absent: 200), so outcomes are
those of HTTP. "No responders" is a refused connection.

Invariants:
- Every answer, good or bad, is a :class:`Delivery`; no nats-py exception leaves
  :meth:`NatsTransport.deliver`, which waits at most the attempt's timeout (never nats-py's
  0.5 s default).
- The connection is a :class:`~agent_reach.transport.natslink.NatsLink` (a bounded first
  connect, then kept for good), shared with the gateway's NATS edge (``link``).
- While the link is down a delivery is ``connect_error``, not reached, not ejected: the
  gateway's link is at fault, not the agent. A request is never queued for a link to come.
- Only subjects an agent may own are delivered to: no wildcards, nothing under ``$`` (the
  server's and JetStream's APIs: ``$JS.API.STREAM.DELETE.X`` would run with the gateway's
  rights), ``_INBOX`` (other requesters' replies) or a reserved prefix (the gateway's own API).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence

from nats import errors as nats_errors
from nats.aio.msg import Msg

from agent_reach.clock import Clock
from agent_reach.core.model import Outcome
from agent_reach.errors import InternalError
from agent_reach.transport.base import Delivery, agent_answer
from agent_reach.transport.natslink import LINK_LOST, NatsLink, NatsState, wire_size
from agent_reach.wire.status import STATUS_HEADER, reach_status

__all__ = ["NatsState", "NatsTransport", "subject_refusal"]

MAX_SUBJECT = 256
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
        self.link = NatsLink(
            servers,
            connect_timeout_s=connect_timeout_s,
            reconnect_wait_s=reconnect_wait_s,
            ping_interval_s=ping_interval_s,
            name=name,
            clock=clock,
        )
        self.servers = self.link.servers
        self.max_response_bytes = max_response_bytes
        self.reserved = tuple(reserved)
        self._refusals: dict[str, str | None] = {}  # url -> subject_refusal(url)

    # --- the link (shared with the gateway's NATS edge) ------------------------------------

    async def start(self) -> None:
        """Connect; idempotent. Raises :class:`BackendUnavailable` when no server of
        ``servers`` takes the connection within ``connect_timeout_s``."""
        await self.link.start()

    async def close(self) -> None:
        """Close the link (and stop replacing it); idempotent. A closed transport may be
        started again."""
        await self.link.close()

    def state(self) -> NatsState:
        """The link's state: :meth:`NatsLink.state`."""
        return self.link.state()

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
        if not self.link.started:
            raise InternalError("NatsTransport.deliver() before start()")
        refusal = self.refusal(url)
        if refusal is not None:
            return Delivery(
                Outcome.CONNECT_ERROR, detail=f"not delivered: {refusal}", reached=False, eject=True
            )
        nc = self.link.client
        if nc is None or not nc.is_connected:
            # the gateway's link is down, not the agent: not ejected (every NATS agent would be)
            why = self.link.last_error or "down"
            return _unlinked(f"not delivered: no NATS connection ({why})")
        size = wire_size(body, headers)  # the body and its headers, as the server counts
        if size > nc.max_payload:
            return _unlinked(f"request of {size} bytes over NATS max_payload {nc.max_payload}")
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
        except LINK_LOST as exc:
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
        status = reach_status(raw)
        if status is None:
            return Delivery(
                Outcome.AGENT_ERROR,
                detail=f"agent answered with {STATUS_HEADER} {raw!r}, not an HTTP status",
            )
        encoding = got.get("content-encoding", "identity")
        return agent_answer(status, data, encoding, got.get("server-timing"))


def _unlinked(detail: str) -> Delivery:
    """Nothing went out: the link (or the request) is the gateway's problem, not the agent's,
    so the endpoint is neither ejected nor penalized (``blameless``)."""
    return Delivery(Outcome.CONNECT_ERROR, detail=detail, reached=False, blameless=True)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """Reply headers by lower-case name (NATS keeps the case an agent wrote)."""
    return {key.lower(): value for key, value in (headers or {}).items()}
