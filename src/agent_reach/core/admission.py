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

__all__ = ["SHARES", "Admission", "share_of"]

# per cent of the bound, where each is refused: whole numbers, so that the count is exact
# (int(90 * 0.7) is 62, not 63: floats would refuse low a request early at 34 bounds of 2,000)
SHARES = {"low": 70, "normal": 90, "high": 100}


def share_of(bound: int, priority: str | None) -> int:
    """The count at which a request of ``priority`` (None or unknown: ``normal``) is refused,
    of ``bound``: its share, rounded down, at least 1."""
    return max(1, bound * SHARES.get(priority or "normal", SHARES["normal"]) // 100)


@dataclass(slots=True)
class Admission:
    """The gateway-wide count of requests in delivery against ``max_inflight``."""

    max_inflight: int
    inflight: int = 0
    refused: int = 0

    def limit(self, priority: str) -> int:
        """The count at which a request of ``priority`` is refused (at least 1)."""
        return share_of(self.max_inflight, priority)

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
