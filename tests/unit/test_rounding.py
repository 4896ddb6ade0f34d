"""The arithmetic rounding of per-request numbers agrees with ``round``."""

from __future__ import annotations

import math
import random

import pytest

from agent_reach.core.rounding import round3, round4, round6


@pytest.mark.parametrize(("fast", "digits"), [(round3, 3), (round4, 4), (round6, 6)])
def test_as_round_but_at_ties(fast: object, digits: int) -> None:
    rng = random.Random(7)
    values = [rng.uniform(0, 10) for _ in range(20_000)]
    values += [rng.uniform(-5, 5) for _ in range(5_000)]  # negative: a clock stepping back
    values += [rng.expovariate(1e-3) for _ in range(5_000)]  # latencies, long tail
    values += [1.0, 0.0, 1_800_000_000.123456, 0.9999999]  # confidence 1, a wall time
    differ = 0
    for x in values:
        got, want = fast(x), round(x, digits)  # type: ignore[operator]
        if got != want:
            differ += 1  # only a tie in decimal, or one unit of the last place away
            assert abs(got - want) <= 10**-digits * 1.000001, (x, got, want)
        assert round(got, digits) == got  # at most that many decimals
    assert differ <= len(values) // 1000, differ  # ties are rare


def test_not_finite_raises() -> None:
    for bad in (math.inf, -math.inf):
        with pytest.raises(OverflowError):
            round3(bad)
    with pytest.raises(ValueError):
        round3(math.nan)
