"""Scenarios 1, 2 and 10: an agent of five killed, paused and restarted under load.

Five SDK agents (tests/agents/behave.py, mode ok) behind one gateway, load from
:class:`~tests.chaos.support.Load`; the fault hits ``agent://...-00``. "No traffic to it" (1)
is when the run of attempts on the dead agent ended; the single recovery probes the gateway
sends it afterwards (a bounded share, so that an agent that comes back is seen to) are listed
apart: each is refused at once and fails over, at no cost to its caller.
"""

from __future__ import annotations

import time

from tests.chaos.support import (
    FULL,
    Load,
    Poller,
    bounded,
    echo,
    errors,
    in_parallel,
    latencies,
    paused,
    pct,
    pick,
    r3,
    report,
    stopping,
    window,
)
from tests.support import Proc, gateway, start_agent, status_of, wait_until


def at(load: Load, offset: float) -> None:
    """Wait until ``offset`` seconds into the load: the scenario's own schedule."""
    left = load.started_at + offset - time.monotonic()
    if left > 0:
        time.sleep(left)


def burst_end(offsets: list[float], gap: float = 0.5) -> tuple[float, list[float]]:
    """When the traffic to a dead endpoint ended (``offsets``: when each request that tried it
    started, after the fault): the last of the first run of attempts, each less than ``gap``
    after the one before; and the isolated attempts after it, the gateway's recovery probes
    (one at a time, after a backoff: docs/routing.md), which cost the callers nothing."""
    ordered = sorted(offsets)
    end = 0.0
    for i, t in enumerate(ordered):
        if t - end > gap:
            return end, ordered[i:]
        end = t
    return end, []


def five(gw: Proc, name: str, agents: list[Proc]) -> None:
    agents += in_parallel(lambda i: start_agent(gw.url, f"agent://{name}-{i:02d}"), 5)


@bounded(60, 180)
def test_1_an_agent_of_five_killed_at_200_per_second() -> None:
    duration, kill_at = pick((3.0, 1.0), (30.0, 10.0))
    with gateway("--heartbeat-interval", "2") as gw, stopping([]) as agents:
        five(gw, "kill", agents)
        victim = "agent://kill-00"
        with Load(gw.url, echo(), rate=200, duration=duration) as load:
            at(load, kill_at)
            killed_at = time.monotonic()
            agents[0].popen.kill()
        results = load.results
    failed = errors(results)
    touching = [s.start - killed_at for s in window(results, killed_at) if s.touched(victim)]
    quiet_after, probes = burst_end(touching)
    late = sum(s.late for s in results)
    met = not failed and quiet_after <= 1.0
    report(
        "1",
        "agent of 5 SIGKILLed at 200 req/s",
        {
            "requests": len(results),
            "client_errors": sum(failed.values()),
            "errors_by_code": dict(failed),
            "s_until_no_traffic_to_it": r3(quiet_after),
            "recovery_probes_after_s": [r3(t) for t in probes],
            "late_answers": late,
            "skipped_by_driver": load.skipped,
        },
        {"client_errors": "0", "s_until_no_traffic_to_it": "<= 1"},
        met,
    )
    assert len(results) >= 0.9 * 200 * duration, (len(results), load.skipped)
    assert not failed, failed
    assert quiet_after <= 1.0, quiet_after
    assert late == 0


def seconds_until_healthy(gw: str, endpoint_id: str, bound: float) -> float:
    start = time.monotonic()
    wait_until(lambda: status_of(gw, endpoint_id) == "healthy", bound, interval=0.02)
    return time.monotonic() - start


@bounded(60, 360)
def test_2_an_agent_sigstopped() -> None:
    interval = pick(1.0, 10.0)
    pauses = pick([2.0], [2.0, 5.0, 15.0, 35.0])
    rate = pick(50, 100)
    victim = "agent://stop-00"
    rows = []
    with (
        gateway("--heartbeat-interval", str(interval)) as gw,
        stopping([]) as agents,
    ):
        five(gw, "stop", agents)
        pid = agents[0].popen.pid
        # the load runs through every pause and recovery; bounded by its duration
        total = sum(pauses) + len(pauses) * (3 * interval + 2) + 2
        with Load(gw.url, echo(), rate=rate, duration=total) as load:
            for pause in pauses:
                seconds_until_healthy(gw.url, victim, 5 * interval)
                stopped = time.monotonic()
                with (
                    Poller(lambda: status_of(gw.url, victim), every=0.05) as seen,
                    paused(pid),
                ):
                    time.sleep(pause)  # the pause itself is the scenario
                resumed = time.monotonic()
                back = seconds_until_healthy(gw.url, victim, 5 * interval)
                statuses = list(dict.fromkeys(v for _, v in seen.samples))
                rows.append({"pause_s": pause, "statuses": statuses, "s_to_healthy": r3(back)})
                rows[-1]["window"] = (stopped, resumed + back + 1.0)
            load.stop()
        results = load.results
    for row in rows:
        since, until = row.pop("window")
        row["errors"] = sum(errors(window(results, since, until)).values())
    failed = errors(results)
    late = sum(s.late for s in results)
    worst = max(row["s_to_healthy"] for row in rows)
    met = not failed and worst <= interval
    report(
        "2",
        "agent SIGSTOPped " + "/".join(f"{p:g}" for p in pauses) + " s",
        {
            "interval_s": interval,
            "pauses": rows,
            "requests": len(results),
            "client_errors": sum(failed.values()),
            "errors_by_code": dict(failed),
            "late_answers": late,
        },
        {"client_errors": "0", "s_to_healthy": f"<= 1 interval ({interval:g} s)"},
        met,
    )
    assert not failed, failed
    assert late == 0
    # healthy again within one interval. Smoke: five of its 1 s intervals. When attempts timed
    # out during the pause, the agent is also slow (the latency rule) until fast answers come
    # back through the probe share, after a backoff that grows with its strikes up to
    # PROBE_BACKOFF_MAX_S (5 s), whatever the interval: 3.3 s was seen in a full `make test`
    # (0.003 s when nothing timed out). The full run's 10 s interval holds the goal.
    assert worst <= interval * (1 if FULL else 5), rows


@bounded(60, 180)
def test_10_a_cold_agent_restarted() -> None:
    warm, first = pick((2.0, 2.5), (20.0, 30.0))
    victim = "agent://cold-00"
    with gateway("--heartbeat-interval", "2") as gw, stopping([]) as agents:
        five(gw, "cold", agents)
        with Load(gw.url, echo(), rate=100, duration=warm + first + 2) as load:
            at(load, warm)
            baseline_until = time.monotonic()
            agents[0].popen.kill()
            agents[0].popen.wait(5)
            agents.append(start_agent(gw.url, victim))  # a new process under the same id
            registered = time.monotonic()
            at(load, warm + first + 1)
            load.stop()
        results = load.results
    baseline = window(results, load.started_at + 1.0, baseline_until)  # the first 1 s warms up
    cold = [s for s in window(results, registered, registered + first) if s.endpoint == victim]
    p99_base, p99_cold = pct(latencies(baseline), 99), pct(latencies(cold), 99)
    failed = errors(results)
    met = p99_cold <= 1.5 * p99_base and not failed
    report(
        "10",
        "a cold agent restarted",
        {
            "baseline_p99_ms": r3(p99_base),
            "restarted_p99_ms_first_s": r3(p99_cold),
            "first_s": first,
            "restarted_requests": len(cold),
            "ratio": r3(p99_cold / p99_base),
            "client_errors": sum(failed.values()),
        },
        {"restarted_p99_ms_first_s": "<= 1.5 x baseline p99"},
        met,
    )
    assert not failed, failed
    if FULL:
        assert len(cold) >= 0.05 * 100 * first, len(cold)  # it does get traffic again
        assert p99_cold <= 1.5 * p99_base, (p99_cold, p99_base)
    else:
        # smoke, 2.5 s on a shared machine: it gets a share again (a fifth is fair; before
        # its cost warmed up (F8), a first answer slower than the others' kept it near 0 for
        # seconds: once 1 request in 2.5 s), and its p95 (of some tens of requests: the p99
        # is their slowest, one cold start's hiccup) within 3x + 20 ms still fails a cold
        # agent that is slow
        assert len(cold) >= 0.05 * 100 * first, len(cold)
        p95_base, p95_cold = pct(latencies(baseline), 95), pct(latencies(cold), 95)
        assert p95_cold <= 3 * p95_base + 20, (p95_cold, p95_base)
