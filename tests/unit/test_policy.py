"""Unit tests of agent_reach.core.retry: the contract's timeout formula, backoff, deadline and
retry budget."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.retry import (
    MIN_PER_TRY_MS,
    Deadline,
    RetryBudget,
    backoff_s,
    max_retries,
    per_try_timeout_ms,
)

# --- per_try_timeout / max_retries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("p95", "timeout_ms", "reserve_ms", "per_try", "retries"),
    [
        # no history: 2000 ms; (8000 - 1000) / 2400 = 2.9
        (None, 8000, 1000, 2000.0, 2),
        # the example: 1.5 x 800 = 1200 < 2000
        (800.0, 8000, 1000, 2000.0, 2),
        # 1.5 x 2000 = 3000; 7000 / 3600 = 1.9
        (2000.0, 8000, 1000, 3000.0, 1),
        (0.0, 8000, 1000, 2000.0, 2),
        # the floor of 2000 ms and where 1.5 x p95 takes over
        (4000.0 / 3.0, 8000, 1000, 2000.0, 2),
        (1334.0, 8000, 1000, 2001.0, 2),
        # cap of 3 retries
        (None, 60_000, 1000, 2000.0, 3),
        (None, 10_600, 1000, 2000.0, 3),  # exactly 4 x 2400: still 3
        (500.0, 1_000_000, 0, 2000.0, 3),
        # a deadline shorter than the reserve: no retry, never negative
        (None, 500, 1000, 2000.0, 0),
        (None, 0, 1000, 2000.0, 0),
        (None, 1000, 1000, 2000.0, 0),
        # the contract's example request: 3000 ms leaves 2000 < 2400
        (None, 3000, 1000, 2000.0, 0),
        # exact floor boundaries with per_try 2000 (x 1.2 = 2400)
        (None, 3400, 1000, 2000.0, 1),
        (None, 3399, 1000, 2000.0, 0),
        (None, 5800, 1000, 2000.0, 2),
        (None, 5799, 1000, 2000.0, 1),
        (None, 8200, 1000, 2000.0, 3),
        (None, 8199, 1000, 2000.0, 2),
        # ... and with per_try 3000 (x 1.2 = 3600)
        (2000.0, 4600, 1000, 3000.0, 1),
        (2000.0, 4599, 1000, 3000.0, 0),
        (2000.0, 8200, 1000, 3000.0, 2),
        (2000.0, 8199, 1000, 3000.0, 1),
        # a slow endpoint on a long deadline: 1.5 x 10 s = 15 s; 45 s / 18 s = 2.5
        (10_000.0, 46_000, 1000, 15_000.0, 2),
        # no reserve
        (None, 2400, 0, 2000.0, 1),
    ],
)
def test_contract_formula(
    p95: float | None, timeout_ms: float, reserve_ms: float, per_try: float, retries: int
) -> None:
    got_per_try = per_try_timeout_ms(p95)
    assert got_per_try == pytest.approx(per_try)
    assert max_retries(timeout_ms, reserve_ms, got_per_try) == retries


def test_min_per_try_is_the_contract_value() -> None:
    assert MIN_PER_TRY_MS == 2000.0


@settings(max_examples=500, deadline=None)
@given(
    p95=st.one_of(st.none(), st.integers(0, 60_000)),
    timeout_ms=st.integers(0, 120_000),
    reserve_ms=st.integers(0, 5000),
)
def test_formula_matches_exact_arithmetic(
    p95: int | None, timeout_ms: int, reserve_ms: int
) -> None:
    per_try = per_try_timeout_ms(None if p95 is None else float(p95))
    exact_per_try = Fraction(2000) if p95 is None else max(Fraction(3, 2) * p95, Fraction(2000))
    assert Fraction(per_try) == exact_per_try
    exact = math.floor((timeout_ms - reserve_ms) / (exact_per_try * Fraction(6, 5)))
    retries = max_retries(float(timeout_ms), float(reserve_ms), per_try)
    assert retries == max(0, min(exact, 3))
    assert isinstance(retries, int)


@settings(max_examples=200, deadline=None)
@given(
    timeout_ms=st.floats(-1e6, 1e7),
    reserve_ms=st.floats(0, 1e4),
    per_try=st.floats(MIN_PER_TRY_MS, 1e6),
    more=st.floats(0, 1e6),
)
def test_retries_bounded_and_monotone_in_deadline(
    timeout_ms: float, reserve_ms: float, per_try: float, more: float
) -> None:
    r = max_retries(timeout_ms, reserve_ms, per_try)
    assert 0 <= r <= 3
    assert max_retries(timeout_ms + more, reserve_ms, per_try) >= r


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0, 1e6), b=st.floats(0, 1e6))
def test_per_try_is_at_least_the_floor_and_monotone(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert per_try_timeout_ms(lo) >= MIN_PER_TRY_MS
    assert per_try_timeout_ms(lo) <= per_try_timeout_ms(hi)


# --- backoff ------------------------------------------------------------------------------------

ALMOST_ONE = math.nextafter(1.0, 0.0)


@pytest.mark.parametrize(
    ("retry", "per_try", "u", "expected_s"),
    [
        # first retry of the same endpoint: 50-100 % of 0.5 x per_try
        (1, 2000.0, 0.0, 0.5),
        (1, 2000.0, 0.5, 0.75),
        (1, 2000.0, ALMOST_ONE, 1.0),
        (1, 3000.0, 0.0, 0.75),
        # later ones: 50-100 % of per_try
        (2, 2000.0, 0.0, 1.0),
        (2, 2000.0, ALMOST_ONE, 2.0),
        (3, 3000.0, 0.0, 1.5),
        (3, 3000.0, ALMOST_ONE, 3.0),
    ],
)
def test_backoff_edges(retry: int, per_try: float, u: float, expected_s: float) -> None:
    assert backoff_s(retry, per_try, u) == pytest.approx(expected_s)
    assert backoff_s(retry, per_try, u) <= (0.5 if retry == 1 else 1.0) * per_try / 1000


@settings(max_examples=300, deadline=None)
@given(
    retry=st.integers(1, 10),
    per_try=st.floats(MIN_PER_TRY_MS, 1e6),
    u=st.floats(0.0, 1.0, exclude_max=True),
)
def test_backoff_is_within_half_and_full_base(retry: int, per_try: float, u: float) -> None:
    base_s = (0.5 if retry == 1 else 1.0) * per_try / 1000
    wait = backoff_s(retry, per_try, u)
    assert 0.5 * base_s <= wait <= base_s
    assert backoff_s(retry, per_try, 0.0) <= wait  # monotone in u


# --- Deadline -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "remaining"),
    [(90.0, 10.0), (99.5, 0.5), (100.0, 0.0), (100.001, 0.0), (1e9, 0.0)],
)
def test_deadline_remaining(now: float, remaining: float) -> None:
    assert Deadline(100.0).remaining(now) == pytest.approx(remaining)


@given(expires=st.floats(-1e9, 1e9), now=st.floats(-1e9, 1e9))
def test_deadline_remaining_never_negative(expires: float, now: float) -> None:
    left = Deadline(expires).remaining(now)
    assert left >= 0.0
    if now <= expires:
        assert left == expires - now


# --- RetryBudget --------------------------------------------------------------------------------

NOW = 1000.0


def spend_all(budget: RetryBudget, now: float, limit: int = 10_000) -> int:
    """Spend until refused; return how many were granted."""
    granted = 0
    while budget.try_spend(now):
        granted += 1
        assert granted < limit, "budget never ran out"
    return granted


def test_floor_with_no_requests() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    assert budget.allowance(NOW) == 100.0
    assert spend_all(budget, NOW) == 100  # min_per_second x window
    assert budget.allowance(NOW) == 0.0


def test_custom_floor() -> None:
    assert spend_all(RetryBudget(ratio=0.2, min_per_second=3, window=2), NOW) == 6
    assert spend_all(RetryBudget(ratio=0.2, min_per_second=0, window=10), NOW) == 0


def test_the_floor_is_a_lower_bound_not_an_addition() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    for _ in range(50):
        budget.record_request(NOW)
    assert budget.allowance(NOW) == pytest.approx(100.0)  # 0.2 x 50 = 10 is under the floor
    for _ in range(950):
        budget.record_request(NOW)
    assert budget.allowance(NOW) == pytest.approx(200.0)  # 0.2 x 1,000: the share alone
    assert spend_all(budget, NOW) == 200


def test_an_outage_costs_at_most_the_share_past_the_floor() -> None:
    # every request fails and asks for retries: 100 req/s over 60 s (the window's worth of
    # requests made beforehand too), the default share 0.1: at most 1.1 attempts a request
    budget = RetryBudget()
    for second in range(10):
        for _ in range(100):
            budget.record_request(NOW - 10 + second)
    retries = requests = 0
    for tick in range(6000):
        now = NOW + tick / 100
        budget.record_request(now)
        requests += 1
        for _ in range(3):  # up to three retries each, as max_retries allows
            retries += budget.try_spend(now)
    assert 1.05 <= (requests + retries) / requests <= 1.12


def test_ratio_alone() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=0, window=10)
    for _ in range(10):
        budget.record_request(NOW)
    assert spend_all(budget, NOW) == 2


def test_refused_retry_is_not_counted() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=0, window=10)
    for _ in range(500):
        budget.record_request(NOW)
    assert spend_all(budget, NOW) == 100
    for _ in range(20):
        assert budget.try_spend(NOW) is False
    assert budget.allowance(NOW) == 0.0
    # five new requests earn exactly one retry (0.2 x 5); had the refusals counted, none
    for _ in range(5):
        budget.record_request(NOW)
    assert budget.try_spend(NOW) is True
    assert budget.try_spend(NOW) is False


def test_window_slides_old_buckets_out() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    assert spend_all(budget, NOW) == 100
    assert budget.try_spend(NOW + 5) is False
    assert budget.try_spend(NOW + 9.999) is False  # second 1009: bucket 1000 is still in
    assert budget.allowance(NOW + 10) == 100.0  # second 1010: it is out
    assert spend_all(budget, NOW + 10.5) == 100


def test_window_drops_everything_after_a_long_pause() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    for _ in range(5000):
        budget.record_request(NOW)
    spend_all(budget, NOW)
    assert budget.allowance(NOW + 3600) == 100.0


def test_window_keeps_recent_buckets() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    for _ in range(60):
        assert budget.try_spend(NOW)
    for _ in range(40):
        assert budget.try_spend(NOW + 5)
    assert budget.try_spend(NOW + 9) is False
    assert budget.allowance(NOW + 10.5) == 60.0  # the 60 of second 1000 slid out, 40 remain
    assert budget.allowance(NOW + 15.5) == 100.0


def test_requests_slide_out_too() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=10, window=10)
    for _ in range(1000):
        budget.record_request(NOW)
    assert budget.allowance(NOW + 9) == pytest.approx(200.0)
    assert budget.allowance(NOW + 11) == pytest.approx(100.0)


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["request", "retry"]), st.floats(0.0, 3.0)),
        max_size=300,
    )
)
def test_budget_never_exceeded_in_any_window(ops: list[tuple[str, float]]) -> None:
    """Granted retries in the window never exceed the larger of ratio x requests and the floor."""
    budget = RetryBudget(ratio=0.2, min_per_second=1, window=5)
    now = NOW
    log: list[tuple[str, float]] = []
    for kind, gap in ops:
        now += gap
        if kind == "request":
            budget.record_request(now)
            log.append(("request", now))
        elif budget.try_spend(now):
            log.append(("retry", now))
        second = int(now)
        recent = [k for k, at in log if int(at) > second - budget.window]
        assert recent.count("retry") <= max(0.2 * recent.count("request"), 5)
