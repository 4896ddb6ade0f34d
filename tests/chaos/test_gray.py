"""Scenario 7: a gray failure, one agent of five answering 3 s late, or failing 10 % of its
requests (HTTP 500). 10 s after the fault began its share of the traffic must be under 5 % and
the p99 of every request within 1.2x that of the no-fault phases (smoke: after 2 s, under
10 %, the p99 not held: its windows are a second or two).

Under one load, the no-fault and the fault phases take turns (:func:`take_turns`: rounds of a
calm phase and a fault phase, in the order CF FC CF ...): the figure is the p99 of every fault
window's requests against that of every calm window's, so that a spell of the machine's own
noise falls on both sides (a single pair of windows gave 0.74-1.66x for the same tree, F6). A
calm phase's window begins once the agent had time to be seen back (the probe share's answers,
its latency samples): its share there is reported, and held to a fair part in the full run.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.chaos.support import (
    FULL,
    Load,
    Phases,
    Sent,
    bounded,
    chaos_agent,
    control,
    echo,
    errors,
    in_parallel,
    latencies,
    pct,
    pick,
    r3,
    report,
    share,
    stopping,
    take_turns,
    worst,
)
from tests.support import gateway

FAULTS: dict[str, dict[str, Any]] = {
    "slow": {"delay_ms": 3000.0},
    "errors": {"error_rate": 0.1, "error_status": 500},
}
NO_FAULT = {"delay_ms": 0.0, "error_rate": 0.0}
ROUNDS = pick(1, 5)
CALM_S = pick(1.5, 10.0)  # a calm phase
# of which not counted: the load's warm-up (connections, samples) in the first round, and in
# the others the agent's way back (the probe share finds it answering well, its samples mend)
CALM_SKIP_S = pick(1.0, 4.0)
SETTLE_S = pick(2.0, 10.0)  # a fault phase's first part, not counted: the "after 10 s"
MEASURED_S = pick(1.5, 8.0)  # then counted: 40 s of faults in the full run's five rounds


def p99(results: list[Sent]) -> float:
    return pct(latencies(results), 99)


@bounded(60, 420)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_7_gray_failure(fault: str) -> None:
    if fault == "errors" and not FULL:
        # 10 % errors leave a gray agent 90 % good: over a 2 s smoke window beside other
        # tests its share is noise (17 % seen in CI, 1.1 % over the full run's 30 s)
        pytest.skip("full only: the 10 % errors variant needs the full run's window")
    gray = "agent://gray-00"
    with gateway("--heartbeat-interval", "2") as gw, stopping([]) as agents:
        agents += in_parallel(lambda i: chaos_agent(gw.url, f"agent://gray-{i:02d}"), 5)

        def calm(_: int) -> tuple[float, float]:
            began = time.monotonic()
            control(agents[0], **NO_FAULT)
            time.sleep(CALM_S)
            return began + CALM_SKIP_S, time.monotonic()

        def faulty(_: int) -> tuple[float, float]:
            began = time.monotonic()
            control(agents[0], **FAULTS[fault])
            time.sleep(SETTLE_S + MEASURED_S)
            return began + SETTLE_S, time.monotonic()

        seconds = ROUNDS * (CALM_S + SETTLE_S + MEASURED_S)
        with Load(gw.url, echo(), rate=100, duration=seconds + 30) as load:
            try:
                windows = take_turns(ROUNDS, calm, faulty)
            finally:
                load.stop()  # the load ends with the last phase
        phases = Phases.split(load.results, windows)
    p99_calm, p99_fault = p99(phases.quiet), p99(phases.loud)
    its_share, calm_share = share(phases.loud, gray), share(phases.quiet, gray)
    failed = errors(phases.sent)
    late = sum(s.late for s in phases.sent)
    met = its_share < 0.05 and p99_fault <= 1.2 * p99_calm and not failed
    report(
        "7",
        f"gray failure ({fault}: {FAULTS[fault]}), one agent of 5",
        {
            "fault": fault,
            "share_after_settle": r3(its_share),
            "share_when_calm": r3(calm_share),
            "settle_s": SETTLE_S,
            "p99_no_fault_ms": r3(p99_calm),
            "p99_after_settle_ms": r3(p99_fault),
            "p99_ratio": r3(p99_fault / p99_calm),
            **phases.figures(),
            "worst_fault_client_gateway_ms": worst(s for s in phases.loud if not s.touched(gray)),
            "worst_calm_client_gateway_ms": worst(phases.quiet),
            "client_errors": sum(failed.values()),
            "errors_by_code": dict(failed),
            "late_answers": late,
        },
        {"share_after_settle": "< 0.05", "p99_ratio": "<= 1.2"},
        met,
    )
    assert not failed, failed
    assert late == 0
    assert its_share < (0.05 if FULL else 0.10), its_share
    if FULL:
        # the calm side had five agents, not four: a fault's cost is measured against that
        assert calm_share > 0.1, calm_share
        assert p99_fault <= 1.2 * p99_calm, (p99_fault, p99_calm)
