"""Scenario 4: the gateway (and, on Redis, the registry too) frozen by SIGSTOP for longer than
down-after, under load: when it resumes, no agent may look expired and no request may find an
empty table. Full: interval 10 s (down after 30 s), frozen 40 s; smoke: interval 0.5 s (down after
1.5 s), frozen 2 s.

Five SDK agents keep beating throughout (their beats wait in the gateway's socket or time out and
are retried). The load's deadlines are longer than the freeze, so that what was sent meanwhile
is answered after it: each such answer must come from an agent, not ``no_available_agent``.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

import pytest

from tests.chaos.support import (
    Load,
    Poller,
    agents_listed,
    bounded,
    echo,
    errors,
    in_parallel,
    paused,
    pick,
    private_redis,
    r3,
    report,
    stopping,
)
from tests.support import gateway, start_agent

INTERVAL, FREEZE, BEFORE = pick((0.5, 2.0, 0.5), (10.0, 40.0, 5.0))
EMPTY = {"no_available_agent", "no_capable_agent"}


@bounded(60, 240)
@pytest.mark.parametrize("registry", ["memory", "redis"])
def test_4_the_gateway_frozen_longer_than_down_after(registry: str) -> None:
    with ExitStack() as stack:
        flags = ["--heartbeat-interval", str(INTERVAL)]
        server = None
        if registry == "redis":
            server = stack.enter_context(private_redis())
            prefix = f"chaos-{os.urandom(4).hex()}"
            flags += ["--registry", server.url, "--registry-prefix", prefix]
        gw = stack.enter_context(gateway(*flags))
        agents = stack.enter_context(stopping([]))
        agents += in_parallel(lambda i: start_agent(gw.url, f"agent://frozen-{i:02d}"), 5)
        ids = {f"agent://frozen-{i:02d}" for i in range(5)}
        body = echo(timeout_ms=(FREEZE + 10) * 1000)
        duration = BEFORE + FREEZE + 3 * INTERVAL + 0.5
        with Load(gw.url, body, rate=20, duration=duration) as load:
            time.sleep(BEFORE)  # the scenario's schedule: some load before the freeze
            with ExitStack() as frozen:
                if server is not None:
                    assert server.popen is not None
                    frozen.enter_context(paused(server.popen.pid))
                frozen.enter_context(paused(gw.popen.pid))
                time.sleep(FREEZE)  # the freeze itself is the scenario
            resumed = time.monotonic()
            # every listing from the resumption on, for three intervals
            with Poller(lambda: agents_listed(gw.url), every=0.05) as table:
                time.sleep(3 * INTERVAL)
    after = [statuses for _, statuses in table.samples]
    expired = {
        eid
        for statuses in after
        for eid in ids
        if statuses.get(eid, "missing") not in ("healthy", "degraded")
    }
    results = load.results
    failed = errors(results)
    empty = sum(n for code, n in failed.items() if code in EMPTY)
    empty_listings = sum(1 for statuses in after if not ids <= statuses.keys())
    met = not expired and empty == 0 and empty_listings == 0
    report(
        "4",
        f"gateway frozen {FREEZE:g} s ({registry} registry), down-after {3 * INTERVAL:g} s",
        {
            "registry": registry,
            "agents_wrongly_expired_pct": r3(100 * len(expired) / len(ids)),
            "expired": sorted(expired),
            "empty_answers": empty,
            "listings_missing_agents": empty_listings,
            "listings_after_resume": len(after),
            "requests": len(results),
            "errors_by_code": dict(failed),
            "answered_after_resume": sum(1 for s in results if s.end >= resumed),
        },
        {"agents_wrongly_expired_pct": "0", "empty_answers": "0"},
        met,
    )
    assert after, table.failures[:3]
    assert not expired, (sorted(expired), after[:3])
    assert empty == 0 and empty_listings == 0, failed
    assert not failed, failed  # every deadline was longer than the freeze
