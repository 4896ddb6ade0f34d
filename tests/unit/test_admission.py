"""Admission's shares (CONTRACT.md v1.1, "Overload and priority"): low refused past 70 % of
--max-inflight, normal past 90 %, high only at 100 %."""

from __future__ import annotations

import pytest

from agent_reach.core.admission import Admission
from agent_reach.core.routing import wait_limit


def fill(admission: Admission, priority: str) -> int:
    """Admit ``priority`` until refused; how many got in."""
    n = 0
    while admission.admit(priority):
        n += 1
        assert n <= admission.max_inflight
    return n


def test_each_priority_is_refused_at_its_share_of_the_bound() -> None:
    a = Admission(100)
    assert fill(a, "low") == 70
    assert fill(a, "normal") == 20  # 70 -> 90
    assert fill(a, "high") == 10  # 90 -> 100
    assert a.inflight == 100 and a.refused == 3
    a.done()
    assert not a.admit("low") and not a.admit("normal")
    assert a.admit("high")


@pytest.mark.parametrize("bound", [1, 2, 3, 7])
def test_a_tiny_bound_still_admits_one_of_each(bound: int) -> None:
    for priority in ("low", "normal", "high"):
        a = Admission(bound)
        assert a.admit(priority)


def test_a_refusal_changes_no_count() -> None:
    a = Admission(10)
    fill(a, "low")
    before = a.inflight
    assert not a.admit("low")
    assert a.inflight == before
    for _ in range(before):
        a.done()
    assert a.inflight == 0
    assert fill(a, "low") == 7


def test_shares_are_exact_at_every_bound() -> None:
    """low is refused at 70 % of the bound rounded down, normal at 90 %, not one early: with
    float shares int(90 * 0.7) was 62 (a review found 34 such bounds up to 2,000)."""
    for bound in range(1, 2001):
        expected = {"low": bound * 7 // 10, "normal": bound * 9 // 10, "high": bound}
        for priority, count in expected.items():
            assert Admission(bound).limit(priority) == max(1, count), (bound, priority)
            assert wait_limit(bound, priority) == max(1, count), (bound, priority)
