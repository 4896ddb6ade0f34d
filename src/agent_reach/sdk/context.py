"""What a handler is given besides its payload (:class:`ReachContext`), and how it refuses
a request on purpose (:class:`Reject`)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_reach.errors import AgentReachError, DeadlineExceeded
from agent_reach.sdk._wire import EMPTY
from agent_reach.wire.ids import new_id

if TYPE_CHECKING:
    from agent_reach.observability.spans import HandleSpan
    from agent_reach.sdk.agent import Agent
    from agent_reach.wire.answers import Reply

# kept back from an onward reach's deadline: time to build this agent's own answer and send it
ONWARD_MARGIN_MS = 50.0

__all__ = ["Match", "ReachContext", "Reject"]


@dataclass(frozen=True, slots=True)
class Match:
    """How the gateway matched the request to this agent's tag (``X-Reach-Match``)."""

    method: str  # exact, alias, semantic, lexical, hint
    confidence: float

    @classmethod
    def parse(cls, header: str | None) -> Match | None:
        """``METHOD;confidence=0.93``; None for a missing or unreadable header."""
        if not header:
            return None
        method, _, rest = header.partition(";")
        key, _, value = rest.partition("=")
        method = method.strip()
        if not method.isascii() or not method.isalpha() or key.strip() != "confidence":
            return None
        try:
            confidence = float(value)
        except ValueError:
            return None
        if not 0.0 <= confidence <= 1.0:
            return None
        return cls(method.lower(), confidence)


@dataclass(frozen=True, slots=True)
class ReachContext:
    """The request as the agent received it, for one handler call.

    ``attempt`` is the gateway's ``X-Reach-Attempt`` (1 for the first delivery). The deadline
    is taken from ``X-Reach-Deadline-Ms`` when the delivery arrived: ``deadline_ms`` is the
    header's value (None without one), ``deadline_at`` the :func:`time.monotonic` time it
    runs out, and :meth:`remaining_s` / :meth:`remaining_ms` what is left of it now. Work past
    the deadline is wasted: the gateway has stopped waiting for this attempt. ``traceparent`` is
    the W3C header the delivery carried (None without a valid one). ``verified`` is True when
    the agent verifies deliveries (token mode): then ``sender``, ``intent`` and the payload are
    what the gateway signed, not merely what the network brought.

    ``intent`` is the tag this agent declared, the one the handler was chosen by; how the
    gateway matched the caller's request to it is ``match`` (``X-Reach-Match``: method
    ``exact``, ``alias``, ``semantic``, ``lexical`` or ``hint``, and its confidence), and what the
    caller asked is ``requested_intent`` and ``intent_text`` (None when it sent none).
    """

    msg_id: str
    trace_id: str
    intent: str
    sender: str | None
    priority: str
    attempt: int
    deadline_ms: int | None
    deadline_at: float | None
    endpoint_id: str = ""
    traceparent: str | None = None
    verified: bool = False
    match: Match | None = None
    requested_intent: str | None = None
    intent_text: str | None = None
    origin: str | None = None
    # the agent that received the request, for helpers built on it (agent-to-agent reach)
    _agent: Agent | None = field(default=None, repr=False, compare=False)
    # the delivery's OpenTelemetry span (None while export is off): onward reaches are its children
    _span: HandleSpan | None = field(default=None, repr=False, compare=False)

    def remaining_s(self) -> float:
        """Seconds left before the deadline (never negative; ``math.inf`` without one)."""
        if self.deadline_at is None:
            return math.inf
        return max(0.0, self.deadline_at - time.monotonic())

    def remaining_ms(self) -> float:
        """Milliseconds left before the deadline (never negative; ``math.inf`` without one)."""
        return self.remaining_s() * 1000.0

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return self.remaining_s() <= 0.0

    async def reach(self, intent: str, payload: Any = EMPTY, **options: Any) -> Reply:
        """Reach another agent through the gateway on behalf of this request (async handlers).

        The onward request carries this request's ``trace_id`` (one trace across the hops), a
        ``traceparent`` (the ``agent_reach.reach`` span's while OpenTelemetry export is on, else
        the one this delivery carried) and this agent as ``sender``, and its ``timeout_ms`` is
        cut to what is left of this request's deadline, less ``ONWARD_MARGIN_MS`` for
        answering: a hop never outlives the request it serves. Other options as
        :meth:`ReachClient.send`; raises its typed errors, or ``DeadlineExceeded`` at once when
        no time is left.
        """
        if self._agent is None:
            raise RuntimeError("this context belongs to no running agent")
        options.setdefault("trace_id", self.trace_id)
        if options.get("msg_id") is None:  # named by a DeadlineExceeded below
            options["msg_id"] = new_id("msg")
        left = self.remaining_ms() - ONWARD_MARGIN_MS
        if left != math.inf:
            if left < 1:
                raise DeadlineExceeded(
                    f"no time left for an onward reach of {intent!r}",
                    trace_id=options["trace_id"],
                    attempts=[],
                )
            wanted = options.get("timeout_ms")
            options["timeout_ms"] = int(left if wanted is None else min(wanted, left))
        if self._span is None:
            options.setdefault("traceparent", self.traceparent)
            return await self._within_deadline(intent, payload, options)
        span = self._span.reach(intent, options["trace_id"])
        options.setdefault("traceparent", span.traceparent)
        try:
            reply = await self._within_deadline(intent, payload, options)
        except AgentReachError as exc:
            span.end(exc.code, detail=exc.detail)
            raise
        except BaseException as exc:  # cancelled, or a bug: the span still ends
            span.end(type(exc).__name__)
            raise
        span.end("ok", reply.endpoint_id)
        return reply

    async def _within_deadline(self, intent: str, payload: Any, options: dict[str, Any]) -> Reply:
        """The onward send, given no longer than this request's deadline: the client allows
        the network a second past the onward ``timeout_ms``, which a stalled gateway would
        take from the request this hop serves."""
        assert self._agent is not None
        left_s = self.remaining_s()
        if left_s == math.inf:
            return await self._agent.reach(intent, payload, **options)
        try:
            async with asyncio.timeout(left_s) as scope:
                return await self._agent.reach(intent, payload, **options)
        except TimeoutError:
            if not scope.expired():
                raise
            raise DeadlineExceeded(
                f"no answer to an onward reach of {intent!r} before this request's deadline",
                msg_id=options["msg_id"],
                trace_id=options["trace_id"],
                attempts=[],
            ) from None

    def reach_sync(self, intent: str, payload: Any = EMPTY, **options: Any) -> Reply:
        """:meth:`reach` for sync handlers (which run on the agent's worker threads): blocks
        the worker, not the agent's event loop."""
        if self._agent is None:
            raise RuntimeError("this context belongs to no running agent")
        reply: Reply = self._agent.reach_blocking(self.reach(intent, payload, **options))
        return reply


class Reject(Exception):
    """Raise in a handler to refuse a request: a 4xx answer, which the gateway does not retry.

    The answer is ``{"ok": false, "error": code, "detail": detail}`` with HTTP ``status``
    (400-499); the caller gets ``agent_error`` (502) with that answer. A rejection is final for
    its ``msg_id``: a repeated delivery gets the same answer without running the handler again.
    """

    def __init__(self, detail: str, status: int = 400, code: str = "rejected") -> None:
        if not 400 <= status < 500:
            raise ValueError("Reject status must be 4xx")
        super().__init__(detail)
        self.detail, self.status, self.code = detail, status, code
