"""The A2A transport (src/agent_reach/transport/a2a.py), on 127.0.0.1.

(a) Against real a2a-sdk agents (tests/agents/a2a_agent.py, one process per mode, started when
first needed and kept for the module): what the agent saw of a delivery (its data part and the
message metadata, the follow-up's ids) and what each of its answers comes to.

(b) Against a small aiohttp server answering canned JSON-RPC bodies: the request as sent, and
the mapping of every kind of answer (error codes, malformed responses, what HTTP says).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from aiohttp import web

from agent_reach.core.model import Outcome
from agent_reach.core.netguard import AddressGuard
from agent_reach.errors import InternalError
from agent_reach.transport import Delivery, HttpTransport, TransportMux
from agent_reach.transport.a2a import A2aTransport
from agent_reach.wire.bodies import DeliveryBody
from tests.support import ROOT, Proc, _start

AGENT = ROOT / "tests" / "agents" / "a2a_agent.py"
MAX_BYTES = 16384  # the transport's answer-size cap in these tests
PAYLOAD = b'{"city": "Chengdu", "days": 3}'
HEADERS = {
    "X-Reach-Trace-Id": "trace_a2a",
    "X-Reach-Msg-Id": "msg_a2a",
    "X-Reach-Attempt": "1",
    "X-Reach-Deadline-Ms": "1500",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
}
FOLLOW_UP = {"X-Reach-A2A-Context-Id": "ctx-given", "X-Reach-A2A-Task-Id": "task-given"}


def delivery_body(payload: bytes = PAYLOAD, **fields: Any) -> bytes:
    """A v1 delivery body as the gateway sends it, with a fresh msg_id and trace_id."""
    values: dict[str, Any] = {
        "msg_id": f"msg_{secrets.token_hex(6)}",
        "trace_id": f"trace_{secrets.token_hex(6)}",
        "sender": "agent://caller",
        "recipient_hint": None,
        "intent": "weather.forecast",
        "payload": msgspec.Raw(payload),
        "priority": "normal",
        "timeout_ms": 1500,
        **fields,
    }
    return msgspec.json.encode(DeliveryBody(**values))


def sent(body: bytes) -> DeliveryBody:
    return msgspec.json.decode(body, type=DeliveryBody)


def result_of(got: Delivery) -> dict[str, Any]:
    assert got.outcome is Outcome.OK, got
    assert got.body is not None
    out: dict[str, Any] = json.loads(got.body)
    return out


def seen_of(result: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The agent's echo text and its account of what arrived (a Message's or a Task's)."""
    if "message" in result:
        parts = result["message"]["parts"]
    else:
        parts = result["task"]["artifacts"][0]["parts"]
    text = next(p["text"] for p in parts if "text" in p)
    return text, next(p["data"] for p in parts if "data" in p)


@pytest.fixture
async def a2a() -> AsyncIterator[A2aTransport]:
    transport = A2aTransport(HttpTransport(max_response_bytes=MAX_BYTES))
    await transport.start()
    try:
        yield transport
    finally:
        await transport.close()


# -- (a) real a2a-sdk agents ----------------------------------------------------------------


@dataclass
class Agents:
    """Real agent processes by mode, each started on first use."""

    procs: dict[str, Proc] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)

    def start(self, mode: str, *flags: str) -> tuple[Proc, str]:
        """A new agent process and its endpoint URL (``a2a+`` and its card's JSON-RPC URL)."""
        proc = _start([sys.executable, str(AGENT), "--name", f"a2a-{mode}", "--mode", mode, *flags])
        with urllib.request.urlopen(proc.url, timeout=5) as resp:
            card = json.load(resp)
        (rpc,) = [
            i["url"]
            for i in card["supportedInterfaces"]
            if i["protocolBinding"] == "JSONRPC" and i["protocolVersion"] == "1.0"
        ]
        return proc, f"a2a+{rpc}"

    def __call__(self, mode: str, *flags: str) -> tuple[Proc, str]:
        if mode not in self.procs:
            self.procs[mode], self.endpoints[mode] = self.start(mode, *flags)
        return self.procs[mode], self.endpoints[mode]


@pytest.fixture(scope="module")
def agents() -> Iterator[Agents]:
    held = Agents()
    try:
        yield held
    finally:
        for proc in held.procs.values():
            assert proc.stop() == 0, proc.log_path.read_text()[-2000:]  # SIGTERM: a clean exit


async def test_a_message_answer_is_ok_with_what_the_agent_saw(
    agents: Agents, a2a: A2aTransport
) -> None:
    proc, url = agents("message")
    body = delivery_body()
    got = await a2a.deliver(url, body, HEADERS, 5.0)
    assert (got.status, got.reached, got.eject) == (200, True, False)
    result = result_of(got)
    assert list(result) == ["message"]
    assert result["message"]["role"] == "ROLE_AGENT"
    text, seen = seen_of(result)
    assert text == "echo: "
    assert (seen["agent"], int(seen["pid"])) == ("a2a-message", proc.popen.pid)
    assert seen["parts"] == ["data"]
    assert seen["data"] == {"city": "Chengdu", "days": 3}
    d = sent(body)
    assert seen["metadata"] == {
        "intent": "weather.forecast",
        "msg_id": d.msg_id,
        "trace_id": d.trace_id,
        "sender": "agent://caller",
        "deadline_ms": 1500,
    }
    assert (seen["context_id"], seen["task_id"]) == (None, None)  # no follow-up: none sent
    # a retry's attempt has less than the request's timeout: the agent is told what it has
    # (a review: it was told the whole 1,500 ms on every attempt)
    _, seen = seen_of(result_of(await a2a.deliver(url, body, HEADERS, 0.8)))
    assert seen["metadata"]["deadline_ms"] == 800


async def test_a_task_answer_is_ok_with_the_task(agents: Agents, a2a: A2aTransport) -> None:
    _, url = agents("task", "--rpc-path", "/rpc/a2a")
    assert url.endswith("/rpc/a2a")
    body = delivery_body(requested_intent="weather")
    result = result_of(await a2a.deliver(url, body, HEADERS, 5.0))
    assert list(result) == ["task"]
    task = result["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["name"] == "answer"
    assert task["history"][0]["messageId"] == sent(body).msg_id
    _, seen = seen_of(result)
    assert seen["data"] == {"city": "Chengdu", "days": 3}
    assert seen["metadata"]["requested_intent"] == "weather"
    assert seen["metadata"]["msg_id"] == sent(body).msg_id
    assert "intent_text" not in seen["metadata"]


async def test_words_with_an_empty_payload_go_as_a_text_part(
    agents: Agents, a2a: A2aTransport
) -> None:
    _, url = agents("message")
    words = "what is the weather in Chengdu tomorrow"
    body = delivery_body(b"{ }", intent_text=words, sender=None)
    text, seen = seen_of(result_of(await a2a.deliver(url, body, HEADERS, 5.0)))
    assert text == f"echo: {words}"
    assert (seen["parts"], seen["data"]) == (["text"], None)
    assert seen["metadata"]["intent_text"] == words
    assert "sender" not in seen["metadata"]  # None: left out
    # words with a payload: the payload goes, the words stay in the metadata
    body = delivery_body(intent_text=words)
    text, seen = seen_of(result_of(await a2a.deliver(url, body, HEADERS, 5.0)))
    assert (text, seen["parts"]) == ("echo: ", ["data"])
    assert seen["data"] == {"city": "Chengdu", "days": 3}
    assert seen["metadata"]["intent_text"] == words


async def test_a_follow_up_carries_its_context_and_task_ids(
    agents: Agents, a2a: A2aTransport
) -> None:
    _, url = agents("input")  # asks for more first, completes on the follow-up
    first = result_of(await a2a.deliver(url, delivery_body(), HEADERS, 5.0))["task"]
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    ids = {"X-Reach-A2A-Context-Id": first["contextId"], "X-Reach-A2A-Task-Id": first["id"]}
    result = result_of(await a2a.deliver(url, delivery_body(), {**HEADERS, **ids}, 5.0))
    assert (result["task"]["id"], result["task"]["status"]["state"]) == (
        first["id"],
        "TASK_STATE_COMPLETED",
    )
    _, seen = seen_of(result)
    assert (seen["context_id"], seen["task_id"]) == (first["contextId"], first["id"])
    # a context alone (a conversation, no task): the agent answers in it
    _, url = agents("message")
    only = {"X-Reach-A2A-Context-Id": "ctx-7"}
    result = result_of(await a2a.deliver(url, delivery_body(), {**HEADERS, **only}, 5.0))
    assert result["message"]["contextId"] == "ctx-7"
    _, seen = seen_of(result)
    assert (seen["context_id"], seen["task_id"]) == ("ctx-7", None)


async def test_a_follow_up_to_a_task_the_agent_does_not_have_is_an_agent_error(
    agents: Agents, a2a: A2aTransport
) -> None:
    _, url = agents("message")
    gone = {"X-Reach-A2A-Task-Id": "no-such-task"}
    got = await a2a.deliver(url, delivery_body(), {**HEADERS, **gone}, 5.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert "JSON-RPC error -32001 (task not found)" in got.detail
    assert got.body is not None and json.loads(got.body)["code"] == -32001


async def test_an_internal_error_is_a_server_error(agents: Agents, a2a: A2aTransport) -> None:
    _, url = agents("fail")
    got = await a2a.deliver(url, delivery_body(), HEADERS, 5.0)
    assert got.outcome is Outcome.SERVER_ERROR, got
    assert (got.status, got.reached, got.eject) == (200, True, False)
    assert got.detail == "agent answered JSON-RPC error -32603 (internal error): scripted failure"
    assert got.body is not None
    error = json.loads(got.body)
    assert (error["code"], error["message"]) == (-32603, "scripted failure")
    assert error["data"][0]["reason"] == "INTERNAL_ERROR"  # the error object, whole


async def test_invalid_params_is_an_agent_error(agents: Agents, a2a: A2aTransport) -> None:
    _, url = agents("reject")
    got = await a2a.deliver(url, delivery_body(), HEADERS, 5.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert got.status == 200
    assert got.detail.startswith("agent answered JSON-RPC error -32602 (invalid params)")
    assert got.body is not None and json.loads(got.body)["code"] == -32602


async def test_a_hanging_agent_times_out_within_the_timeout(
    agents: Agents, a2a: A2aTransport
) -> None:
    _, url = agents("hang")
    started = time.monotonic()
    got = await a2a.deliver(url, delivery_body(), HEADERS, 0.4)
    took = time.monotonic() - started
    assert got.outcome is Outcome.TIMEOUT, got
    assert 0.39 <= took < 0.4 + 0.5, took


async def test_a_slow_agent_is_waited_for_within_the_timeout(
    agents: Agents, a2a: A2aTransport
) -> None:
    _, url = agents("slow", "--delay-ms", "300")
    started = time.monotonic()
    got = await a2a.deliver(url, delivery_body(), HEADERS, 5.0)
    took = time.monotonic() - started
    assert got.outcome is Outcome.OK, got
    assert took >= 0.3, took
    assert (await a2a.deliver(url, delivery_body(), HEADERS, 0.1)).outcome is Outcome.TIMEOUT


async def test_a_stopped_agent_is_a_connect_error(agents: Agents, a2a: A2aTransport) -> None:
    proc, url = agents.start("message")
    try:
        assert (await a2a.deliver(url, delivery_body(), HEADERS, 5.0)).outcome is Outcome.OK
    finally:
        assert proc.stop() == 0
    got = await a2a.deliver(url, delivery_body(), HEADERS, 5.0)
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert (got.reached, got.eject) == (False, True)


# -- (b) canned JSON-RPC answers --------------------------------------------------------------


@dataclass
class Seen:
    """One request as the canned server received it."""

    headers: dict[str, str]
    body: Any


Answer = Callable[[Any], tuple[int, bytes]]  # the request's id -> (HTTP status, body)


def rpc(req_id: Any, **members: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": req_id, **members}).encode()


def error(req_id: Any, code: Any, message: str = "scripted", **extra: Any) -> bytes:
    return rpc(req_id, error={"code": code, "message": message, **extra})


MESSAGE = {"message": {"messageId": "m-2", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}
# a result with odd spacing: it must come back byte for byte
EXACT = (
    b'{"message" : { "messageId": "m-2",  "role": "ROLE_AGENT", "parts": [{"text": "\\u00e9"}]} }'
)
CANNED: dict[str, Answer] = {
    "message": lambda i: (200, rpc(i, result=MESSAGE)),
    "exact": lambda i: (
        200,
        b'{"jsonrpc": "2.0", "id": ' + json.dumps(i).encode() + b', "result":  ' + EXACT + b"}",
    ),
    "timed": lambda i: (200, rpc(i, result=MESSAGE)),
    "timed-error": lambda i: (200, error(i, -32603)),
    "null-id-error": lambda i: (200, error(None, -32700, "Parse error")),
    "long-error": lambda i: (200, error(i, -32602, "line\n" * 1000)),
    "old-agent": lambda i: (200, error(i, -32601, "Method not found")),
    # malformed answers
    "not-json": lambda i: (200, b"hello, not JSON"),
    "array": lambda i: (200, b"[1, 2]"),
    "no-version": lambda i: (200, json.dumps({"id": i, "result": MESSAGE}).encode()),
    "version-1": lambda i: (
        200,
        json.dumps({"jsonrpc": "1.0", "id": i, "result": MESSAGE}).encode(),
    ),
    "neither": lambda i: (200, rpc(i)),
    "both": lambda i: (200, rpc(i, result=MESSAGE, error={"code": -32603, "message": "x"})),
    "other-id": lambda i: (200, rpc("someone-else", result=MESSAGE)),
    "numeric-id": lambda i: (200, rpc(7, result=MESSAGE)),
    "other-id-error": lambda i: (200, error("someone-else", -32603)),
    "result-null": lambda i: (200, rpc(i, result=None)),
    "result-empty": lambda i: (200, rpc(i, result={})),
    "result-both": lambda i: (200, rpc(i, result={**MESSAGE, "task": {"id": "t"}})),
    "result-kind": lambda i: (200, rpc(i, result={"kind": "message", "parts": []})),  # v0.3
    "result-text": lambda i: (200, rpc(i, result={"message": "hi"})),
    "error-no-code": lambda i: (200, rpc(i, error={"message": "x"})),
    "error-float-code": lambda i: (200, error(i, -32603.0)),
    "error-text": lambda i: (200, rpc(i, error="boom")),
    # what HTTP says first
    "http-500": lambda i: (500, error(i, -32603)),
    "http-404": lambda i: (404, b'{"detail": "Not Found"}'),
    "big": lambda i: (200, rpc(i, result={"message": {"parts": [{"text": "x" * MAX_BYTES}]}})),
}


@dataclass
class Canned:
    """The canned server: ``url(case)`` is an ``a2a+http`` endpoint answering that case."""

    url: Callable[[str], str]
    seen: list[Seen]


@pytest.fixture
async def canned() -> AsyncIterator[Canned]:
    seen: list[Seen] = []

    async def handle(request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw)
        seen.append(Seen(dict(request.headers), body))
        name = request.match_info["case"]
        if name.startswith("code"):
            status, data = 200, error(body["id"], int(name.removeprefix("code")))
        else:
            status, data = CANNED[name](body.get("id"))
        headers = {"Server-Timing": "handle;dur=4.5"} if name.startswith("timed") else {}
        return web.Response(
            body=data, status=status, content_type="application/json", headers=headers
        )

    app = web.Application()
    app.router.add_post("/rpc/{case}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Canned(lambda case: f"a2a+http://127.0.0.1:{port}/rpc/{case}", seen)
    finally:
        await runner.cleanup()


async def test_the_request_is_a_send_message_with_the_a2a_headers(
    canned: Canned, a2a: A2aTransport
) -> None:
    body = delivery_body()
    d = sent(body)
    got = await a2a.deliver(canned.url("message"), body, {**HEADERS, **FOLLOW_UP}, 2.0)
    assert got.outcome is Outcome.OK, got
    (seen,) = canned.seen
    assert seen.body == {
        "jsonrpc": "2.0",
        "id": d.msg_id,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": d.msg_id,
                "role": "ROLE_USER",
                "parts": [
                    {"data": {"city": "Chengdu", "days": 3}, "mediaType": "application/json"}
                ],
                "metadata": {
                    "intent": "weather.forecast",
                    "msg_id": d.msg_id,
                    "trace_id": d.trace_id,
                    "sender": "agent://caller",
                    "deadline_ms": 1500,
                },
                "contextId": "ctx-given",
                "taskId": "task-given",
            }
        },
    }
    assert {k: seen.headers.get(k) for k in HEADERS} == HEADERS
    assert seen.headers["A2A-Version"] == "1.0"
    assert seen.headers["Content-Type"] == "application/json"
    assert not [k for k in seen.headers if k.lower().startswith("x-reach-a2a-")]


async def test_an_ok_result_comes_back_byte_for_byte(canned: Canned, a2a: A2aTransport) -> None:
    got = await a2a.deliver(canned.url("exact"), delivery_body(), HEADERS, 2.0)
    assert got.outcome is Outcome.OK, got
    assert got.body == EXACT
    assert (got.status, got.detail, got.agent_ms) == (200, "", None)


SERVER_CODES = [-32603, -32006, -32000, -32010, -32050, -32099]
AGENT_CODES = [-32700, -32600, -32601, -32602, -32001, -32002, -32003, -32004, -32005, -32007]
AGENT_CODES += [-32008, -32009, -32100, -31999, -32768, 0, 1, -1, 404]


@pytest.mark.parametrize(
    ("code", "outcome"),
    [(c, Outcome.SERVER_ERROR) for c in SERVER_CODES]
    + [(c, Outcome.AGENT_ERROR) for c in AGENT_CODES],
)
async def test_a_json_rpc_error_maps_by_its_code(
    canned: Canned, a2a: A2aTransport, code: int, outcome: Outcome
) -> None:
    got = await a2a.deliver(canned.url(f"code{code}"), delivery_body(), HEADERS, 2.0)
    assert got.outcome is outcome, got
    assert (got.status, got.reached, got.eject) == (200, True, False)
    assert f"JSON-RPC error {code}" in got.detail
    assert got.detail.endswith("scripted") or "A2A 1.0" in got.detail, got.detail
    assert got.body is not None
    assert json.loads(got.body) == {"code": code, "message": "scripted"}


async def test_what_the_http_delivery_knew_is_kept(canned: Canned, a2a: A2aTransport) -> None:
    ok = await a2a.deliver(canned.url("timed"), delivery_body(), HEADERS, 2.0)
    assert (ok.outcome, ok.agent_ms) == (Outcome.OK, 4.5), ok
    bad = await a2a.deliver(canned.url("timed-error"), delivery_body(), HEADERS, 2.0)
    assert (bad.outcome, bad.agent_ms) == (Outcome.SERVER_ERROR, 4.5), bad


async def test_an_error_that_could_not_name_the_request_is_still_mapped(
    canned: Canned, a2a: A2aTransport
) -> None:
    got = await a2a.deliver(canned.url("null-id-error"), delivery_body(), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert "JSON-RPC error -32700 (parse error): Parse error" in got.detail


async def test_details_are_bounded_and_hint_at_an_old_agent(
    canned: Canned, a2a: A2aTransport
) -> None:
    got = await a2a.deliver(canned.url("long-error"), delivery_body(), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert len(got.detail) < 300 and "\n" not in got.detail, got.detail
    assert got.body is not None and len(json.loads(got.body)["message"]) == 5000  # whole
    old = await a2a.deliver(canned.url("old-agent"), delivery_body(), HEADERS, 2.0)
    assert "does the agent speak A2A 1.0?" in old.detail, old


@pytest.mark.parametrize(
    ("case", "detail"),
    [
        ("not-json", "not JSON"),
        ("array", "not a JSON-RPC response"),
        ("no-version", '"jsonrpc": "2.0"'),
        ("version-1", '"jsonrpc": "2.0"'),
        ("neither", "neither result and error"),
        ("both", "both result and error"),
        ("other-id", "to another request (id 'someone-else')"),
        ("numeric-id", "to another request (id 7)"),
        ("other-id-error", "error to another request"),
        ("result-null", "SendMessage result that is not an object"),
        ("result-empty", "neither or both of message and task"),
        ("result-both", "neither or both of message and task"),
        ("result-kind", "neither or both of message and task"),
        ("result-text", "SendMessage result that is not an object"),
        ("error-no-code", "JSON-RPC error that is not one"),
        ("error-float-code", "JSON-RPC error that is not one"),
        ("error-text", "JSON-RPC error that is not one"),
        ("big", f"larger than {MAX_BYTES} bytes"),
    ],
)
async def test_an_answer_that_is_no_json_rpc_response_is_an_agent_error(
    canned: Canned, a2a: A2aTransport, case: str, detail: str
) -> None:
    got = await a2a.deliver(canned.url(case), delivery_body(), HEADERS, 2.0)
    assert got.outcome is Outcome.AGENT_ERROR, got
    assert detail in got.detail, got.detail
    assert (got.reached, got.eject, got.body) == (True, False, None)


@pytest.mark.parametrize(
    ("case", "outcome", "status"),
    [("http-500", Outcome.SERVER_ERROR, 500), ("http-404", Outcome.AGENT_ERROR, 404)],
)
async def test_an_http_error_passes_through_unchanged(
    canned: Canned, a2a: A2aTransport, case: str, outcome: Outcome, status: int
) -> None:
    got = await a2a.deliver(canned.url(case), delivery_body(), HEADERS, 2.0)
    assert (got.outcome, got.status, got.detail) == (outcome, status, f"agent answered {status}")


async def test_only_a2a_http_urls_are_delivered_to(canned: Canned, a2a: A2aTransport) -> None:
    upper = canned.url("message").replace("a2a+http", "A2A+HTTP")
    assert (await a2a.deliver(upper, delivery_body(), HEADERS, 2.0)).outcome is Outcome.OK
    canned.seen.clear()
    plain = canned.url("message").removeprefix("a2a+")
    for url in (plain, "a2a+ftp://127.0.0.1/rpc", "a2a+", "a2a+nats:agents.x"):
        got = await a2a.deliver(url, delivery_body(), HEADERS, 2.0)
        assert got.outcome is Outcome.CONNECT_ERROR, (url, got)
        assert (got.reached, got.eject) == (False, True)
        assert "not an a2a+http(s):// URL" in got.detail
    assert canned.seen == []


async def test_the_http_transports_address_guard_applies(canned: Canned) -> None:
    guarded = A2aTransport(
        HttpTransport(address_guard=AddressGuard(denied=["127.0.0.0/8", "::1/128"]))
    )
    await guarded.start()
    try:
        got = await guarded.deliver(canned.url("message"), delivery_body(), HEADERS, 2.0)
    finally:
        await guarded.close()
    assert got.outcome is Outcome.CONNECT_ERROR, got
    assert got.detail.startswith("not delivered:")
    assert canned.seen == []


async def test_a_body_that_is_not_a_delivery_is_a_fault_of_ours(
    canned: Canned, a2a: A2aTransport
) -> None:
    with pytest.raises(InternalError, match="not a delivery"):
        await a2a.deliver(canned.url("message"), b'{"payload": {}}', HEADERS, 2.0)
    assert canned.seen == []


async def test_start_and_close_are_the_http_transports_and_idempotent(canned: Canned) -> None:
    http = HttpTransport()
    a2a = A2aTransport(http)
    # as the mux holds them: the same HttpTransport for http and, under this, for a2a+http
    mux = TransportMux({"http": http, "a2a+http": a2a})
    await mux.start()
    await a2a.start()
    try:
        assert (
            await mux.deliver(canned.url("message"), delivery_body(), HEADERS, 2.0)
        ).outcome is (Outcome.OK)
    finally:
        await mux.close()
    await a2a.close()
    with pytest.raises(InternalError, match="before start"):
        await a2a.deliver(canned.url("message"), delivery_body(), HEADERS, 2.0)
    await a2a.start()  # a closed transport starts again
    try:
        got = await http.deliver(canned.url("message").removeprefix("a2a+"), b"{}", {}, 2.0)
        assert got.outcome is Outcome.OK, got  # started through the A2A transport
    finally:
        await a2a.close()
