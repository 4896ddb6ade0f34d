"""Scenario 16: the shared registry's Redis killed, restarted EMPTY, then frozen (SIGSTOP), under
load through two gateways on it. A private redis-server on a free port (never the machine's);
two SDK agents registered through each gateway. Requests may fail while the registry is away
only within their deadline (none lost beyond it: no answer later than deadline + 50 ms, none
without an answer), and the views must be repaired after each fault: Redis holds every agent
again, and both gateways list every agent healthy.
"""

from __future__ import annotations

import os
import time

from tests.chaos.support import (
    Load,
    agents_listed,
    bounded,
    echo,
    errors,
    paused,
    pick,
    private_redis,
    r3,
    report,
    stopping,
)
from tests.support import gateway, metric, start_agent, wait_until

IDS = [f"agent://shared-{i:02d}" for i in range(4)]


@bounded(90, 240)
def test_16_redis_killed_restarted_empty_and_frozen_under_load() -> None:
    interval = pick(1.0, 2.0)
    steady, outage, frozen_s, repair_bound = pick((0.5, 1.0, 1.0, 10.0), (5.0, 15.0, 15.0, 20.0))
    prefix = f"chaos-{os.urandom(4).hex()}"
    with private_redis() as server:
        flags = ["--registry", server.url, "--registry-prefix", prefix]
        flags += ["--heartbeat-interval", str(interval)]
        with gateway(*flags) as a, gateway(*flags) as b, stopping([]) as agents:
            for i, eid in enumerate(IDS):
                agents.append(start_agent((a, b)[i % 2].url, eid))

            def repaired() -> bool:
                if server.ids(prefix) != set(IDS):
                    return False
                return all(
                    all(agents_listed(gw.url).get(eid) == "healthy" for eid in IDS)
                    and metric(gw, "agent_reach_registry_available", backend="redis") == 1
                    for gw in (a, b)
                )

            def seconds_to_repair() -> float:
                start = time.monotonic()
                wait_until(repaired, repair_bound, interval=0.05)
                return time.monotonic() - start

            seconds_to_repair()  # everything in place before the faults
            total = steady + outage + repair_bound + frozen_s + repair_bound + steady
            body = echo(timeout_ms=2000)
            with (
                Load(a.url, body, rate=50, duration=total) as via_a,
                Load(b.url, body, rate=50, duration=total) as via_b,
            ):
                time.sleep(steady)  # the scenario's schedule
                killed = time.monotonic()
                server.kill()
                time.sleep(outage)  # the outage is the scenario
                server.start()  # the same port, EMPTY: no persistence
                after_restart = seconds_to_repair()
                frozen = time.monotonic()
                with paused(server.popen.pid):  # type: ignore[union-attr]
                    time.sleep(frozen_s)  # the freeze is the scenario
                after_freeze = seconds_to_repair()
                time.sleep(steady)
                via_a.stop()
                via_b.stop()
    results = sorted(via_a.results + via_b.results, key=lambda s: s.start)
    late = [s for s in results if s.late]
    unanswered = [s for s in results if s.status == 0]
    failed = errors(results)
    met = not late and not unanswered
    report(
        "16",
        "Redis killed, restarted empty, frozen, under load (2 gateways)",
        {
            "interval_s": interval,
            "outage_s": outage,
            "frozen_s": frozen_s,
            "requests": len(results),
            "lost_beyond_deadline": len(late) + len(unanswered),
            "errors_by_code": dict(failed),
            "errors_while_away": sum(errors(s for s in results if s.start >= killed).values()),
            "s_to_repair_after_empty_restart": r3(after_restart),
            "s_to_repair_after_freeze": r3(after_freeze),
            "frozen_at_s": r3(frozen - killed),
        },
        {"lost_beyond_deadline": "0", "views": "repaired (Redis and both gateways, every agent)"},
        met,
    )
    assert not unanswered, unanswered[:3]
    assert not late, late[:3]
    # the agents were up all along, and each gateway routes on its last view meanwhile
    assert not failed, failed
