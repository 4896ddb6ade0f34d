"""Unit tests of agent_reach.core.ratelimit: token-bucket refill math, retry-after, burst, a clock
going backwards, and the max_keys bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.ratelimit import RateLimiter

T0 = 1000.0


@pytest.mark.parametrize(
    ("rate", "burst", "max_keys"),
    [
        (0, 5, 10),
        (-1, 5, 10),
        (math.nan, 5, 10),
        (math.inf, 5, 10),
        (1, 0.5, 10),
        (1, 0, 10),
        (1, math.nan, 10),
        (1, 5, 0),
    ],
)
def test_bad_arguments(rate: float, burst: float, max_keys: int) -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate, burst, max_keys)


def test_bucket_starts_full_and_allows_a_burst() -> None:
    limiter = RateLimiter(rate_per_s=2, burst=5)
    assert [limiter.take("a", T0) for _ in range(5)] == [0.0] * 5
    assert limiter.take("a", T0) == pytest.approx(0.5)  # one token at 2/s
    assert limiter.take("b", T0) == 0.0  # keys are independent
    assert len(limiter) == 2


@pytest.mark.parametrize(
    ("rate", "burst", "spent", "later", "cost", "wait"),
    [
        # after spending all 5 at 2/s: 1 token takes 0.5 s
        (2.0, 5.0, 5, 0.0, 1.0, 0.5),
        (2.0, 5.0, 5, 0.25, 1.0, 0.25),  # half a token came back
        (2.0, 5.0, 5, 0.5, 1.0, 0.0),
        (2.0, 5.0, 5, 0.0, 3.0, 1.5),
        (2.0, 5.0, 5, 1.0, 3.0, 0.5),  # 2 tokens there, 1 missing
        (0.5, 1.0, 1, 0.0, 1.0, 2.0),
        (0.5, 1.0, 1, 1.5, 1.0, 0.5),
        (10.0, 1.0, 0, 0.0, 1.0, 0.0),
        (1.0, 3.0, 0, 0.0, 3.0, 0.0),  # the whole burst at once
        (1.0, 3.0, 0, 0.0, 0.0, 0.0),  # free
    ],
)
def test_refill_and_retry_after(
    rate: float, burst: float, spent: int, later: float, cost: float, wait: float
) -> None:
    limiter = RateLimiter(rate, burst)
    for _ in range(spent):
        assert limiter.take("k", T0) == 0.0
    assert limiter.take("k", T0 + later, cost) == pytest.approx(wait)


def test_refused_take_deducts_nothing() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2)
    limiter.take("k", T0, 2)
    for _ in range(10):
        assert limiter.take("k", T0 + 0.5) == pytest.approx(0.5)
    assert limiter.take("k", T0 + 1.0) == 0.0


def test_waiting_the_retry_after_is_enough() -> None:
    limiter = RateLimiter(rate_per_s=3, burst=7)
    now = T0
    for _ in range(7):
        limiter.take("k", now)
    for _ in range(100):
        wait = limiter.take("k", now, 1.3)
        assert wait > 0
        now += wait
        assert limiter.take("k", now, 1.3) == 0.0


def test_refill_is_capped_at_burst() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=3)
    limiter.take("k", T0, 3)
    assert limiter.available("k", T0 + 3600) == 3.0
    assert limiter.take("k", T0 + 3600, 3) == 0.0
    assert limiter.take("k", T0 + 3600) == pytest.approx(1.0)


def test_cost_above_burst_is_never_granted() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=3)
    assert limiter.take("k", T0, 4) == math.inf
    assert limiter.available("k", T0) == 3.0  # nothing deducted


@pytest.mark.parametrize("cost", [-1.0, math.nan])
def test_bad_cost(cost: float) -> None:
    with pytest.raises(ValueError):
        RateLimiter(1, 1).take("k", T0, cost)


def test_clock_going_backwards_mints_nothing() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2)
    limiter.take("k", T0, 2)
    assert limiter.take("k", T0 - 100) == pytest.approx(1.0)  # no tokens, no crash
    assert limiter.available("k", T0 - 100) == 0.0
    # time is measured from the latest now seen, not from the earlier one
    assert limiter.take("k", T0 + 0.5) == pytest.approx(0.5)
    assert limiter.take("k", T0 + 1.0) == 0.0


def test_available_does_not_create_keys() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2)
    assert limiter.available("k", T0) == 2.0
    assert len(limiter) == 0


# --- bounded memory -----------------------------------------------------------------------------


def test_full_buckets_go_first() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2, max_keys=3)
    limiter.take("idle", T0)  # full again by T0 + 1
    limiter.take("busy1", T0 + 5, 2)
    limiter.take("busy2", T0 + 5, 2)
    limiter.take("new", T0 + 5)
    assert len(limiter) == 3
    # the busy buckets kept their state; the idle one was dropped (it was full anyway)
    assert limiter.available("busy1", T0 + 5) == 0.0
    assert limiter.available("busy2", T0 + 5) == 0.0
    assert limiter.take("busy1", T0 + 5) > 0


def test_a_full_bucket_goes_before_the_least_recently_used() -> None:
    limiter = RateLimiter(rate_per_s=0.1, burst=2, max_keys=3)
    limiter.take("old1", T0, 2)
    limiter.take("old2", T0, 2)
    limiter.take("recent", T0 + 1, 0)  # most recently used, and full
    limiter.take("new", T0 + 1)
    assert len(limiter) == 3
    assert limiter.take("old1", T0 + 1) > 0  # kept its (empty) bucket


def test_least_recently_used_goes_when_none_is_full() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2, max_keys=3)
    for key in ("a", "b", "c"):
        limiter.take(key, T0, 2)
    limiter.take("a", T0)  # a is now the most recently used (refused, but used)
    limiter.take("d", T0)
    assert len(limiter) <= 3
    assert limiter.take("a", T0) > 0  # a kept its empty bucket
    assert limiter.take("d", T0) == 0.0


def test_room_is_made_in_batches() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=1, max_keys=64)
    for i in range(64):
        limiter.take(f"k{i}", T0)
    assert len(limiter) == 64
    limiter.take("new", T0)
    assert len(limiter) == 64 - 4 + 1  # room for max_keys / 16 at once
    assert limiter.take("k63", T0) > 0  # the most recent keys kept their state
    assert limiter.forgotten == 4  # four limited keys lost their state (the metric)


def test_only_buckets_that_were_not_full_count_as_forgotten() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=2, max_keys=3)
    limiter.take("idle", T0)  # full again by T0 + 1: dropping it forgets nothing
    limiter.take("busy1", T0 + 5, 2)
    limiter.take("busy2", T0 + 5, 2)
    limiter.take("new", T0 + 5)
    assert limiter.forgotten == 0
    limiter.take("newer", T0 + 5)  # none full now: the least recently used limit is lost
    assert limiter.forgotten == 1


def test_one_key_limiter() -> None:
    limiter = RateLimiter(rate_per_s=1, burst=1, max_keys=1)
    assert limiter.take("a", T0) == 0.0
    assert limiter.take("b", T0) == 0.0
    assert len(limiter) == 1


@settings(max_examples=200, deadline=None)
@given(
    max_keys=st.integers(1, 20),
    ops=st.lists(st.tuples(st.integers(0, 40), st.floats(0, 2)), max_size=200),
)
def test_never_more_than_max_keys(max_keys: int, ops: list[tuple[int, float]]) -> None:
    limiter = RateLimiter(rate_per_s=1, burst=3, max_keys=max_keys)
    now = T0
    for key, gap in ops:
        now += gap
        limiter.take(f"k{key}", now)
        assert 1 <= len(limiter) <= max_keys


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.1, 100),
    burst=st.floats(1, 50),
    ops=st.lists(
        st.tuples(st.sampled_from("ab"), st.floats(-5, 3), st.floats(0, 10)),
        min_size=1,
        max_size=200,
    ),
)
def test_a_key_never_gets_more_than_burst_plus_refill(
    rate: float, burst: float, ops: list[tuple[str, float, float]]
) -> None:
    """Granted cost in total <= burst + rate x (latest now - first now), clock jumps included."""
    limiter = RateLimiter(rate, burst)
    now = T0
    first: dict[str, float] = {}
    latest: dict[str, float] = {}
    granted: dict[str, float] = {}
    for key, step, cost in ops:
        now += step  # negative steps: the clock goes backwards
        first.setdefault(key, now)
        latest[key] = max(latest.get(key, now), now)
        wait = limiter.take(key, now, cost)
        assert wait >= 0.0
        if wait == 0.0:
            granted[key] = granted.get(key, 0.0) + cost
        budget = burst + rate * (latest[key] - first[key])
        assert granted.get(key, 0.0) <= budget + 1e-6 * (1 + budget)
        assert limiter.available(key, now) <= burst
