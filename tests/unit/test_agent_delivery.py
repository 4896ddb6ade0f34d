"""The agent SDK's transport-agnostic delivery function: bytes and headers in, an answer out
(no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
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
