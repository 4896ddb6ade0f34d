"""The only time source of Agent-Reach.

Everything that needs time takes a :class:`Clock`, so tests can drive time with
:class:`agent_reach.testing.FakeClock` instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Monotonic time for durations, wall time for display, and a sleep that honours both."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines and liveness)."""
        ...

    def wall(self) -> float:
        """Unix seconds, only for showing people when something happened."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time` and :func:`asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
