"""The gateway as an A2A agent, tried with the a2a-sdk's own client (CONTRACT.md v1.1, "A2A").

A real gateway process with the demo's dictionary, a v1 agent (tests/agents/behave.py) and an
agent built with the a2a-sdk (tests/agents/a2a_agent.py) registered by its card. The SDK's card
resolver and client factory talk to the gateway's card and ``/a2a``: by ``metadata.intent``, by
plain text (English and Chinese), refused out of scope, and a task's follow-up staying with the
agent that owns it across two gateways on Redis.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_data_parts, new_message, new_text_part
from a2a.helpers.proto_helpers import new_data_part
from a2a.types import GetTaskRequest, Role, SendMessageRequest, TaskState
from a2a.utils.errors import TaskNotFoundError, UnsupportedOperationError

from agent_reach.auth.tokens import Kind
from tests.support import (
    REDIS_URL,
    ROOT,
    Proc,
    _start,
    drop_prefix,
    gateway,
    http,
    http_full,
    secured_setup,
    start_agent,
    wait_until,
)

AGENT = ROOT / "tests" / "agents" / "a2a_agent.py"
DICTIONARY = ROOT / "src" / "agent_reach" / "demo" / "intents.toml"


def a2a_agent(name: str, *flags: str) -> Proc:
    return _start([sys.executable, str(AGENT), "--name", name, *flags])


def register_card(gw: str, endpoint_id: str, card_url: str, token: str | None = None) -> None:
    body = {"endpoint_id": endpoint_id, "a2a_card_url": card_url}
    status, answer = http("POST", f"{gw}/v1/register", body, token=token)
    assert status == 200, answer


@pytest.fixture(scope="module")
def net() -> Iterator[dict[str, Any]]:
    with gateway("--intents", str(DICTIONARY)) as gw:
        weather = start_agent(gw.url, "agent://weather-v1", intents="weather.query")
        notes = a2a_agent("notes-a2a", "--skill", "note.create=Write down a note", "--mode", "task")
        try:
            register_card(gw.url, "agent://notes-a2a", notes.url)
            wait_until(lambda: len(http("GET", f"{gw.url}/v1/agents")[1]["agents"]) == 2, 10)
            yield {"url": gw.url, "weather": weather, "notes": notes}
        finally:
            weather.stop()
            notes.stop()


@asynccontextmanager
async def a2a_client(url: str, token: str | None = None) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http_client:
        factory = ClientFactory(ClientConfig(httpx_client=http_client, streaming=False))
        client = await factory.create_from_url(url)
        try:
            yield client
        finally:
            await client.close()


def message(text: str | None = None, data: Any = None, **metadata: Any) -> Any:
    parts = []
    if text is not None:
        parts.append(new_text_part(text))
    if data is not None:
        parts.append(new_data_part(data))
    msg = new_message(parts, role=Role.ROLE_USER)
    if metadata:
        msg.metadata.update(metadata)
    return msg


async def send(client: Any, msg: Any) -> Any:
    """The one answer of a (non-streaming) send: a StreamResponse with a message or a task."""
    answers = [event async for event in client.send_message(SendMessageRequest(message=msg))]
    assert len(answers) == 1, answers
    return answers[0]


async def test_the_card_lists_one_skill_per_routable_tag(net: dict[str, Any]) -> None:
    async with httpx.AsyncClient(timeout=10) as http_client:
        card = await A2ACardResolver(http_client, net["url"]).get_agent_card()
    skills = {s.id: s for s in card.skills}
    assert set(skills) == {"weather.query", "note.create"}
    assert skills["weather.query"].description.startswith("Current or coming weather")
    assert list(skills["weather.query"].tags) == ["weather", "query"]
    assert "成都明天天气怎么样" in list(skills["weather.query"].examples)
    (iface,) = card.supported_interfaces
    assert iface.url == f"{net['url']}/a2a"
    assert iface.protocol_binding == "JSONRPC"
    assert not card.capabilities.streaming
    assert not card.security_schemes  # open mode
    status, _, headers = http_full("GET", f"{net['url']}/.well-known/agent-card.json")
    assert status == 200
    etag = {k.lower(): v for k, v in headers.items()}["etag"]
    status, _, _ = http_full(
        "GET", f"{net['url']}/.well-known/agent-card.json", headers={"If-None-Match": etag}
    )
    assert status == 304


async def test_by_metadata_intent_to_a_v1_agent(net: dict[str, Any]) -> None:
    async with a2a_client(net["url"]) as client:
        answer = await send(client, message(data={"city": "成都"}, intent="weather.query"))
    assert answer.HasField("message")
    reply = answer.message
    assert reply.role == Role.ROLE_AGENT
    (data,) = get_data_parts(reply.parts)
    assert data["agent"] == "agent://weather-v1"
    assert data["payload"] == {"city": "成都"}
    assert data["intent"] == "weather.query"
    meta = dict(reply.metadata)
    assert meta["endpoint_id"] == "agent://weather-v1"
    assert meta["trace_id"] == data["trace_id"]  # one trace id through the hop


@pytest.mark.parametrize(
    "words", ["what is the weather in Chengdu tomorrow", "帮我查一下明天成都的天气"]
)
async def test_by_plain_text(net: dict[str, Any], words: str) -> None:
    async with a2a_client(net["url"]) as client:
        answer = await send(client, message(words))
    (data,) = get_data_parts(answer.message.parts)
    assert data["agent"] == "agent://weather-v1"
    assert data["intent_text"] == words
    assert dict(answer.message.metadata)["match"]["method"] == "semantic"


async def test_a_metadata_intent_is_exact_the_words_do_not_choose(net: dict[str, Any]) -> None:
    async with a2a_client(net["url"]) as client:
        # words that would reach the weather agent, under a tag nobody declares: refused
        with pytest.raises(UnsupportedOperationError) as refused:
            await send(client, message("帮我查一下明天成都的天气", intent="travel.query"))
        # an alias is not the tag either
        with pytest.raises(UnsupportedOperationError):
            await send(client, message(data={"city": "x"}, intent="weather.lookup"))
        answer = await send(client, message("明天成都", intent="weather.query"))
    assert refused.value.data["error"] == "no_capable_agent"
    (data,) = get_data_parts(answer.message.parts)
    assert data["intent_text"] == "明天成都"  # the words went along to the agent
    assert data["match"] == ["exact", 1.0]


async def test_out_of_scope_text_is_refused_with_the_nearest_tags(net: dict[str, Any]) -> None:
    async with a2a_client(net["url"]) as client:
        with pytest.raises(UnsupportedOperationError) as refused:
            await send(client, message("tell me a joke"))
    data = refused.value.data
    assert data["error"] == "no_capable_agent"
    assert data["trace_id"].startswith("trace_")
    assert '"tag"' in data["suggestions"]  # the nearest tags, with their confidences


async def test_an_a2a_agent_answers_with_its_own_task(net: dict[str, Any]) -> None:
    async with a2a_client(net["url"]) as client:
        answer = await send(client, message(data={"title": "t"}, intent="note.create"))
        assert answer.HasField("task")
        task = answer.task
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        (data,) = get_data_parts(task.artifacts[0].parts)
        assert data["data"] == {"title": "t"}
        assert data["metadata"]["intent"] == "note.create"
        got = await client.get_task(GetTaskRequest(id=task.id))  # relayed to its owner
        assert got.id == task.id
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))


async def test_bad_requests_get_json_rpc_errors(net: dict[str, Any]) -> None:
    url = f"{net['url']}/a2a"
    cases = [
        (b"not json", -32700),
        (b"[]", -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope", "params": {}}', -32601),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {}}', -32602),
        (
            b'{"jsonrpc": "2.0", "id": 3, "method": "SendStreamingMessage", "params": {}}',
            -32004,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 4, "method": "SendMessage", "params": {"message":'
            b' {"parts": [{"text": "hi"}], "metadata": {"intent": "Bad Tag"}}}}',
            -32602,
        ),
    ]
    for raw, code in cases:
        status, answer = http("POST", url, raw=raw, headers={"A2A-Version": "1.0"})
        assert status == 200, (raw, answer)
        assert answer["error"]["code"] == code, (raw, answer)
    status, answer = http("POST", url, raw=cases[3][0], headers={"A2A-Version": "0.3"})
    assert answer["error"]["code"] == -32009

    def with_message(**fields: Any) -> dict[str, Any]:
        message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}], **fields}
        return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message}}

    # a timeout of the wrong type beside a delivery's deadline: invalid params, not -32603
    # with a traceback in the log (a review found min("x", 500) raising)
    status, answer = http(
        "POST", url, with_message(metadata={"deadline_ms": 500, "timeout_ms": "x"})
    )
    assert answer["error"]["code"] == -32602, answer
    # ids travel in headers: a line break in one is refused, never sent on
    for bad in ("ctx\r\nX-Evil: 1", "x" * 129, 5):
        status, answer = http("POST", url, with_message(contextId=bad))
        assert answer["error"]["code"] == -32602, (bad, answer)
    # a gateway's delivery pointing at /a2a (a card naming a gateway): refused, no loop
    status, answer = http(
        "POST",
        url,
        with_message(metadata={"intent": "weather.query"}),
        headers={"X-Reach-Attempt": "1"},
    )
    assert answer["error"]["code"] == -32602, answer
    assert "gateway" in answer["error"]["message"], answer
    # the whole body is read, up to the limit (1 MiB); past it, 413
    filler = {"data": {"blob": "x" * 700_000}}
    big = with_message(metadata={"intent": "weather.query"}, parts=[{"text": "hi"}, filler])
    status, answer = http("POST", url, big)
    assert status == 200 and "result" in answer, str(answer)[:300]
    status, answer = http("POST", url, raw=b" " * (2 << 20))
    assert status == 413, str(answer)[:200]
    assert answer["error"]["data"][0]["reason"] == "PAYLOAD_TOO_LARGE"
    assert http("GET", f"{net['url']}/healthz")[0] == 200


def test_a_follow_up_stays_with_the_owner_across_gateways(tmp_path: Path) -> None:
    prefix = f"test-{os.urandom(6).hex()}"
    shared = ["--registry", REDIS_URL, "--registry-prefix", prefix, "--matcher", "none"]
    agents = [
        a2a_agent(f"plan-{i}", "--skill", "schedule.plan=Plans a day", "--mode", "input")
        for i in range(2)
    ]
    try:
        with gateway(*shared) as first, gateway(*shared) as second:
            for i, agent in enumerate(agents):
                register_card(first.url, f"agent://a2a-plan-{i}", agent.url)
            wait_until(lambda: len(http("GET", f"{second.url}/v1/agents")[1]["agents"]) == 2, 10)

            async def conversation() -> tuple[Any, Any, Any]:
                async with a2a_client(first.url) as one, a2a_client(second.url) as two:
                    opened = await send(one, message("plan my day", intent="schedule.plan"))
                    task = opened.task
                    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
                    follow = message("in Chengdu")  # no intent: the task's owner takes it
                    follow.task_id = task.id
                    follow.context_id = task.context_id
                    done = await send(two, follow)
                    got = await two.get_task(GetTaskRequest(id=task.id))
                    return opened, done, got

            opened, done, got = asyncio.run(conversation())
            (data,) = get_data_parts(done.task.artifacts[0].parts)
            assert done.task.id == opened.task.id
            assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
            assert data["task_id"] == opened.task.id
            owner = data["agent"]
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            # the owner gone: a clear error, never another agent
            status, _ = http(
                "POST",
                f"{second.url}/v1/deregister",
                {"endpoint_id": f"agent://a2a-{owner.removesuffix('-a2a')}"},
            )
            assert status == 200, owner
            gone = {
                "jsonrpc": "2.0",
                "id": 9,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": "m-9",
                        "role": "ROLE_USER",
                        "taskId": opened.task.id,
                        "parts": [{"text": "and tomorrow?"}],
                    }
                },
            }
            status, answer = http("POST", f"{first.url}/a2a", gone, headers={"A2A-Version": "1.0"})
            assert answer["error"]["code"] == -32001, answer
            assert "no longer registered" in answer["error"]["message"]
    finally:
        for agent in agents:
            agent.stop()
        drop_prefix(prefix, REDIS_URL)


def test_token_mode_on_a2a(tmp_path: Path) -> None:
    policy = (
        '[[reach]]\nsenders = ["agent://caller-*"]\nintents = ["weather.*"]\n'
        '[[claim]]\nendpoints = ["agent://weather-*"]\nintents = ["weather.*"]\n'
    )
    s = secured_setup(tmp_path, policy)
    with gateway(*s.flags, "--matcher", "none") as gw:
        enroll = s.token(Kind.ENROLL, "e", endpoints=["agent://weather-*"], intents=["weather.*"])
        agent = start_agent(gw.url, "agent://weather-1", intents="weather.query", token=enroll)
        try:
            status, card = http("GET", f"{gw.url}/.well-known/agent-card.json")
            assert status == 200
            assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
            rpc = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": "m-1",
                        "role": "ROLE_USER",
                        "parts": [{"data": {"city": "x"}}],
                        "metadata": {"intent": "weather.query"},
                    }
                },
            }
            status, answer = http("POST", f"{gw.url}/a2a", rpc)
            assert status == 401, answer
            stranger = s.token(Kind.CLIENT, "agent://stranger-1")
            status, answer = http("POST", f"{gw.url}/a2a", rpc, token=stranger)
            assert status == 403, answer
            caller = s.token(Kind.CLIENT, "agent://caller-1")
            status, answer = http("POST", f"{gw.url}/a2a", rpc, token=caller)
            assert status == 200, answer
            data = answer["result"]["message"]["parts"][0]["data"]
            assert data["sender"] == "agent://caller-1"
            assert data["verified"] is True
            # who may ask about a task or a context: authenticated first, then only its caller
            rpc["params"]["message"]["taskId"] = "t-unknown"  # type: ignore[index]
            status, answer = http("POST", f"{gw.url}/a2a", rpc)
            assert status == 401, answer  # not -32001: nothing is said before the token
            del rpc["params"]["message"]["taskId"]  # type: ignore[attr-defined]
            rpc["params"]["message"]["contextId"] = "ctx-of-caller-1"  # type: ignore[index]
            status, answer = http("POST", f"{gw.url}/a2a", rpc, token=caller)
            assert status == 200 and "result" in answer, answer
            other = s.token(Kind.CLIENT, "agent://caller-2")
            status, answer = http("POST", f"{gw.url}/a2a", rpc, token=other)
            assert answer["error"]["code"] == -32602, answer  # another caller's context
            assert "another caller" in answer["error"]["message"]
        finally:
            agent.stop()


def test_one_off_messages_leave_no_owner_behind() -> None:
    """Stateless traffic to a v1 agent writes nothing to the owners' map: it grows with
    conversations (a context the caller names, a Task, an A2A agent's own context), not with
    requests."""
    import redis

    prefix = f"test-{os.urandom(6).hex()}"
    shared = ["--registry", REDIS_URL, "--registry-prefix", prefix, "--matcher", "none"]
    store = redis.Redis.from_url(REDIS_URL)
    try:
        with gateway(*shared) as gw:
            agent = start_agent(gw.url, "agent://echo-1", intents="test.echo")
            try:
                owners = "{" + prefix + "}:claim:a2a-owners:"  # one key an owner
                for i in range(5):
                    one_off = {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "SendMessage",
                        "params": {
                            "message": {
                                "messageId": f"m-{i}",
                                "role": "ROLE_USER",
                                "parts": [{"data": {"i": i}}],
                                "metadata": {"intent": "test.echo"},
                            }
                        },
                    }
                    status, answer = http("POST", f"{gw.url}/a2a", one_off)
                    assert status == 200 and "result" in answer, answer
                    assert "contextId" not in answer["result"]["message"]
                keys = [k.decode() for k in store.keys("{" + prefix + "}:*")]
                assert not [k for k in keys if k.startswith(owners)], keys
                # a context the caller names is owned: its follow-up stays with this agent
                one_off["params"]["message"]["contextId"] = "ctx-1"  # type: ignore[index]
                status, answer = http("POST", f"{gw.url}/a2a", one_off)
                assert answer["result"]["message"]["contextId"] == "ctx-1", answer
                assert store.exists(owners + "ctx:ctx-1")
            finally:
                agent.stop()
    finally:
        store.close()
        drop_prefix(prefix, REDIS_URL)
