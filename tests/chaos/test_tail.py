"""Scenario 11: the tail. 1 % of calls 10x slow, hedging on (``hedge_after_ms`` in the intent
dictionary, CONTRACT.md v1.1): the p99.9 must be at least 5x better than without hedging, for at
most 5 % extra load on the agents. Pending: hedging is being built (issue 17).
"""

from __future__ import annotations

import pytest


@pytest.mark.skip(reason="not written yet: hedging (hedge_after_ms) is built; this scenario is not")
def test_11_hedging_cuts_the_tail() -> None:
    raise AssertionError("not written yet")
