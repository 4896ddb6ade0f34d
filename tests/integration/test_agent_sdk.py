"""The agent SDK serving deliveries: a real gateway process delivering to a real agent process
(tests/agents/sdk_agent.py) over loopback. Context, dedup by msg_id, the error shapes, and the
trace id in the agent's JSON log lines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib import error, request

import pytest

from tests.agents.sdk_support import (
    Background,
    declare_too_large,
    deliver,
    events,
    key,
    runs,
    send,
    start_sdk_agent,
)
from tests.support import Proc, gateway, http, wait_until

AGENT = "agent://sdk-01"


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway() as proc:
        yield proc


@pytest.fixture(scope="module")
def agent(gw: Proc) -> Iterator[Proc]:
    proc = start_sdk_agent(gw.url, AGENT, workers=4)
    yield proc
    proc.stop()


@pytest.mark.parametrize(
    ("intent", "thread"), [("sdk.echo", "agent-reach-worker"), ("sdk.aecho", "MainThread")]
)
def test_the_handler_sees_the_request_context(
    gw: Proc, agent: Proc, intent: str, thread: str
) -> None:
    msg_id, trace_id = f"msg_{key()}", f"trace_{key()}"
    status, body = send(
        gw.url,
        intent=intent,
        msg_id=msg_id,
        trace_id=trace_id,
        sender="agent://tester-01",
        priority="high",
        payload={"city": "成都"},
        timeout_ms=5000,
    )
    assert status == 200, body
    seen = body["result"]
    assert seen["payload"] == {"city": "成都"}
    assert (seen["msg_id"], seen["trace_id"], seen["intent"]) == (msg_id, trace_id, intent)
    assert (seen["sender"], seen["priority"], seen["attempt"]) == ("agent://tester-01", "high", 1)
    assert seen["endpoint_id"] == AGENT
    # X-Reach-Deadline-Ms is this attempt's timeout (2000 ms for an agent with no history)
    assert 0 < seen["remaining_ms"] <= seen["deadline_ms"] <= 2000
    assert seen["thread"].startswith(thread)  # sync handlers: the agent's own pool


def test_the_trace_id_is_on_the_agents_log_lines_even_from_worker_threads(
    gw: Proc, agent: Proc
) -> None:
    trace_id = f"trace_{key()}"
    status, body = send(gw.url, intent="sdk.echo", trace_id=trace_id, payload={})
    assert status == 200, body
    wanted = ("agent.request", "sdk.echo.work", "agent.answered")
    wait_until(lambda: all(events(agent, e, trace_id=trace_id) for e in wanted), timeout=5)
    work = events(agent, "sdk.echo.work", trace_id=trace_id)
    assert work and work[0]["where"] == "worker thread"  # logged by the handler, in the pool


def test_a_refused_delivery_is_logged_with_its_trace_id(gw: Proc, agent: Proc) -> None:
    """A review: ``agent.invalid_request`` was logged without the trace id the delivery named
    (every SDK line carries it, docs/observing.md)."""
    too_long = f"trace_{key()}"
    status, _ = deliver(agent.url, "sdk.echo", {}, msg_id="m" * 200, trace_id=too_long)
    assert status == 422
    unreadable = f"trace_{key()}"
    req = request.Request(
        agent.url,
        data=b"not json",
        method="POST",
        headers={"Content-Type": "application/json", "X-Reach-Trace-Id": unreadable},
    )
    with pytest.raises(error.HTTPError) as refused:
        request.urlopen(req, timeout=10)
    assert refused.value.code in (400, 422)
    refused.value.close()  # its answer's socket
    for trace_id in (too_long, unreadable):
        wait_until(lambda t=trace_id: events(agent, "agent.invalid_request", trace_id=t), 5)


def test_a_repeated_msg_id_runs_the_handler_once_and_gets_the_same_answer(
    gw: Proc, agent: Proc
) -> None:
    k, msg_id = key(), f"msg_{key()}"
    first = send(gw.url, intent="sdk.count", msg_id=msg_id, payload={"key": k})
    again = send(gw.url, intent="sdk.count", msg_id=msg_id, payload={"key": k})
    assert first[0] == again[0] == 200, (first, again)
    assert first[1]["result"] == again[1]["result"]  # same run, same nonce
    assert first[1]["result"]["run"] == 1
    assert runs(agent.url, k) == 1
    assert events(agent, "agent.duplicate", msg_id=msg_id, answered_from="cached")
    other = send(gw.url, intent="sdk.count", msg_id=f"msg_{key()}", payload={"key": k})
    assert other[1]["result"]["run"] == 2  # another message is another run
    assert runs(agent.url, k) == 2


def test_a_retry_while_the_first_run_is_going_joins_it(gw: Proc, agent: Proc) -> None:
    """The gateway times attempt 1 out (2000 ms per try) and retries the same agent: the
    retry waits for the run already going instead of running the handler again.

    timeout_ms 8000 allows floor((8000 - 1000) / (2000 x 1.2)) = 2 retries."""
    k, msg_id = key(), f"msg_{key()}"
    call = Background(
        lambda: send(gw.url, intent="sdk.hold", msg_id=msg_id, payload={"key": k}, timeout_ms=8000)
    )
    wait_until(lambda: events(agent, "agent.duplicate", msg_id=msg_id), timeout=7)
    (joined,) = events(agent, "agent.duplicate", msg_id=msg_id)
    assert (joined["answered_from"], joined["attempt"]) == ("joined", 2)
    assert deliver(agent.url, "sdk.release", {"keys": [k]})[0] == 200
    status, body = call.join(timeout=10)
    assert status == 200, body
    assert [a["outcome"] for a in body["attempts"]] == ["timeout", "ok"]
    assert body["result"]["run"] == 1
    assert runs(agent.url, k) == 1
    assert len(events(agent, "sdk.hold.entered", key=k)) == 1


def test_runs_left_behind_by_callers_that_gave_up_count_against_max_inflight() -> None:
    """An agent with two workers and ``max_inflight`` 2 (a gateway of its own, so that no other
    agent shares its intents). Two holds of 5 s sent through the gateway with a 1 s deadline
    time out there, and their runs go on (a thread cannot be stopped). A third delivery is
    answered 503 at once instead of queueing behind them; once they end there is room."""
    with gateway() as gw:
        agent = start_sdk_agent(gw.url, "agent://sdk-capped-01", workers=2, max_inflight=2)
        try:
            keys = [key(), key()]
            calls = [
                Background(
                    lambda k=k: send(
                        gw.url, intent="sdk.hold", payload={"key": k, "hold_s": 5}, timeout_ms=1000
                    )
                )
                for k in keys
            ]
            for call in calls:
                status, body = call.join(timeout=10)
                assert (status, body["error"]) == (504, "deadline_exceeded"), body
            assert all(events(agent, "sdk.hold.entered", key=k) for k in keys)
            started = time.monotonic()
            status, body = deliver(agent.url, "sdk.aecho", {})
            took = time.monotonic() - started
            assert (status, body["error"]) == (503, "backend_unavailable"), body
            assert took < 1.0, took  # not queued behind the holds (about 4 s left of them)
            (busy,) = events(agent, "agent.busy")
            assert (busy["max_inflight"], busy["refused"]) == (2, 1)
            # room again once the holds' threads return (5 s after they began)
            wait_until(lambda: deliver(agent.url, "sdk.aecho", {})[0] == 200, timeout=10)
            assert len(events(agent, "sdk.hold.entered")) == 2  # no run of the refused ones
        finally:
            agent.stop()


def test_a_crash_is_a_500_in_the_error_shape_and_runs_again_when_retried(
    gw: Proc, agent: Proc
) -> None:
    # 5000 ms allows exactly one retry, whether a try is 2000 ms or (after the slow run of
    # another test) up to 3000 ms: floor((5000 - 1000) / (per_try x 1.2)) = 1
    k, trace_id = key(), f"trace_{key()}"
    status, body = send(
        gw.url, intent="sdk.crash", payload={"key": k}, trace_id=trace_id, timeout_ms=5000
    )
    assert (status, body["error"]) == (502, "all_attempts_failed"), body
    assert [a["outcome"] for a in body["attempts"]] == ["server_error", "server_error"]
    assert runs(agent.url, k) == 2  # a crash is not remembered: the retry ran it again
    failed = events(agent, "agent.handler_failed", trace_id=trace_id)
    assert len(failed) == 2
    assert "RuntimeError: told to crash" in failed[0]["exc"]  # with the traceback
    code, answer = deliver(agent.url, "sdk.crash", {"key": k})
    assert (code, answer) == (
        500,
        {"ok": False, "error": "handler_failed", "detail": "RuntimeError: told to crash"},
    )


def test_a_rejection_is_a_4xx_the_gateway_passes_back_and_does_not_retry(
    gw: Proc, agent: Proc
) -> None:
    k, msg_id, trace_id = key(), f"msg_{key()}", f"trace_{key()}"
    for _ in range(2):
        status, body = send(
            gw.url, intent="sdk.reject", payload={"key": k}, msg_id=msg_id, trace_id=trace_id
        )
        assert (status, body["error"], body["agent_status"]) == (502, "agent_error", 422), body
        assert body["agent_answer"] == {
            "ok": False,
            "error": "unknown_city",
            "detail": "no such city",
        }
        assert [a["outcome"] for a in body["attempts"]] == ["agent_error"]
    assert runs(agent.url, k) == 1  # a rejection is final: the repeat got the same answer
    assert events(agent, "agent.rejected", trace_id=trace_id, error="unknown_city")


@pytest.mark.parametrize(
    ("method", "raw", "status", "error"),
    [
        ("POST", b"not json", 400, "invalid_request"),
        ("POST", b'{"intent": 5}', 422, "invalid_request"),
        ("POST", b'{"payload": {}}', 422, "invalid_request"),
        ("POST", b'{"intent": "sdk.nothing"}', 404, "unknown_intent"),
        ("GET", None, 405, "method_not_allowed"),
    ],
)
def test_bad_deliveries_get_the_contract_error_shape(
    agent: Proc, method: str, raw: bytes | None, status: int, error: str | None
) -> None:
    code, body = http(method, agent.url, raw=raw)
    assert code == status, body
    assert body["ok"] is False and body["detail"]
    assert body["error"] == error


def test_a_body_over_the_limit_is_refused_from_its_declared_length(agent: Proc) -> None:
    code, body = declare_too_large(agent.url, (1 << 20) + 1)
    assert (code, body["ok"], body["error"]) == (413, False, "payload_too_large")


def test_an_agent_error_never_takes_the_agent_down(gw: Proc, agent: Proc) -> None:
    results: list[Any] = [send(gw.url, intent="sdk.crash", payload={"key": key()}, timeout_ms=100)]
    results.append(http("POST", agent.url, raw=b"\xff\xfe"))
    assert results[0][0] == 502 and results[1][0] == 400
    status, body = send(gw.url, intent="sdk.aecho", payload={"still": "here"})
    assert (status, body["result"]["payload"]) == (200, {"still": "here"})
