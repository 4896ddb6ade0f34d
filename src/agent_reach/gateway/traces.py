"""A bounded in-memory store of recent requests' events, by trace id.

Oldest traces are dropped first once ``capacity`` traces are held; one trace keeps at most
``max_events`` events, so a trace id reused forever cannot grow without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["TraceStore"]


class TraceStore:
    """Recent events by trace id, least recently written dropped first."""

    def __init__(self, capacity: int = 10_000, max_events: int = 256) -> None:
        self.capacity = capacity
        self.max_events = max_events
        self._traces: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def add(self, trace_id: str, ts: float, kind: str, **data: Any) -> None:
        """Append one event (``ts`` is unix seconds)."""
        events = self._traces.get(trace_id)
        if events is None:
            events = self._traces[trace_id] = []
            if len(self._traces) > self.capacity:
                self._traces.popitem(last=False)
        else:
            self._traces.move_to_end(trace_id)
        if len(events) < self.max_events:
            events.append({"ts": round(ts, 6), "kind": kind, **data})

    def get(self, trace_id: str) -> list[dict[str, Any]] | None:
        """The events of ``trace_id`` in order, or None when it is not (or no longer) held."""
        events = self._traces.get(trace_id)
        return None if events is None else list(events)

    def __len__(self) -> int:
        return len(self._traces)
