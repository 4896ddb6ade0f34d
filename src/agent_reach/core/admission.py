"""Admission: how many requests a gateway takes into delivery at once, and who is refused first
(CONTRACT.md v1.1, "Overload and priority"). Pure: counts in, a decision out.

Past ``max_inflight`` requests in delivery a new one is refused at once (503 ``overloaded``
with ``Retry-After``; nothing is delivered), and ``priority`` decides who is refused first:
``low`` past 70 % of the bound, ``normal`` past 90 %, ``high`` only at 100 %. The shares keep
room for the priorities above them: under a flood of low-priority work, normal and high
requests still get in.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SHARES", "Admission"]

SHARES = {"low": 0.7, "normal": 0.9, "high": 1.0}  # of the bound, where each is refused


@dataclass(slots=True)
class Admission:
    """The gateway-wide count of requests in delivery against ``max_inflight``."""

    max_inflight: int
    inflight: int = 0
    refused: int = 0

    def limit(self, priority: str) -> int:
        """The count at which a request of ``priority`` is refused (at least 1)."""
        share = SHARES.get(priority, SHARES["normal"])
        return max(1, int(self.max_inflight * share))

    def admit(self, priority: str) -> bool:
        """Take one request of ``priority`` in (True), or refuse it (False: count unchanged)."""
        if self.inflight >= self.limit(priority):
            self.refused += 1
            return False
        self.inflight += 1
        return True

    def done(self) -> None:
        """A request taken in has been answered."""
        self.inflight -= 1
