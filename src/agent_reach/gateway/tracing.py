"""A send's trace at its start: the trace id (from the body, the W3C traceparent, or new),
the traceparent its deliveries carry, and the OpenTelemetry server span (None while export is
off; :mod:`agent_reach.observability.otel` says when it is on)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_reach.errors import AgentReachError
from agent_reach.observability.tracecontext import new_span_id, onward, parse_traceparent
from agent_reach.wire.answers import Attempt
from agent_reach.wire.bodies import SendBody
from agent_reach.wire.ids import new_id

if TYPE_CHECKING:
    from agent_reach.observability.spans import GatewayTracer, ReceiveSpan

__all__ = ["OpenTrace", "open_trace", "span_answer"]


@dataclass(slots=True)
class OpenTrace:
    """A request's trace as opened at its start: its id (bound for the whole request), the
    traceparent its deliveries carry while OpenTelemetry is off, and its server span (None
    while off). ``done`` once the answer is recorded."""

    trace_id: str
    parent: str
    span: ReceiveSpan | None
    timeout_ms: int
    done: bool = False

    def refused(self, exc: AgentReachError) -> None:
        """End the span of a request refused before delivery began (access, rate limits)."""
        if self.done:
            return
        self.done = True
        if self.span is not None:
            self.span.answered(exc.code, span_answer(self.trace_id, None, []), exc.detail)
            self.span.end()


def open_trace(
    otel: GatewayTracer | None,
    body: SendBody,
    msg_id: str,
    timeout_ms: int,
    traceparent: str | None,
) -> OpenTrace:
    """The request's trace, opened before anything else runs (the service binds its id).

    The rules (observability.tracecontext): the body's trace_id wins, else the traceparent's
    trace-id, else a new one; an invalid traceparent is ignored. With OpenTelemetry on and
    no trace id given, the new server span's trace-id names the trace.
    """
    received = parse_traceparent(traceparent)
    trace_id = body.trace_id or (received.trace_id if received is not None else None)
    if otel is None:
        if trace_id is None:  # new_id's form, its random hex the trace-id sent on
            trace_hex = os.urandom(16).hex()
            parent = f"00-{trace_hex}-{new_span_id()}-01"
            return OpenTrace(f"trace_{trace_hex}", parent, None, timeout_ms)
        return OpenTrace(trace_id, onward(trace_id, received), None, timeout_ms)
    span = otel.receive(
        received,
        trace_id,
        {
            "agent_reach.msg_id": msg_id,
            "agent_reach.intent": body.intent,
            "agent_reach.sender": body.sender,
            "agent_reach.recipient_hint": body.recipient_hint,
            "agent_reach.priority": body.priority,
            "agent_reach.timeout_ms": timeout_ms,
        },
    )
    if trace_id is None:  # the new trace's id, so that both names of the trace agree
        new_hex = span.trace_hex
        trace_id = f"trace_{new_hex}" if new_hex else new_id("trace")
    return OpenTrace(trace_id, "", span, timeout_ms)


def span_answer(trace_id: str, endpoint_id: str | None, attempts: list[Attempt]) -> dict[str, Any]:
    """The attributes of a server span's answer."""
    return {
        "agent_reach.trace_id": trace_id,
        "agent_reach.endpoint_id": endpoint_id,
        "agent_reach.attempts": len(attempts),
    }
