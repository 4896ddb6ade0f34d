"""A bounded in-memory store of recent requests: their events by trace id, and a summary list.

Invariants:
- Oldest traces are dropped first once ``capacity`` traces are held, or once they hold
  ``max_total`` events in all; one trace keeps at most ``max_events`` events, so a trace id
  reused forever cannot grow without bound. The count of events is what bounds the memory:
  what one event holds is bounded where it is made (the caller's words cut to
  :data:`TEXT_KEPT` characters), so a caller filling every trace to ``max_events`` holds
  ``max_total`` events, not ``capacity`` times ``max_events`` (2.5 million).
- Each event keeps the :data:`Reader` of the request it belongs to (its sender, and the
  domain that forwarded it): several requests may share a trace id (callers choose them,
  onward reaches carry their caller's), and who may read an event is decided per request
  (:meth:`TraceStore.get`'s ``may``), never by whoever used the id first.
- The events are kept out of the cyclic garbage collector's view: a full store is ~50,000
  events, and a collection walks every object it tracks (docs/reliability.md, F20). A trace
  is one flat list ``[ts, kind, data, reader, ts, kind, ...]``, not a list of tuples (a tuple
  holding a dict stays tracked); ``data`` is the caller's dict when it holds only plain values
  (the interpreter leaves such a dict untracked), else its JSON as ``bytes``, decoded when
  read. What the store adds to the collector's work is one list a trace.
- One summary per answered ``/v1/send`` (success or error) is kept in a ring of the
  ``recent_capacity`` most recent, independently of the events: a summary may outlive its
  trace's events (``GET /v1/traces/ID`` then answers 404), and several summaries may share one
  trace id (onward reaches carry their caller's).
"""

from __future__ import annotations

import gc
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec

from agent_reach.core.rounding import round3, round6
from agent_reach.wire.answers import Attempt

__all__ = ["NO_READER", "Reader", "RequestSummary", "TraceStore"]

RECENT_CAPACITY = 1000  # request summaries kept for GET /v1/traces
MAX_TOTAL_EVENTS = 100_000  # events of all traces held at once (~1 KB each, typically)
TEXT_KEPT = 256  # characters of a caller's words (intent_text) or an error's detail kept

_EMPTY: dict[str, Any] = {}  # an event without fields (never changed: events are read-only)
_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _as_json(data: dict[str, Any]) -> bytes | dict[str, Any]:
    """``data``'s JSON, or ``data`` itself when it is not JSON (then tracked: never an error)."""
    try:
        return _encode(data)
    except (TypeError, ValueError):
        return data


Reader = tuple[str | None, str | None]
"""Whose request an event belongs to: (its sender, the domain that forwarded it)."""
NO_READER: Reader = (None, None)


class RequestSummary(NamedTuple):  # a tuple: made on every request, far cheaper than a dataclass
    """One answered request, as listed by ``GET /v1/traces``."""

    ts: float  # unix seconds when it was answered
    trace_id: str
    msg_id: str
    intent: str
    outcome: str  # "ok" or the error code
    endpoint_id: str | None  # the endpoint of the last attempt (None when nothing was delivered)
    latency_ms: float
    attempts: int

    def to_body(self) -> dict[str, Any]:
        """The listing's JSON object."""
        return {
            "trace_id": self.trace_id,
            "msg_id": self.msg_id,
            "intent": self.intent,
            "outcome": self.outcome,
            "endpoint_id": self.endpoint_id,
            "latency_ms": round3(self.latency_ms),
            "attempts": self.attempts,
            "ts": round6(self.ts),
        }


class TraceStore:
    """Recent events by trace id (least recently written dropped first), and request summaries."""

    def __init__(
        self,
        capacity: int = 10_000,
        max_events: int = 256,
        recent_capacity: int = RECENT_CAPACITY,
        max_total: int = MAX_TOTAL_EVENTS,
    ) -> None:
        self.capacity = capacity
        self.max_events = max_events
        self.max_total = max_total
        self.total = 0  # events held, over every trace
        # a trace's events, 4 items each (ts, kind, data, reader): made a dict only when read
        # (this runs several times on every request), and never a tuple (see the invariants)
        self._traces: OrderedDict[str, list[Any]] = OrderedDict()
        self._recent: deque[RequestSummary] = deque(maxlen=recent_capacity)
        self.evicted = 0  # traces dropped to keep capacity or max_total (a metric)
        self.events_dropped = 0  # events not kept, their trace at max_events (a metric)

    def add(
        self,
        trace_id: str,
        ts: float,
        kind: str,
        data: dict[str, Any] | None = None,
        reader: Reader = NO_READER,
    ) -> None:
        """Append one event (``ts`` is unix seconds; ``data``, its fields, is kept as given:
        the caller's own dict, a ``**kwargs`` of its, not copied again, unless it holds a
        container: then as its JSON, so later changes to it are not seen) of the request of
        ``reader``."""
        traces = self._traces
        events = traces.get(trace_id)
        if events is None:
            events = traces[trace_id] = []
            if len(traces) > self.capacity:
                self.total -= len(traces.popitem(last=False)[1]) >> 2
                self.evicted += 1
        else:
            traces.move_to_end(trace_id)
        if len(events) < self.max_events << 2:
            kept: bytes | dict[str, Any]
            if data is None:
                kept = _EMPTY
            elif gc.is_tracked(data):  # it holds a list or a dict: kept as bytes, untracked
                kept = _as_json(data)
            else:
                kept = data
            events += (ts, kind, kept, reader)
            self.total += 1
            while self.total > self.max_total and len(traces) > 1:  # never the one written
                self.total -= len(traces.popitem(last=False)[1]) >> 2
                self.evicted += 1
        else:
            self.events_dropped += 1

    def get(
        self, trace_id: str, may: Callable[[Reader], bool] | None = None
    ) -> list[dict[str, Any]] | None:
        """The events of ``trace_id`` in order (``ts`` to the microsecond, ``kind``, then the
        event's fields), those of requests whose reader ``may`` accepts (None: all), or None
        when it is not (or no longer) held."""
        events = self._traces.get(trace_id)
        if events is None:
            return None
        out: list[dict[str, Any]] = []
        for i in range(0, len(events), 4):
            ts, kind, data, reader = events[i : i + 4]
            if may is None or may(reader):
                fields = _decode(data) if type(data) is bytes else data
                out.append({"ts": round6(ts), "kind": kind, **fields})
        return out

    def request_done(
        self,
        ts: float,
        trace_id: str,
        msg_id: str,
        intent: str,
        outcome: str,
        attempts: Sequence[Attempt],
        latency_ms: float,
    ) -> None:
        """Keep the summary of a request just answered (``outcome``: "ok" or the error code)."""
        self._recent.append(
            RequestSummary(  # positional, not rounded: this runs on every request
                ts,
                trace_id,
                msg_id,
                intent,
                outcome,
                attempts[-1].endpoint_id if attempts else None,
                latency_ms,
                len(attempts),
            )
        )

    def recent(
        self, intent: str | None = None, outcome: str | None = None, limit: int = 50
    ) -> list[RequestSummary]:
        """The most recently answered requests first, filtered, at most ``limit`` of them."""
        out: list[RequestSummary] = []
        if limit <= 0:
            return out
        for summary in reversed(self._recent):
            if intent is not None and summary.intent != intent:
                continue
            if outcome is not None and summary.outcome != outcome:
                continue
            out.append(summary)
            if len(out) >= limit:
                break
        return out

    def __len__(self) -> int:
        return len(self._traces)
