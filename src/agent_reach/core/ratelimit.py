"""Per-key token buckets: ``rate_per_s`` tokens a second, at most ``burst`` held.

Invariants:
- A bucket starts full; over any interval ``[t0, t1]`` one key is granted at most
  ``burst + rate_per_s x (t1 - t0)`` tokens.
- Nothing here reads a clock: ``now`` (monotonic seconds) is passed in. A ``now`` earlier than
  the latest one seen for a key counts as no time passing: it never mints tokens.
- A refused :meth:`RateLimiter.take` deducts nothing.
- Memory is bounded: never more than ``max_keys`` keys. When a new key finds the table full,
  room is made for about ``max_keys / 16`` new keys at once (so that the sweep's cost is spread
  over many inserts): first every bucket that would be full at ``now`` is dropped (a full
  bucket carries no state: dropping it changes no answer), then, if that is not enough, the
  least recently used ones. An attacker churning keys can at worst reset the buckets of the
  least recently used keys, handing them a fresh burst; it can never grow memory.
"""

from __future__ import annotations

import math
from collections import OrderedDict

__all__ = ["RateLimiter"]

_SLACK = 1e-9  # tokens: absorbs float rounding so that waiting the returned delay suffices


class _Bucket:
    __slots__ = ("last", "tokens")

    def __init__(self, tokens: float, last: float) -> None:
        self.tokens = tokens
        self.last = last


class RateLimiter:
    """Token buckets by key (a sender id, an address, ...), each refilled at ``rate_per_s``."""

    __slots__ = ("_buckets", "burst", "forgotten", "max_keys", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 100_000) -> None:
        if not rate_per_s > 0 or math.isinf(rate_per_s):
            raise ValueError(f"rate_per_s must be a positive number, got {rate_per_s!r}")
        if not burst >= 1 or math.isinf(burst):
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys!r}")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # least recently used first
        self.forgotten = 0  # buckets not full dropped to make room: limits lost (a metric)

    def __len__(self) -> int:
        """How many keys hold a bucket."""
        return len(self._buckets)

    def _level(self, bucket: _Bucket, now: float) -> float:
        elapsed = now - bucket.last
        if not elapsed > 0:  # the clock went back (or did not move): no new tokens
            return bucket.tokens
        return min(self.burst, bucket.tokens + elapsed * self.rate_per_s)

    def available(self, key: str, now: float) -> float:
        """Tokens ``key`` would have at ``now``, without taking any or touching recency."""
        bucket = self._buckets.get(key)
        return self.burst if bucket is None else self._level(bucket, now)

    def take(self, key: str, now: float, cost: float = 1.0) -> float:
        """Take ``cost`` tokens from ``key``'s bucket at ``now``.

        Returns 0.0 when granted (the tokens are deducted), else the seconds until ``cost``
        tokens will be there (nothing deducted); ``math.inf`` when ``cost`` exceeds ``burst``
        and so can never be granted. ``ValueError`` for a negative or NaN ``cost``.
        """
        if not cost >= 0:
            raise ValueError(f"cost must be at least 0, got {cost!r}")
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            if len(buckets) >= self.max_keys:
                self._make_room(now)
            bucket = buckets[key] = _Bucket(self.burst, now)
        else:
            buckets.move_to_end(key)
            bucket.tokens = self._level(bucket, now)
            bucket.last = max(bucket.last, now)
        if bucket.tokens + _SLACK >= cost:
            bucket.tokens -= cost
            return 0.0
        if cost > self.burst:
            return math.inf
        return (cost - bucket.tokens) / self.rate_per_s

    def _make_room(self, now: float) -> None:
        buckets = self._buckets
        target = self.max_keys - max(1, self.max_keys // 16)
        full = [k for k, b in buckets.items() if self._level(b, now) >= self.burst]
        for key in full:
            del buckets[key]
        while len(buckets) > target:
            buckets.popitem(last=False)
            self.forgotten += 1
