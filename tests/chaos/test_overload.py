"""Scenario 14: overload. A gateway admitting 20 requests at once (``--max-inflight 20``) in front
of agents that hold each request 0.5 s serves at most 40 a second; ten times that is offered,
mixed priorities. High priority must succeed (>= 99 %), the gateway's memory stay bounded, the
admitted requests' p99 stay near the agents' 0.5 s (nothing queues past admission), and a
request be admitted at once when the load stops.

Two mixes. ``in_band``: 0.5 % high (5 % of the capacity), 29.5 % normal, 70 % low: the high
requests fit in the part of the bound only they may take (the last 10 %, CONTRACT.md v1.1), and
must all get through the flood. ``over_band`` (full run only, reported, not held to the goal):
5 % high, half the capacity, more than that part can hold, so high requests compete with normal
ones for the rest, first come first served.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.support import (
    FULL,
    Bodies,
    Load,
    Poller,
    bounded,
    chaos_agent,
    errors,
    full_only,
    in_parallel,
    latencies,
    pct,
    pick,
    r3,
    report,
    rss_mb,
    stopping,
)
from tests.support import gateway, http, metric

MAX_INFLIGHT = 20
HOLD_MS = 500.0
CAPACITY = MAX_INFLIGHT / (HOLD_MS / 1000)  # requests a second


# per 200 requests: how many are high, and how many normal (the rest are low)
MIXES = {"in_band": (1, 59), "over_band": (10, 50)}


def bodies(mix: str) -> Bodies:
    high, normal = MIXES[mix]
    levels = ["high"] * high + ["normal"] * normal + ["low"] * (200 - high - normal)
    return [{"intent": "test.echo", "timeout_ms": 3000, "priority": p} for p in levels]


@bounded(60, 180)
@pytest.mark.parametrize("mix", ["in_band", pytest.param("over_band", marks=full_only)])
def test_14_ten_times_capacity_with_mixed_priorities(mix: str) -> None:
    duration = pick(2.0, 30.0)
    with (
        gateway("--heartbeat-interval", "2", "--max-inflight", str(MAX_INFLIGHT)) as gw,
        stopping([]) as agents,
    ):
        flags = ("--delay-ms", str(HOLD_MS))
        agents += in_parallel(lambda i: chaos_agent(gw.url, f"agent://busy-{i:02d}", *flags), 5)
        pid = gw.popen.pid
        rss_before = rss_mb(pid)
        with (
            Poller(lambda: rss_mb(pid), every=0.2) as rss,
            Load(gw.url, bodies(mix), rate=10 * CAPACITY, duration=duration) as load,
        ):
            pass
        ended = time.monotonic()
        code, answer = http(
            "POST", f"{gw.url}/v1/send", {"intent": "test.echo", "priority": "low"}, timeout=10
        )
        recovered = time.monotonic() - ended
        in_delivery = metric(gw, "agent_reach_requests_in_delivery")
    results = load.results
    by_priority: dict[str, dict[str, Any]] = {}
    for level in ("high", "normal", "low"):
        mine = [s for s in results if s.priority == level]
        by_priority[level] = {
            "offered": len(mine),
            "success_pct": r3(100 * sum(s.ok for s in mine) / len(mine)),
            "errors": dict(errors(mine)),
        }
    admitted = [s for s in results if s.ok]
    p99_admitted = pct(latencies(admitted), 99)
    peak = max(v for _, v in rss.samples)
    unexpected = {
        code: n for code, n in errors(results).items() if code != "overloaded"
    }  # anything but a refusal at admission
    high_ok = float(by_priority["high"]["success_pct"])
    # over band, high priority is reported and not held (the module's docstring)
    high_met = high_ok >= 99 or mix == "over_band"
    met = high_met and p99_admitted <= 2 * HOLD_MS and code == 200 and recovered <= 1.0
    report(
        "14",
        f"overload ({mix}): {10 * CAPACITY:g} req/s offered to a capacity of {CAPACITY:g}"
        f" for {duration:g} s",
        {
            "mix": mix,
            "by_priority": by_priority,
            "admitted": len(admitted),
            "admitted_per_s": r3(len(admitted) / duration),
            "p99_admitted_ms": r3(p99_admitted),
            "rss_before_mb": r3(rss_before),
            "rss_peak_mb": r3(peak),
            "s_to_admit_after_load": r3(recovered),
            "other_errors": unexpected,
            "skipped_by_driver": load.skipped,
        },
        {
            "high_success_pct": ">= 99" if mix == "in_band" else "reported (over band)",
            "rss": "bounded (peak - before <= 50 MB)",
            "p99_admitted_ms": f"<= {2 * HOLD_MS:g} (2x the agents' hold)",
            "s_to_admit_after_load": "<= 1 (at once)",
        },
        met,
    )
    assert code == 200, answer
    assert in_delivery == 0
    assert recovered <= 1.0 + HOLD_MS / 1000
    assert not unexpected, unexpected
    assert peak - rss_before <= 50, (rss_before, peak)
    assert p99_admitted <= 2 * HOLD_MS + (0 if FULL else 250), p99_admitted
    if mix == "in_band":
        assert high_ok >= (99 if FULL else 97), by_priority
    # the shares work: low is refused more than normal, normal more than high
    assert by_priority["low"]["success_pct"] <= by_priority["normal"]["success_pct"] <= high_ok
