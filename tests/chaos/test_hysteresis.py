"""Scenario 13: latency near the slow threshold. An agent whose mean latency hovers around
``--slow-threshold-ms`` must not flap: healthy <-> degraded transitions at most 1 a minute.
Pending: the latency rule's hysteresis is being built (issue 17).
"""

from __future__ import annotations

import pytest


@pytest.mark.skip(reason="not written yet: the hysteresis is built; this scenario is not")
def test_13_no_flapping_near_the_slow_threshold() -> None:
    raise AssertionError("not written yet")
