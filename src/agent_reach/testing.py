"""Fakes shipped for tests, ours and users': a clock that moves only when told."""

from __future__ import annotations

import asyncio

__all__ = ["FakeClock"]


class FakeClock:
    """A :class:`agent_reach.clock.Clock` whose time moves only by :meth:`advance` or sleep.

    ``sleep`` advances the clock at once and yields to the event loop, so a retry loop that
    waits 2 s runs in microseconds while seeing 2 s pass.
    """

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self.now = start
        self._wall_offset = wall_offset
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.slept.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)
