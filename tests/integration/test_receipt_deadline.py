"""A request's deadline counts from its receipt, not from when the gateway got to it: a request
whose bytes waited in the socket while the gateway's loop was held (SIGSTOP here: a long GC
pause, an overloaded host) has used that time, and one whose deadline ran out meanwhile is
answered ``deadline_exceeded`` as soon as the gateway runs, delivering nothing."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from tests.support import gateway, http, metric, start_agent, wait_until

STOP_S = 1.5  # the stall: longer than the short request's deadline, shorter than the long one's


def test_a_request_that_waited_out_its_deadline_in_the_socket_is_not_delivered() -> None:
    with gateway() as gw:
        agent = start_agent(gw.url, "agent://echo-01")
        try:
            code, _ = http("POST", f"{gw.url}/v1/send", {"intent": "test.echo"})
            assert code == 200
            delivered = metric(gw, "agent_reach_attempts_total", intent="test.echo", outcome="ok")
            got: dict[str, Any] = {}

            def call(name: str, timeout_ms: int) -> None:
                body = {"intent": "test.echo", "timeout_ms": timeout_ms}
                got[name] = http("POST", f"{gw.url}/v1/send", body)
                got[name + "_at"] = time.monotonic()

            gw.popen.send_signal(signal.SIGSTOP)
            try:
                short = threading.Thread(target=call, args=("short", 300))
                long = threading.Thread(target=call, args=("long", 8000))
                short.start()
                long.start()
                time.sleep(STOP_S)  # the stall itself is the scenario
            finally:
                resumed = time.monotonic()
                gw.popen.send_signal(signal.SIGCONT)
            short.join(10)
            long.join(10)
            code, answer = got["short"]
            assert (code, answer["error"]) == (504, "deadline_exceeded"), answer
            assert answer["attempts"] == []
            assert got["short_at"] - resumed < 1.0  # at once, once the gateway runs again
            # its latency counts the wait: from receipt, not from the handler's start
            code, trace = http("GET", f"{gw.url}/v1/traces/{answer['trace_id']}")
            assert code == 200, trace
            ended = next(e for e in trace["events"] if e["kind"] == "answer")
            assert ended["latency_ms"] >= 300, ended
            # the one with room left in its deadline is served, its latency the whole wait
            code, answer = got["long"]
            assert code == 200, answer
            assert answer["latency_ms"] >= 0.5 * STOP_S * 1000, answer
            after = metric(gw, "agent_reach_attempts_total", intent="test.echo", outcome="ok")
            assert after - delivered == 1  # the long one only
            # and a fresh request after the stall is not charged for it
            wait_until(
                lambda: (
                    http("POST", f"{gw.url}/v1/send", {"intent": "test.echo", "timeout_ms": 300})[0]
                    == 200
                ),
                timeout=5,
            )
        finally:
            agent.stop()
