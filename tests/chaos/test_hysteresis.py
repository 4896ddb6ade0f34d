"""Scenario 13: latency near the slow threshold. An agent whose latency hovers around
``--slow-threshold-ms`` (each call 85-115 % of it, uniformly) takes every request of its tag;
its status, polled every 0.1 s, must not flap: healthy <-> degraded transitions at most one a
minute.

The rule (docs/routing.md): degraded when the mean of its last 5 latencies is over the
threshold, healthy again only when that mean is under 0.8 x the threshold. Without the second
half, the mean of 5 such calls crosses the threshold several times a second.
"""

from __future__ import annotations

import itertools

from tests.chaos.support import (
    Load,
    Poller,
    agents_listed,
    bounded,
    chaos_agent,
    echo,
    errors,
    pick,
    r3,
    report,
    stopping,
)
from tests.support import gateway

THRESHOLD_MS = 100.0
SPREAD = 0.15


@bounded(60, 480)
def test_13_no_flapping_near_the_slow_threshold() -> None:
    duration = pick(12.0, 300.0)
    hovering = "agent://hover-00"
    flags = ("--delay-ms", str(THRESHOLD_MS), "--delay-spread", str(SPREAD))
    with (
        gateway("--heartbeat-interval", "2", "--slow-threshold-ms", str(THRESHOLD_MS)) as gw,
        stopping([]) as agents,
    ):
        agents.append(chaos_agent(gw.url, hovering, *flags))
        with (
            Poller(lambda: agents_listed(gw.url).get(hovering)) as poller,
            Load(gw.url, echo(), rate=20, duration=duration) as load,
        ):
            pass
    statuses = [status for _, status in poller.samples]
    transitions = sum(1 for a, b in itertools.pairwise(statuses) if a != b)
    minutes = duration / 60
    per_minute = transitions / minutes
    failed = errors(load.results)
    seen = sorted(set(statuses), key=statuses.index)
    report(
        "13",
        f"latency {100 * (1 - SPREAD):g}-{100 * (1 + SPREAD):g} % of the slow threshold",
        {
            "threshold_ms": THRESHOLD_MS,
            "duration_s": duration,
            "samples": len(statuses),
            "statuses_seen": seen,
            "transitions": transitions,
            "transitions_per_minute": r3(per_minute),
            "requests": len(load.results),
            "client_errors": sum(failed.values()),
        },
        {"transitions_per_minute": "<= 1"},
        transitions <= max(1, int(minutes)),  # a run under a minute may show the first one
    )
    assert not poller.failures, poller.failures[:3]
    assert not failed, failed
    assert set(statuses) <= {"healthy", "degraded"}, seen
    assert transitions <= max(1, int(minutes)), statuses
