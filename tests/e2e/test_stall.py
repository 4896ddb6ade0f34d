"""The gateway's own stall (SIGSTOP of the real process) does not demote its agents."""

from __future__ import annotations

import re
import signal
import time

from tests.support import gateway, http, no_agents, status_of, wait_until


@no_agents
def test_a_stopped_gateway_does_not_demote_agents_when_it_resumes() -> None:
    # degraded after 4 s, suspect after 8 s, down after 12 s without a heartbeat
    with gateway("--heartbeat-interval", "4") as gw:
        code, _ = http(
            "POST",
            f"{gw.url}/v1/register",
            {
                "endpoint_id": "agent://stall-01",
                "capabilities": ["stall.t"],
                "endpoint_url": "http://127.0.0.1:9/reach",
            },
        )
        assert code == 200
        registered = time.monotonic()
        gw.popen.send_signal(signal.SIGSTOP)  # like a long GC pause or an overloaded host
        try:
            time.sleep(6.0)  # the stall itself is the scenario: longer than a heartbeat period
        finally:
            gw.popen.send_signal(signal.SIGCONT)
        # 6 s since its last heartbeat by the wall, but the gateway was not listening for ~6 s
        assert status_of(gw.url, "agent://stall-01") == "healthy"
        assert time.monotonic() - registered > 6.0
        events = wait_until(
            lambda: [e for e in gw.log_lines() if e["event"] == "gateway.stalled"], timeout=5
        )
        assert events[0]["lag_s"] > 5.0
        _, metrics = http("GET", f"{gw.url}/metrics")
        credit = float(re.search(r"^agent_reach_stall_credit_seconds (\S+)$", metrics, re.M)[1])
        assert credit > 4.0
        # time the gateway was listening still counts: it is degraded 4 s later
        wait_until(lambda: status_of(gw.url, "agent://stall-01") == "degraded", timeout=8)
