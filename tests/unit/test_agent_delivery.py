"""The agent SDK's transport-agnostic delivery function: bytes and headers in, an answer out
(no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agent_reach.observability.logs import TRACE_ID
from agent_reach.sdk import ReachContext, Reject
from agent_reach.sdk._delivery import Dispatcher, Handler
from agent_reach.sdk.asgi import AsgiDelivery
from agent_reach.testing import FakeClock


@pytest.fixture
async def table() -> AsyncIterator[tuple[Dispatcher, dict[str, Handler], FakeClock]]:
    clock = FakeClock()
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher("agent://unit-01", handlers, workers=2, now=clock.monotonic)
    yield dispatcher, handlers, clock
    await dispatcher.close()


def body(intent: str = "t.run", **fields: Any) -> bytes:
    return json.dumps({"intent": intent, "msg_id": "m1", "trace_id": "t1", **fields}).encode()


def parsed(answer: Any) -> tuple[int, Any]:
    return answer.status, json.loads(answer.body)


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b"not json", 400, None),
        (b"[1]", 422, None),
        (b'{"payload": {}}', 422, "intent"),
        (b'{"intent": 5}', 422, "intent"),
        (b'{"intent": "t.run", "msg_id": 7}', 422, "msg_id"),
    ],
)
async def test_bad_bodies_get_invalid_request_in_the_contract_shape(
    table: Any, raw: bytes, status: int, field: str | None
) -> None:
    dispatcher, _, _ = table
    code, answer = parsed(await dispatcher.deliver(raw, {}))
    assert (code, answer["ok"], answer["error"]) == (status, False, "invalid_request")
    assert answer.get("field") == field
    assert answer["detail"]


async def test_an_unknown_intent_is_404(table: Any) -> None:
    dispatcher, handlers, _ = table
    handlers["t.other"] = lambda payload, ctx: {}
    code, answer = parsed(await dispatcher.deliver(body("t.run"), {}))
    assert (code, answer["error"]) == (404, "unknown_intent")
    assert "agent://unit-01" in answer["detail"]


async def test_the_context_comes_from_the_body_and_the_headers(table: Any) -> None:
    dispatcher, handlers, clock = table
    seen: list[ReachContext] = []

    async def record(payload: Any, ctx: ReachContext) -> Any:
        seen.append(ctx)
        return payload

    handlers["t.run"] = record
    answer = await dispatcher.deliver(
        body(sender="agent://caller-01", priority="high", payload={"a": [1]}),
        {"x-reach-attempt": "2", "x-reach-deadline-ms": "1500"},
    )
    assert parsed(answer) == (200, {"a": [1]})
    (ctx,) = seen
    assert (ctx.msg_id, ctx.trace_id, ctx.intent, ctx.sender, ctx.priority) == (
        "m1",
        "t1",
        "t.run",
        "agent://caller-01",
        "high",
    )
    assert (ctx.attempt, ctx.deadline_ms, ctx.endpoint_id) == (2, 1500, "agent://unit-01")
    assert ctx.deadline_at == clock.monotonic() + 1.5  # taken at arrival, on the agent's clock


async def test_ids_fall_back_to_the_headers_and_a_missing_deadline_is_none(table: Any) -> None:
    dispatcher, handlers, _ = table
    seen: list[ReachContext] = []
    handlers["t.run"] = lambda payload, ctx: seen.append(ctx)
    raw = b'{"intent": "t.run"}'
    headers = {
        "x-reach-msg-id": "m9",
        "x-reach-trace-id": "t9",
        "x-reach-deadline-ms": "soon",
        "x-reach-attempt": "²",  # a digit to str.isdigit, not to int()
    }
    assert parsed(await dispatcher.deliver(raw, headers)) == (200, None)
    (ctx,) = seen
    assert (ctx.msg_id, ctx.trace_id, ctx.attempt, ctx.deadline_ms) == ("m9", "t9", 1, None)
    assert ctx.remaining_s() == float("inf") and not ctx.expired()


async def test_the_trace_id_is_bound_in_sync_and_async_handlers(table: Any) -> None:
    dispatcher, handlers, _ = table

    def sync(payload: Any, ctx: ReachContext) -> Any:
        return [TRACE_ID.get(), threading.current_thread().name]

    async def asy(payload: Any, ctx: ReachContext) -> Any:
        return [TRACE_ID.get(), threading.current_thread().name]

    handlers["t.sync"], handlers["t.async"] = sync, asy
    _, (trace, thread) = parsed(await dispatcher.deliver(body("t.sync"), {}))
    assert trace == "t1" and thread.startswith("agent-reach-worker")
    _, (trace, thread) = parsed(await dispatcher.deliver(body("t.async", msg_id="m2"), {}))
    assert trace == "t1" and thread == threading.current_thread().name
    assert TRACE_ID.get() is None  # unbound again after the delivery


async def test_a_rejection_is_final_and_a_crash_runs_again(table: Any) -> None:
    dispatcher, handlers, _ = table
    runs = {"reject": 0, "crash": 0}

    def reject(payload: Any, ctx: ReachContext) -> Any:
        runs["reject"] += 1
        raise Reject("not here", status=409, code="conflict")

    def crash(payload: Any, ctx: ReachContext) -> Any:
        runs["crash"] += 1
        raise KeyError("city")

    handlers["t.reject"], handlers["t.crash"] = reject, crash
    for _ in range(2):
        assert parsed(await dispatcher.deliver(body("t.reject"), {})) == (
            409,
            {"ok": False, "error": "conflict", "detail": "not here"},
        )
        assert parsed(await dispatcher.deliver(body("t.crash"), {})) == (
            500,
            {"ok": False, "error": "handler_failed", "detail": "KeyError: 'city'"},
        )
    assert runs == {"reject": 1, "crash": 2}


async def test_a_handler_exiting_or_cancelled_within_is_a_500_not_the_agents_end(
    table: Any,
) -> None:
    """A review found that sys.exit() in a sync handler (argparse's or click's error exit)
    came out of the delivery as SystemExit and ended the agent's event loop, and that a
    handler's own cancelled job (concurrent.futures.CancelledError, or an async handler
    awaiting a cancelled task) came out as asyncio.CancelledError: no answer at all (a dropped
    connection, no NATS reply). Each is now the contract's 500 handler_failed (a SystemExit
    on the loop's thread, an async handler's, is left to end the program: a signal handler's
    sys.exit() lands in whatever frame runs)."""
    dispatcher, handlers, _ = table

    def exits(payload: Any, ctx: ReachContext) -> Any:
        sys.exit(2)

    def job_cancelled(payload: Any, ctx: ReachContext) -> Any:
        job: concurrent.futures.Future[int] = concurrent.futures.Future()
        job.cancel()
        return job.result()

    async def task_cancelled(payload: Any, ctx: ReachContext) -> Any:
        inner = asyncio.get_running_loop().create_future()
        inner.cancel()
        return await inner

    handlers.update({"t.exit": exits, "t.job": job_cancelled, "t.task": task_cancelled})
    for intent in ("t.exit", "t.job", "t.task"):
        for msg_id in ("m1", None):  # with dedup and without
            raw = body(intent) if msg_id else body(intent, msg_id=None)
            status, answer = parsed(await dispatcher.deliver(raw, {}))
            assert (status, answer["error"]) == (500, "handler_failed"), (intent, answer)
    # and the dispatcher still serves
    handlers["t.ok"] = lambda payload, ctx: {"fine": True}
    assert parsed(await dispatcher.deliver(body("t.ok"), {})) == (200, {"fine": True})


async def test_a_bad_answer_is_remembered_and_its_work_not_done_again(table: Any) -> None:
    """The handler ran to its end, then answered something that is not JSON: the 500
    bad_answer is remembered for the msg_id, so the gateway's retry gets it again without the
    work being done twice (a review found the handler run again at every retry)."""
    dispatcher, handlers, _ = table
    runs = 0

    def not_json(payload: Any, ctx: ReachContext) -> Any:
        nonlocal runs
        runs += 1
        return object()  # not JSON

    handlers["t.set"] = not_json
    for _ in range(3):
        status, answer = parsed(await dispatcher.deliver(body("t.set"), {}))
        assert (status, answer["error"]) == (500, "bad_answer")
    assert runs == 1


async def test_dedup_is_by_msg_id_and_intent(table: Any) -> None:
    dispatcher, handlers, _ = table
    n = 0

    async def count(payload: Any, ctx: ReachContext) -> int:
        nonlocal n
        n += 1
        return n

    handlers["t.a"], handlers["t.b"] = count, count
    assert parsed(await dispatcher.deliver(body("t.a"), {}))[1] == 1
    assert parsed(await dispatcher.deliver(body("t.a"), {"x-reach-attempt": "2"}))[1] == 1
    assert parsed(await dispatcher.deliver(body("t.b"), {}))[1] == 2  # same msg_id, other intent
    assert parsed(await dispatcher.deliver(body("t.a", msg_id="m2"), {}))[1] == 3
    # another sender reusing a msg_id gets an answer of its own, never this caller's
    other = body("t.a", msg_id="m2", sender="agent://mallory")
    assert parsed(await dispatcher.deliver(other, {}))[1] == 4


async def test_a_msg_id_reused_with_another_payload_is_refused_not_answered_from_dedup(
    table: Any,
) -> None:
    """A review found a msg_id reused for other work answered with the first run's result
    (the dedup keyed on msg_id, intent and sender only): a silent wrong answer. The same
    payload's bytes are a repeat; other bytes are refused 422, in flight and once cached."""
    dispatcher, handlers, _ = table
    gate = asyncio.Event()
    seen: list[Any] = []

    async def work(payload: Any, ctx: ReachContext) -> Any:
        seen.append(payload)
        await gate.wait()
        return {"for": payload}

    handlers["t.run"] = work
    first = asyncio.create_task(dispatcher.deliver(body(payload={"city": "Oslo"}), {}))
    for _ in range(100):  # the first run has begun (bounded loop turns, no sleep for time)
        if seen:
            break
        await asyncio.sleep(0)
    other = body(payload={"city": "Lima"})
    for _ in range(2):  # while the first runs, and once its answer is kept
        async with asyncio.timeout(5.0):  # (joined the first run, it would wait for the gate)
            code, answer = parsed(await dispatcher.deliver(other, {"x-reach-attempt": "2"}))
        assert (code, answer["error"], answer["field"]) == (422, "invalid_request", "msg_id")
        assert "another payload" in answer["detail"]
        gate.set()
        assert parsed(await first) == (200, {"for": {"city": "Oslo"}})
    assert parsed(await dispatcher.deliver(body(payload={"city": "Oslo"}), {})) == (
        200,
        {"for": {"city": "Oslo"}},
    )
    assert seen == [{"city": "Oslo"}]  # run once; the refusals ran nothing
    # the words beside the payload are part of the request too (an A2A text message's
    # payload is {}, its words in intent_text: a review found them left out)
    said = body(msg_id="m7", payload={}, intent_text="weather in Oslo")
    assert parsed(await dispatcher.deliver(said, {})) == (200, {"for": {}})
    again = body(msg_id="m7", payload={}, intent_text="weather in Lima")
    assert parsed(await dispatcher.deliver(again, {}))[0] == 422
    assert parsed(await dispatcher.deliver(said, {})) == (200, {"for": {}})  # a repeat
    # no payload at all is its own fingerprint too, and still decodes as None
    handlers["t.none"] = lambda payload, ctx: {"got": payload}
    assert parsed(await dispatcher.deliver(body("t.none", msg_id="m9"), {})) == (
        200,
        {"got": None},
    )


async def test_an_onward_reach_refused_by_the_gateway_is_final(table: Any) -> None:
    from agent_reach.errors import Forbidden

    dispatcher, handlers, _ = table
    runs = 0

    async def onward(payload: Any, ctx: ReachContext) -> Any:
        nonlocal runs
        runs += 1
        raise Forbidden("no [[reach]] rule allows agent://unit-01 to send 'note.create'")

    handlers["t.run"] = onward
    for _ in range(2):
        code, answer = parsed(await dispatcher.deliver(body(), {}))
        assert (code, answer["error"]) == (424, "forbidden")
        assert "note.create" in answer["detail"]
    assert runs == 1  # final, so remembered: a retry does not run the work again


async def test_an_answer_that_is_not_json_is_a_500(table: Any) -> None:
    dispatcher, handlers, _ = table
    handlers["t.run"] = lambda payload, ctx: object()
    code, answer = parsed(await dispatcher.deliver(body(), {}))
    assert (code, answer["error"]) == (500, "bad_answer")


async def test_an_answer_nested_too_deeply_to_encode_is_a_500(table: Any) -> None:
    """A review found the RecursionError of an answer nested 5,000 deep escaping the
    dispatcher (the server's bare 500 and a traceback, not the contract's answer)."""
    dispatcher, handlers, _ = table
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    handlers["t.run"] = lambda payload, ctx: deep
    code, answer = parsed(await dispatcher.deliver(body(), {}))
    assert (code, answer["ok"], answer["error"]) == (500, False, "bad_answer")
    assert "not JSON" in answer["detail"]


async def test_sync_handlers_run_on_a_bounded_pool(table: Any) -> None:
    dispatcher, handlers, _ = table  # workers=2
    started = threading.Semaphore(0)
    gate = threading.Event()

    def hold(payload: Any, ctx: ReachContext) -> str:
        started.release()
        gate.wait(10)
        return threading.current_thread().name

    handlers["t.hold"] = hold
    tasks = [
        asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id=f"m{i}"), {}))
        for i in range(3)
    ]
    for _ in range(2):
        assert await asyncio.to_thread(started.acquire, timeout=5)
    assert not started.acquire(timeout=0)  # the third waits for a worker: the pool is full
    gate.set()
    names = {parsed(await t)[1] for t in tasks}
    assert len(names) <= 2


async def asgi_call(
    app: AsgiDelivery, messages: list[dict[str, Any]], method: str = "POST"
) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": method, "path": "/reach", "headers": []}
    await app(scope, receive, send)
    return sent


async def test_the_asgi_adapter_answers_from_the_same_dispatcher(table: Any) -> None:
    dispatcher, handlers, _ = table
    handlers["t.run"] = lambda payload, ctx: {"got": payload}
    app = AsgiDelivery(dispatcher, max_body_bytes=256)
    raw = body(payload=[1])
    sent = await asgi_call(
        app,
        [
            {"type": "http.request", "body": raw[:10], "more_body": True},
            {"type": "http.request", "body": raw[10:], "more_body": False},
        ],
    )
    start, end = sent
    assert start["status"] == 200
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(end["body"]) == {"got": [1]}


async def test_the_asgi_adapter_caps_streamed_bodies_and_refuses_other_methods(
    table: Any,
) -> None:
    dispatcher, handlers, _ = table
    handlers["t.run"] = lambda payload, ctx: pytest.fail("must not run")
    app = AsgiDelivery(dispatcher, max_body_bytes=64)
    chunks = [{"type": "http.request", "body": b"x" * 40, "more_body": True}] * 2
    start, end = await asgi_call(app, chunks)  # no content-length: counted while read
    assert (start["status"], json.loads(end["body"])["error"]) == (413, "payload_too_large")
    start, end = await asgi_call(app, [], method="GET")
    assert (start["status"], json.loads(end["body"])["error"]) == (405, "method_not_allowed")
    assert (b"allow", b"POST") in start["headers"]
    assert await asgi_call(app, [{"type": "http.disconnect"}]) == []  # the client went away
    with pytest.raises(RuntimeError, match="serves HTTP"):
        await app({"type": "websocket"}, None, None)  # type: ignore[arg-type]


async def turns_until(done: Callable[[], bool], turns: int = 1000) -> None:
    """Give the event loop up to ``turns`` turns for ``done`` to come true (no sleeping)."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not done after {turns} turns of the loop")


def test_max_inflight_defaults_to_the_larger_of_four_runs_a_worker_and_64() -> None:
    assert Dispatcher("agent://unit-01", {}, workers=2).max_inflight == 64
    assert Dispatcher("agent://unit-01", {}, workers=32).max_inflight == 128
    assert Dispatcher("agent://unit-01", {}, max_inflight=3).max_inflight == 3
    with pytest.raises(ValueError, match="max_inflight"):
        Dispatcher("agent://unit-01", {}, max_inflight=0)


async def test_past_max_inflight_runs_a_new_run_is_refused_at_once_and_a_duplicate_joins() -> None:
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher("agent://unit-01", handlers, workers=2, max_inflight=2)
    gate, runs = asyncio.Event(), []

    async def hold(payload: Any, ctx: ReachContext) -> str:
        runs.append(ctx.msg_id)
        await gate.wait()
        return ctx.msg_id

    handlers["t.hold"] = hold
    try:
        held = [
            asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id=m), {}))
            for m in ("m1", "m2")
        ]
        await turns_until(lambda: len(runs) == 2)
        assert dispatcher.in_hand == 2
        code, answer = parsed(await dispatcher.deliver(body("t.hold", msg_id="m3"), {}))
        assert (code, answer["error"]) == (503, "backend_unavailable")
        assert "agent://unit-01 has 2 runs in hand" in answer["detail"]
        assert runs == ["m1", "m2"] and dispatcher.busy_answers == 1  # m3 never ran
        joined = asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id="m1"), {}))
        gate.set()
        assert [parsed(await t) for t in (*held, joined)] == [(200, "m1"), (200, "m2"), (200, "m1")]
        assert dispatcher.in_hand == 0
        # the refusal was not remembered: m3 delivered again, now with room, runs
        assert parsed(await dispatcher.deliver(body("t.hold", msg_id="m3"), {})) == (200, "m3")
    finally:
        await dispatcher.close()


async def test_a_sync_callable_returning_async_work_counts_in_hand_until_that_ends() -> None:
    """``lambda payload, ctx: work(payload)`` runs on a worker thread and returns a coroutine,
    which the dispatcher awaits. A review found the run ended when the thread returned: the
    async work ran outside max_inflight. It counts until awaited to the end; and when its
    delivery goes before the thread returns, the coroutine is closed and the run ended."""
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher("agent://unit-01", handlers, workers=2, max_inflight=1)
    gate, runs = asyncio.Event(), []

    async def work(payload: Any) -> Any:
        runs.append(payload)
        await gate.wait()
        return payload

    handlers["t.wrap"] = lambda payload, ctx: work(payload)
    try:
        held = asyncio.create_task(dispatcher.deliver(body("t.wrap", payload=1), {}))
        await turns_until(lambda: runs == [1])
        assert dispatcher.in_hand == 1
        async with asyncio.timeout(5.0):
            code, answer = parsed(await dispatcher.deliver(body("t.wrap", msg_id="m2"), {}))
        assert (code, answer["error"]) == (503, "backend_unavailable")
        gate.set()
        assert parsed(await held) == (200, 1)
        assert dispatcher.in_hand == 0
        # no msg_id: the delivery's own task awaits the thread; cancelled before it returns
        entered, release = threading.Event(), threading.Event()
        coroutines: list[Any] = []

        def slow_wrap(payload: Any, ctx: ReachContext) -> Any:
            entered.set()
            release.wait(5.0)
            coroutines.append(work(payload))
            return coroutines[-1]

        handlers["t.slow"] = slow_wrap
        gone = asyncio.create_task(dispatcher.deliver(body("t.slow", msg_id=""), {}))
        await asyncio.to_thread(entered.wait, 5.0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert dispatcher.in_hand == 1  # the thread still runs
        release.set()
        for _ in range(500):  # the worker thread returns (a bounded wait for it, 5 s at most)
            if dispatcher.in_hand == 0:
                break
            await asyncio.sleep(0.01)
        assert dispatcher.in_hand == 0
        assert coroutines and coroutines[0].cr_frame is None  # closed, never run
    finally:
        await dispatcher.close()


async def test_a_sync_run_whose_caller_gave_up_counts_until_its_thread_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_reach")
    clock = FakeClock()
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher(
        "agent://unit-01", handlers, workers=1, max_inflight=2, now=clock.monotonic
    )
    started, gate = threading.Event(), threading.Event()

    def hold(payload: Any, ctx: ReachContext) -> str:
        started.set()
        gate.wait(10)
        return ctx.msg_id

    handlers["t.hold"] = hold
    raw = b'{"intent": "t.hold"}'  # no msg_id: nothing shields the run from its caller
    try:
        running = asyncio.create_task(dispatcher.deliver(raw, {"x-reach-deadline-ms": "1000"}))
        assert await asyncio.to_thread(started.wait, 5)
        queued = asyncio.create_task(dispatcher.deliver(raw, {}))
        await turns_until(lambda: dispatcher.in_hand == 2)
        # the queued run's caller gives up: its run never starts, and its room is free again
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert dispatcher.in_hand == 1
        # the running one's caller gives up too: its thread goes on, and so does its count
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert dispatcher.in_hand == 1
        waiting = asyncio.create_task(dispatcher.deliver(raw, {}))
        await turns_until(lambda: dispatcher.in_hand == 2)
        clock.advance(2.0)  # the orphan's deadline has passed: the refusal's line says so
        code, answer = parsed(await dispatcher.deliver(raw, {}))  # the orphan holds a place
        assert (code, answer["error"]) == (503, "backend_unavailable")
        (busy,) = [r for r in caplog.records if r.getMessage() == "agent.busy"]
        assert busy.data == {  # type: ignore[attr-defined]
            "refused": 1,
            "max_inflight": 2,
            "late": 1,  # the orphan, past its deadline; the queued one has none
            "endpoint_id": "agent://unit-01",
            "intent": "t.hold",
            "msg_id": "",
        }
        gate.set()
        assert (await waiting).status == 200
        assert dispatcher.in_hand == 0
    finally:
        gate.set()
        await dispatcher.close()


async def test_a_queued_sync_run_with_a_msg_id_outlives_its_caller_and_keeps_its_place() -> None:
    """A gateway's deliveries carry a msg_id: their runs are shielded for a retry to join, so
    a run still queued for a worker when its caller goes keeps its place, and then runs."""
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher("agent://unit-01", handlers, workers=1, max_inflight=2)
    started, gate, ran = threading.Event(), threading.Event(), []

    def hold(payload: Any, ctx: ReachContext) -> str:
        started.set()
        gate.wait(10)
        ran.append(ctx.msg_id)
        return ctx.msg_id

    handlers["t.hold"] = hold
    try:
        first = asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id="m1"), {}))
        assert await asyncio.to_thread(started.wait, 5)
        queued = asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id="m2"), {}))
        await turns_until(lambda: dispatcher.in_hand == 2)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert dispatcher.in_hand == 2  # its run goes on
        code, _ = parsed(await dispatcher.deliver(body("t.hold", msg_id="m3"), {}))
        assert code == 503
        gate.set()
        assert parsed(await first) == (200, "m1")
        # the retry of m2 joins (or finds) the run its first caller left: it ran once
        assert parsed(await dispatcher.deliver(body("t.hold", msg_id="m2"), {})) == (200, "m2")
        assert ran == ["m1", "m2"] and dispatcher.in_hand == 0
    finally:
        gate.set()
        await dispatcher.close()


# --- deadlines: no run for callers that have gone ----------------------------------------------


@pytest.fixture
async def one_worker() -> AsyncIterator[tuple[Dispatcher, dict[str, Handler], FakeClock]]:
    clock = FakeClock()
    handlers: dict[str, Handler] = {}
    dispatcher = Dispatcher("agent://unit-01", handlers, workers=1, now=clock.monotonic)
    yield dispatcher, handlers, clock
    await dispatcher.close()


class Held:
    """A sync handler that records each run and holds its worker until ``gate`` is set."""

    def __init__(self) -> None:
        self.started, self.gate, self.ran = threading.Event(), threading.Event(), []

    def __call__(self, payload: Any, ctx: ReachContext) -> str:
        self.ran.append(ctx.msg_id)
        self.started.set()
        self.gate.wait(10)
        return ctx.msg_id


async def test_a_sync_run_whose_deadline_passed_while_it_waited_for_a_worker_is_not_run(
    one_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_reach")
    dispatcher, handlers, clock = one_worker
    held = handlers["t.hold"] = Held()
    try:
        first = asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id="m1"), {}))
        assert await asyncio.to_thread(held.started.wait, 5)  # m1 has the only worker
        queued = [
            asyncio.create_task(
                dispatcher.deliver(body("t.hold", msg_id=m), {"x-reach-deadline-ms": "100"})
            )
            for m in ("m2", "m3")
        ]
        await turns_until(lambda: dispatcher.in_hand == 3)
        clock.advance(0.2)  # m1 holds the worker past their deadline: their callers have gone
        held.gate.set()
        assert parsed(await first) == (200, "m1")
        for task in queued:
            code, answer = parsed(await task)
            assert (code, answer["error"]) == (503, "backend_unavailable")
            assert "not run" in answer["detail"]
        assert held.ran == ["m1"] and dispatcher.late_answers == 2 and dispatcher.in_hand == 0
        # one line a second at most: m3's is held back
        (line,) = [r for r in caplog.records if r.getMessage() == "agent.deadline_passed"]
        assert line.data["msg_id"] == "m2"  # type: ignore[attr-defined]
        # a 503 is not remembered: m2 delivered again, with time left, runs
        again = await dispatcher.deliver(
            body("t.hold", msg_id="m2"), {"x-reach-deadline-ms": "1000"}
        )
        assert parsed(again) == (200, "m2") and held.ran == ["m1", "m2"]
    finally:
        held.gate.set()


async def test_a_retry_that_joins_a_queued_run_keeps_it_for_its_own_deadline(
    one_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_reach")
    dispatcher, handlers, clock = one_worker
    held = handlers["t.hold"] = Held()
    try:
        first = asyncio.create_task(dispatcher.deliver(body("t.hold", msg_id="m1"), {}))
        assert await asyncio.to_thread(held.started.wait, 5)
        queued = asyncio.create_task(
            dispatcher.deliver(body("t.hold", msg_id="m2"), {"x-reach-deadline-ms": "100"})
        )
        await turns_until(lambda: dispatcher.in_hand == 2)
        clock.advance(0.2)  # the first attempt's caller has gone; its retry comes, and waits
        retry = asyncio.create_task(
            dispatcher.deliver(
                body("t.hold", msg_id="m2"), {"x-reach-deadline-ms": "1000", "x-reach-attempt": "2"}
            )
        )
        # joined (and logged so) before the worker is let go
        await turns_until(lambda: "agent.duplicate" in [r.getMessage() for r in caplog.records])
        held.gate.set()
        assert parsed(await first) == (200, "m1")
        assert [parsed(await t) for t in (queued, retry)] == [(200, "m2"), (200, "m2")]
        assert held.ran == ["m1", "m2"] and dispatcher.late_answers == 0
    finally:
        held.gate.set()


async def test_an_async_run_whose_deadline_passed_before_it_started_is_not_run(
    table: Any,
) -> None:
    dispatcher, handlers, clock = table
    ran: list[str] = []

    async def hog(payload: Any, ctx: ReachContext) -> str:
        clock.advance(0.2)  # as if it blocked the event loop for 200 ms
        return "hogged"

    async def quick(payload: Any, ctx: ReachContext) -> str:
        ran.append(ctx.msg_id)
        return ctx.msg_id

    handlers["t.hog"], handlers["t.quick"] = hog, quick
    # each run is a task of its own (msg_ids): the hog's runs first, the quick one's after it
    hogging = asyncio.create_task(dispatcher.deliver(body("t.hog", msg_id="h1"), {}))
    late = asyncio.create_task(
        dispatcher.deliver(body("t.quick", msg_id="q1"), {"x-reach-deadline-ms": "100"})
    )
    assert parsed(await hogging) == (200, "hogged")
    code, answer = parsed(await late)
    assert (code, answer["error"]) == (503, "backend_unavailable") and ran == []
    # with time left it runs (the 503 was not remembered)
    again = await dispatcher.deliver(body("t.quick", msg_id="q1"), {"x-reach-deadline-ms": "100"})
    assert parsed(again) == (200, "q1") and ran == ["q1"]
