"""Timeout and retry policy: the contract's formula, backoff, deadline and retry budget.

Invariants:
- ``per_try_timeout = max(1.5 x p95, 2000 ms)``, 2000 ms with no history.
- ``max_retries = min(floor((timeout_ms - reserve) / (per_try x 1.2)), 3)``, never below 0.
- A retry of the same endpoint waits 0.5 x per_try before the first retry and 1 x per_try
  before later ones, drawn from 50-100 % of that.
- The retry budget allows ``ratio`` x requests of the window, and never fewer than
  ``min_per_second`` x window retries (the floor is a lower bound, not an addition: added, it
  let an outage at 100 req/s cost 1.3 attempts a request); nothing here reads a clock: ``now``
  is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = [
    "MIN_PER_TRY_MS",
    "Deadline",
    "RetryBudget",
    "backoff_s",
    "max_retries",
    "per_try_timeout_ms",
]

MIN_PER_TRY_MS = 2000.0
MAX_RETRIES = 3


def per_try_timeout_ms(p95_ms: float | None) -> float:
    """Timeout of one attempt on an endpoint whose recent p95 latency is ``p95_ms``."""
    if p95_ms is None:
        return MIN_PER_TRY_MS
    per_try = 1.5 * p95_ms  # (not max(): ~700 instructions a call, on every attempt)
    return per_try if per_try > MIN_PER_TRY_MS else MIN_PER_TRY_MS


def max_retries(timeout_ms: float, reserve_ms: float, per_try_ms: float) -> int:
    """How many retries (after the first attempt) a request with this deadline may make."""
    return max(0, min(math.floor((timeout_ms - reserve_ms) / (per_try_ms * 1.2)), MAX_RETRIES))


def backoff_s(retry_of_same: int, per_try_ms: float, u: float) -> float:
    """Wait before the ``retry_of_same``-th retry (1, 2, ...) of the same endpoint.

    ``u`` is a uniform draw in ``[0, 1)``; the wait is 50-100 % of the base.
    """
    base_ms = 0.5 * per_try_ms if retry_of_same <= 1 else per_try_ms
    return base_ms * (0.5 + 0.5 * u) / 1000.0


@dataclass(frozen=True, slots=True)
class Deadline:
    """The one deadline of a request, in monotonic seconds, made at the edge."""

    expires_at: float

    def remaining(self, now: float) -> float:
        """Seconds left at ``now`` (never negative)."""
        left = self.expires_at - now  # (not max(): read several times a request)
        return left if left > 0.0 else 0.0


class RetryBudget:
    """Gateway-wide cap on retries: a share of recent requests, with a floor per second.

    Over a sliding ``window`` of one-second buckets, retries are allowed while
    ``retries < max(ratio x requests, min_per_second x window)`` (Envoy's shape: the share, or
    the floor where the share is smaller; Linkerd adds the two). When every agent fails, a
    request costs at most ``1 + ratio`` attempts at rates where the share is above the floor,
    and the floor's retries a second below that.
    """

    __slots__ = ("_buckets", "min_per_second", "ratio", "window")

    def __init__(self, ratio: float = 0.1, min_per_second: float = 10.0, window: int = 10) -> None:
        self.ratio = ratio
        self.min_per_second = min_per_second
        self.window = window
        self._buckets: deque[list[int]] = deque()  # [second, requests, retries]

    def _bucket(self, now: float) -> list[int]:
        second = int(now)
        buckets = self._buckets
        if not buckets or buckets[-1][0] != second:
            buckets.append([second, 0, 0])
        while buckets[0][0] <= second - self.window:
            buckets.popleft()
        return buckets[-1]

    def record_request(self, now: float) -> None:
        """Count one request (first attempt) at ``now``."""
        self._bucket(now)[1] += 1

    def allowance(self, now: float) -> float:
        """Retries still allowed in the window at ``now``."""
        self._bucket(now)
        requests = sum(b[1] for b in self._buckets)
        retries = sum(b[2] for b in self._buckets)
        return max(self.ratio * requests, self.min_per_second * self.window) - retries

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False when it is used up."""
        if self.allowance(now) < 1.0:
            return False
        self._bucket(now)[2] += 1
        return True
