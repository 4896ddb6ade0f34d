"""Hedged requests on real processes: a gateway whose dictionary gives ``hedge_after_ms = 50``
to a tag, two agents of that tag, one slow (1 s) and one fast.

A request that lands on the slow agent first is hedged to the fast one after 50 ms and answered
by it, in well under the slow agent's second: two attempts, the slow one ``cancelled``, the
second ``"hedge": true``. Without the field nothing is hedged; with the retry budget used up
(by failing requests of another tag) the hedge is refused and counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.support import Proc, gateway, http, metric, start_agent

TAG = "test.hedged"
SLOW = "agent://hedge-slow-01"
FAST = "agent://hedge-fast-01"
SLOW_MS = 1000.0
FAILING = [f"agent://hedge-fail-0{i}" for i in range(1, 5)]  # four: retries fail over, no waits


@contextmanager
def serve(tmp_path: Path, hedge: str | None, *, failing: bool = False) -> Iterator[Proc]:
    """A gateway with a dictionary of TAG (``hedge_after_ms = hedge``) and test.failing, the
    slow and the fast agent of TAG and, with ``failing``, four agents answering 500."""
    path = tmp_path / "intents.toml"
    field = "" if hedge is None else f"hedge_after_ms = {hedge}\n"
    path.write_text(f'[[intent]]\ntag = "{TAG}"\n{field}\n[[intent]]\ntag = "test.failing"\n')
    with gateway("--intents", str(path), "--matcher", "none") as gw, ExitStack() as stack:
        starts: list[tuple[str, str, dict[str, Any]]] = [
            (SLOW, "slow", {"intents": TAG, "delay_ms": SLOW_MS}),
            (FAST, "ok", {"intents": TAG}),
        ]
        if failing:
            starts += [(eid, "fail", {"intents": "test.failing"}) for eid in FAILING]
        with ThreadPoolExecutor(len(starts)) as pool:  # in parallel: each takes a while
            futures = [pool.submit(start_agent, gw.url, e, m, **kw) for e, m, kw in starts]
        failed = [error for f in futures if (error := f.exception()) is not None]
        for future in futures:
            if future.exception() is None:
                stack.callback(future.result().stop)
        if failed:
            raise failed[0]
        yield gw


def send(gw: Proc, intent: str = TAG, **body: Any) -> tuple[int, dict[str, Any], float]:
    """(status, answer, seconds the caller waited)."""
    started = time.monotonic()
    status, answer = http("POST", f"{gw.url}/v1/send", {"intent": intent, **body})
    return status, answer, time.monotonic() - started


def landing_on_slow_first(gw: Proc, bound: int = 8) -> tuple[dict[str, Any], float]:
    """The first of at most ``bound`` requests whose first attempt went to the slow agent.

    Both start with no history; the load-aware choice prefers the one with the lower cost, so
    once the fast agent has answered, the slow one (never measured yet) comes next."""
    for i in range(bound):
        status, answer, waited = send(gw, trace_id=f"trace_hedge_{i}")
        assert status == 200, answer
        if answer["attempts"][0]["endpoint_id"] == SLOW:
            return answer, waited
        # it landed on the fast one: answered at once, nothing hedged
        assert answer["attempts"] == [
            {
                "endpoint_id": FAST,
                "outcome": "ok",
                "latency_ms": answer["attempts"][0]["latency_ms"],
            }
        ]
    raise AssertionError(f"none of {bound} requests went to {SLOW} first")


def test_a_request_on_the_slow_agent_is_answered_by_the_hedge_to_the_fast_one(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, "50") as gw:
        answer, waited = landing_on_slow_first(gw)
        assert answer["endpoint_id"] == FAST and answer["result"]["agent"] == FAST
        slow, hedge = answer["attempts"]
        # the contract's outcomes: the loser did not answer in time (the trace says cancelled)
        assert (slow["endpoint_id"], slow["outcome"]) == (SLOW, "timeout")
        assert "hedge" not in slow
        assert (hedge["endpoint_id"], hedge["outcome"], hedge["hedge"]) == (FAST, "ok", True)
        assert waited < 0.6 * SLOW_MS / 1000  # well under the slow agent's second
        assert 50 <= slow["latency_ms"] < 600  # it ran the 50 ms alone, then was cancelled
        # the same request, its second attempt (the agents dedup by msg_id)
        assert answer["result"]["msg_id"] == answer["msg_id"]
        assert answer["result"]["attempt"] == 2
        # the cancelled attempt was released before the answer went out
        status, inflight = http("GET", f"{gw.url}/v1/inflight")
        assert status == 200 and inflight["total"] == 0, inflight
        assert metric(gw, "agent_reach_hedges_total", result="sent") >= 1
        assert metric(gw, "agent_reach_hedges_total", result="won") >= 1
        assert metric(gw, "agent_reach_hedges_total", result="refused") == 0
        status, trace = http("GET", f"{gw.url}/v1/traces/{answer['trace_id']}")
        assert status == 200, trace
        kinds = [
            (e["kind"], e.get("endpoint_id"), e.get("outcome"), e.get("cancelled"))
            for e in trace["events"]
        ]
        assert ("hedge", FAST, None, None) in kinds
        assert ("attempt", SLOW, "timeout", True) in kinds
        assert ("attempt", FAST, "ok", None) in kinds


def test_without_the_field_nothing_is_hedged(tmp_path: Path) -> None:
    with serve(tmp_path, None) as gw:
        answer, waited = landing_on_slow_first(gw)
        assert answer["endpoint_id"] == SLOW
        (attempt,) = answer["attempts"]
        assert attempt["outcome"] == "ok" and "hedge" not in attempt
        assert waited >= SLOW_MS / 1000
        assert metric(gw, "agent_reach_hedges_total") == 0


def test_the_retry_budget_refuses_hedges_once_it_is_used_up(tmp_path: Path) -> None:
    # The budget allows 0.2 x requests + 10/s x 10 s retries in a sliding 10 s window. Failing
    # requests (3 retries each) use it up; after one is refused, the allowance left is the
    # fraction of 0.2 x requests (below 1). The hedged request adds 0.2: it is refused for sure
    # when that leaves it under 1 by a margin (requests % 5 in 1, 2, 3), so the failing ones go
    # on until then.
    with serve(tmp_path, "50", failing=True) as gw:
        started = time.monotonic()
        requests = 0
        for _ in range(8):  # requests of TAG, until one goes to the slow agent first
            for _ in range(200):
                status, answer, _ = send(gw, "test.failing", timeout_ms=30_000)
                requests += 1
                assert status == 502, answer
                if "retry budget is used up" in answer["detail"] and requests % 5 in (1, 2, 3):
                    break
            else:
                raise AssertionError("the failing requests did not use the retry budget up")
            status, answer, waited = send(gw)
            requests += 1
            assert status == 200, answer
            if answer["attempts"][0]["endpoint_id"] == SLOW:
                break
        else:
            raise AssertionError(f"no request of {TAG} went to {SLOW} first")
        # nothing has left the budget's 10 s window yet (else the count above would be off)
        assert time.monotonic() - started < 9.0
        (attempt,) = answer["attempts"]  # not hedged: the slow agent's own answer
        assert (attempt["endpoint_id"], attempt["outcome"]) == (SLOW, "ok")
        assert "hedge" not in attempt and waited >= SLOW_MS / 1000
        assert metric(gw, "agent_reach_hedges_total", result="refused") >= 1
        assert metric(gw, "agent_reach_hedges_total", result="sent") == 0
        assert metric(gw, "agent_reach_retry_budget_exhausted_total") >= 1
        status, trace = http("GET", f"{gw.url}/v1/traces/{answer['trace_id']}")
        assert status == 200, trace
        (note,) = [e for e in trace["events"] if e["kind"] == "hedge"]
        assert (note["sent"], note["reason"]) == (False, "retry budget")
