"""The pauses of Python's cyclic garbage collector, timed by ``gc.callbacks``.

A collection stops every thread of the process, the event loop too, for as long as it walks the
objects of the generations it collects: in a gateway whose trace store was full of tracked
objects that was 47-77 ms a full collection, the longest hold of the loop a hostile scenario
showed (docs/reliability.md, F20). prometheus_client's ``python_gc_*`` count collections but do
not time them; this does, as ``agent_reach_gc_pause_seconds`` (docs/operations.md).

Invariants:
- The callback takes no lock: it runs inside a collection, in whichever thread triggered it,
  perhaps one holding a metrics lock (the scrape's worker), so it only adds to plain lists.
  Two collections never overlap (the interpreter runs one at a time), so the start it keeps
  is its own collection's.
- A reader copies the figures (:meth:`GcPauses.snapshot`); the lists only grow by ``+=``.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any, NamedTuple

__all__ = ["GC_PAUSE_BUCKETS", "GcPauseSnapshot", "GcPauses"]

GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
"""Upper bounds (seconds) of the histogram's buckets; +Inf after them."""

GENERATIONS = 3


class GcPauseSnapshot(NamedTuple):
    """The pauses so far, by generation: counts per bucket (not cumulative, +Inf last), sums."""

    counts: tuple[tuple[int, ...], ...]
    sums: tuple[float, ...]


class GcPauses:
    """Times each collection of the process while installed (:meth:`installed`)."""

    def __init__(self, clock: Callable[[], float] = perf_counter) -> None:
        self._clock = clock
        self._started = 0.0
        self._counts = [[0] * (len(GC_PAUSE_BUCKETS) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry: ``phase`` is "start" or "stop"."""
        if phase == "start":
            self._started = self._clock()
            return
        took = self._clock() - self._started
        generation = info["generation"]
        self._counts[generation][bisect_left(GC_PAUSE_BUCKETS, took)] += 1  # took <= bound
        self._sums[generation] += took

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Every collection inside is timed (the callback is removed on the way out)."""
        gc.callbacks.append(self.on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self.on_gc)

    def snapshot(self) -> GcPauseSnapshot:
        return GcPauseSnapshot(tuple(tuple(c) for c in self._counts), tuple(self._sums))
