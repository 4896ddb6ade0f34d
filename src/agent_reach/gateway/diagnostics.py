"""What a gateway remembers for ``GET /v1/diagnostics`` (an extension beyond the v1 contract).

The metrics count refused requests under the one label ``_unroutable``, on purpose: callers must
not grow the metrics' label set at will. :class:`UnroutedIntents` keeps the intents themselves,
for people and for ``agent-reach doctor``, in a structure that callers cannot grow either.

Invariants:
- At most ``capacity`` distinct intents are kept; a new one past that evicts the one refused
  longest ago (least recently), so memory is bounded whatever tags callers send.
- Only what the caller hands in is recorded: the service calls :meth:`UnroutedIntents.note` for a
  ``/v1/send`` refused with ``no_capable_agent`` (a tag checked at the HTTP edge), never for a
  dry run, a recipient-hint refusal or an invalid tag.
- Nothing here runs on a routed request; a refusal costs one dict look-up and a move to the end.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["UNROUTED_CAPACITY", "UnroutedIntents"]

UNROUTED_CAPACITY = 100
"""Distinct unrouted intents a gateway remembers (the most recently refused ones)."""


class _Tally:
    __slots__ = ("count", "last_at")

    def __init__(self, last_at: float) -> None:
        self.count = 1
        self.last_at = last_at


class UnroutedIntents:
    """Intents refused with ``no_capable_agent``: count and last time, the most recent kept."""

    def __init__(self, capacity: int = UNROUTED_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._tallies: OrderedDict[str, _Tally] = OrderedDict()  # least recently refused first
        self.evicted = 0  # intents dropped to keep capacity (a metric)

    def __len__(self) -> int:
        return len(self._tallies)

    def note(self, intent: str, at: float) -> None:
        """Count one refusal of ``intent`` at ``at`` (unix seconds)."""
        tally = self._tallies.get(intent)
        if tally is None:
            if len(self._tallies) >= self.capacity:
                self._tallies.popitem(last=False)
                self.evicted += 1
            self._tallies[intent] = _Tally(at)
            return
        tally.count += 1
        tally.last_at = at
        self._tallies.move_to_end(intent)

    def to_list(self) -> list[dict[str, Any]]:
        """``[{"intent", "count", "last_at"}, ...]``, the most recently refused first."""
        return [
            {"intent": intent, "count": t.count, "last_at": round(t.last_at, 3)}
            for intent, t in reversed(self._tallies.items())
        ]
