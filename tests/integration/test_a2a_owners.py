"""Who owns an A2A conversation, through ``POST /a2a`` (CONTRACT.md v1.1, "A2A"; docs/a2a.md).

Real gateway processes, real a2a-sdk agents (tests/agents/a2a_agent.py), real Redis. A context
the agent itself opened (the SDK gives every message without one a ``contextId``) stays with
that agent for every follow-up naming it, on one gateway and across two on one Redis registry;
the owner killed but still registered is a JSON-RPC error naming it, never its twin. Also:
``CancelTask`` relayed to the owner, refused to another caller in token mode; the gateway's
assertion on deliveries to A2A agents; ``metadata.recipient_hint``, ``timeout_ms`` and
``trace_id`` honoured.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import jwt
import pytest

from agent_reach.auth.tokens import Kind
from tests.support import (
    REDIS_URL,
    ROOT,
    Proc,
    _start,
    drop_prefix,
    gateway,
    http,
    metric,
    secured_setup,
    start_agent,
    wait_until,
)

AGENT = ROOT / "tests" / "agents" / "a2a_agent.py"
SKILL = ["--skill", "schedule.plan=Plans a day"]
_ids = itertools.count(1)


def a2a_agent(name: str, *flags: str) -> Proc:
    return _start([sys.executable, str(AGENT), "--name", name, *SKILL, *flags])


def register_card(gw: str, endpoint_id: str, card_url: str, token: str | None = None) -> None:
    body = {"endpoint_id": endpoint_id, "a2a_card_url": card_url}
    status, answer = http("POST", f"{gw}/v1/register", body, token=token)
    assert status == 200, answer


def rpc(gw: str, method: str, params: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    """One JSON-RPC call to the gateway's ``/a2a``: the whole JSON-RPC answer."""
    call = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
    status, answer = http("POST", f"{gw}/a2a", call, token=token, headers={"A2A-Version": "1.0"})
    assert status == 200, answer
    assert isinstance(answer, dict)
    return answer


def say(
    gw: str,
    text: str,
    *,
    token: str | None = None,
    context_id: str | None = None,
    task_id: str | None = None,
    **metadata: Any,
) -> dict[str, Any]:
    """SendMessage with one text part: the JSON-RPC answer."""
    message: dict[str, Any] = {
        "messageId": f"m-{os.urandom(6).hex()}",
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if metadata:
        message["metadata"] = metadata
    if context_id is not None:
        message["contextId"] = context_id
    if task_id is not None:
        message["taskId"] = task_id
    return rpc(gw, "SendMessage", {"message": message}, token)


def seen(answer: dict[str, Any]) -> dict[str, Any]:
    """What the agent said arrived: the data part of its Message (or of its Task's artifact)."""
    assert "result" in answer, answer
    result = answer["result"]
    parts = (
        result["message"]["parts"]
        if "message" in result
        else result["task"]["artifacts"][0]["parts"]
    )
    (data,) = [p["data"] for p in parts if "data" in p]
    assert isinstance(data, dict)
    return data


def reason(answer: dict[str, Any]) -> tuple[int, str, dict[str, str]]:
    """A JSON-RPC error's code, its ErrorInfo reason and metadata."""
    assert "error" in answer, answer
    error = answer["error"]
    (info,) = error.get("data") or [{}]
    return error["code"], info.get("reason", ""), info.get("metadata", {})


@contextmanager
def twins(*gateway_flags: str, gateways: int = 1) -> Iterator[tuple[list[Proc], list[Proc]]]:
    """Gateways on one registry and two twin a2a-sdk agents (message mode) registered by card
    as ``agent://twin-0`` and ``agent://twin-1``; the agents' names are ``twin-0`` and
    ``twin-1``."""
    with ExitStack() as stack:
        gws = [stack.enter_context(gateway(*gateway_flags)) for _ in range(gateways)]
        agents: list[Proc] = []
        try:
            for i in range(2):
                agents.append(a2a_agent(f"twin-{i}"))
                register_card(gws[0].url, f"agent://twin-{i}", agents[-1].url)
            for gw in gws:
                wait_until(
                    lambda gw=gw: len(http("GET", f"{gw.url}/v1/agents")[1]["agents"]) == 2, 10
                )
            yield gws, agents
        finally:
            for agent in agents:
                agent.stop()


@pytest.mark.parametrize("registry", ["memory", "redis"])
def test_a_context_the_agent_opened_stays_with_it(registry: str) -> None:
    """The agent's own contextId (not the caller's) is owned: N follow-ups naming only it, by
    intent or by nothing at all, all reach that agent, on either gateway; the owner killed
    but still registered is a JSON-RPC error naming it, and its twin is never tried."""
    prefix = f"test-{os.urandom(6).hex()}"
    flags = ["--matcher", "none"]
    if registry == "redis":
        flags += ["--registry", REDIS_URL, "--registry-prefix", prefix]
    try:
        with twins(*flags, gateways=2 if registry == "redis" else 1) as (gws, agents):
            opened = say(gws[0].url, "plan my day", intent="schedule.plan")
            first = seen(opened)
            owner = first["agent"]
            context_id = opened["result"]["message"]["contextId"]
            assert context_id and first["context_id"] is None  # the agent's, not the caller's
            for i in range(8):
                gw = gws[i % len(gws)].url
                # half name the intent too (they would be routed over both twins without an
                # owner), half name nothing but the context (no intent: refused without one)
                meta = {"intent": "schedule.plan"} if i % 2 else {}
                answer = say(gw, f"and then {i}", context_id=context_id, **meta)
                follow = seen(answer)
                assert follow["agent"] == owner, (i, answer)
                assert follow["context_id"] == context_id  # it went on in the same context
                assert answer["result"]["message"]["contextId"] == context_id
            # the owner killed, still registered: the follow-up is refused, naming it
            owner_proc = agents[int(owner[-1])]
            owner_proc.stop(signal.SIGKILL)
            assert any(
                a["endpoint_id"] == f"agent://{owner}"
                for a in http("GET", f"{gws[-1].url}/v1/agents")[1]["agents"]
            )
            answer = say(gws[-1].url, "still there?", context_id=context_id)
            code, why, meta = reason(answer)
            assert code == -32603, answer
            assert why in {"ALL_ATTEMPTS_FAILED", "NO_AVAILABLE_AGENT"}, answer
            message = answer["error"]["message"]
            assert f"agent://{owner}" in message and "did not take the follow-up" in message
            attempts = json.loads(meta.get("attempts", "[]"))
            assert {a["endpoint_id"] for a in attempts} <= {f"agent://{owner}"}, attempts
            # a new conversation (no context) is routed anew: the twin takes it
            assert seen(say(gws[0].url, "hello", intent="schedule.plan"))["agent"] != owner
    finally:
        if registry == "redis":
            drop_prefix(prefix, REDIS_URL)


def test_owners_expire_in_redis() -> None:
    """An owner is one Redis key with its TTL (the hour of OWNER_TTL_S), not a hash swept by
    the gateway."""
    import redis

    prefix = f"test-{os.urandom(6).hex()}"
    store = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with twins("--matcher", "none", "--registry", REDIS_URL, "--registry-prefix", prefix) as (
            gws,
            _,
        ):
            opened = say(gws[0].url, "plan", intent="schedule.plan", context_id="ctx-ttl")
            assert seen(opened)["context_id"] == "ctx-ttl"
            key = "{" + prefix + "}:claim:a2a-owners:ctx:ctx-ttl"
            held = json.loads(store.get(key) or "{}")
            assert held["endpoint_id"] == f"agent://{seen(opened)['agent']}", held
            assert 3_500_000 < store.pttl(key) <= 3_600_000
    finally:
        store.close()
        drop_prefix(prefix, REDIS_URL)


def test_recipient_hint_timeout_and_trace_id_from_metadata() -> None:
    with twins("--matcher", "none") as (gws, _):
        gw = gws[0].url
        for name in ("twin-0", "twin-1", "twin-0"):
            for _ in range(3):
                answer = say(gw, "x", intent="schedule.plan", recipient_hint=f"agent://{name}")
                assert seen(answer)["agent"] == name, answer
        trace_id = f"trace_{os.urandom(8).hex()}"
        got = seen(say(gw, "x", intent="schedule.plan", timeout_ms=1500, trace_id=trace_id))
        assert got["metadata"]["trace_id"] == trace_id
        assert 0 < got["metadata"]["deadline_ms"] <= 1500  # the default would be 8000
        status, trace = http("GET", f"{gw}/v1/traces/{trace_id}")
        assert status == 200, trace
        # a hint naming nobody: refused (-32004), never routed by the intent instead
        code, why, _ = reason(say(gw, "x", intent="schedule.plan", recipient_hint="agent://none"))
        assert (code, why) == (-32004, "RECIPIENT_NOT_FOUND")


def test_cancel_task_and_the_assertion_in_token_mode(tmp_path: Path) -> None:
    policy = (
        '[[reach]]\nsenders = ["agent://caller-*"]\nintents = ["schedule.*"]\n'
        '[[claim]]\nendpoints = ["agent://plan-*"]\nintents = ["schedule.*"]\n'
    )
    s = secured_setup(tmp_path, policy)
    with gateway(*s.flags, "--matcher", "none") as gw:
        enroll = s.token(Kind.ENROLL, "e", endpoints=["agent://plan-*"], intents=["schedule.*"])
        agent = a2a_agent("plan-1", "--mode", "input")
        try:
            register_card(gw.url, "agent://plan-1", agent.url, token=enroll)
            one = s.token(Kind.CLIENT, "agent://caller-1")
            two = s.token(Kind.CLIENT, "agent://caller-2")
            # a task finished: its delivery carried the gateway's assertion, for this agent
            opened = say(gw.url, "plan", token=one, intent="schedule.plan")
            task = opened["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", opened
            done = say(gw.url, "in Chengdu", token=one, task_id=task["id"])
            assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", done
            assertion = seen(done)["assertion"]
            assert assertion, done
            claims = jwt.decode(assertion, options={"verify_signature": False})
            assert claims["aud"] == "agent://plan-1"
            assert claims["sub"] == "agent://caller-1"
            assert claims["kind"] == "delivery"
            assert claims["intent"] == "schedule.plan"
            # a task of one's own does not carry another caller's context with it (a review
            # found the context unchecked once the task was found)
            mine = say(gw.url, "plan", token=one, intent="schedule.plan")["result"]["task"]
            theirs = say(gw.url, "plan", token=two, intent="schedule.plan")["result"]["task"]
            hijack = say(
                gw.url, "in Chengdu", token=one, task_id=mine["id"], context_id=theirs["contextId"]
            )
            assert hijack["error"]["code"] == -32602, hijack
            assert "another caller" in hijack["error"]["message"], hijack
            # another task, canceled through the gateway by its caller only
            task = say(gw.url, "plan", token=one, intent="schedule.plan")["result"]["task"]
            params = {"id": task["id"]}
            code, why, _ = reason(rpc(gw.url, "CancelTask", params, token=two))
            assert (code, why) == (-32001, "TASK_NOT_FOUND")  # another caller's: as if unknown
            canceled = rpc(gw.url, "CancelTask", params, token=one)
            assert canceled["result"]["id"] == task["id"], canceled
            assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED", canceled
            got = rpc(gw.url, "GetTask", params, token=one)
            assert got["result"]["status"]["state"] == "TASK_STATE_CANCELED", got
            again = rpc(gw.url, "CancelTask", params, token=one)  # the agent's own refusal
            assert again["error"]["code"] == -32002, again
        finally:
            agent.stop()


def test_get_task_counts_against_the_gateways_admission_bound() -> None:
    """A relayed GetTask is work in delivery like a send: with --max-inflight 1 held by a slow
    send, it is refused `overloaded` (a review held 60 relays at an agent through a gateway
    bounded at 2); once the send is answered it goes through."""
    with gateway("--matcher", "none", "--max-inflight", "1") as gw:
        agent = a2a_agent("plan-admit", "--mode", "input")
        slow = start_agent(gw.url, "agent://slow-admit", "slow", intents="slow.echo", delay_ms=2000)
        try:
            register_card(gw.url, "agent://plan-admit", agent.url)
            task = say(gw.url, "plan", intent="schedule.plan")["result"]["task"]
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(
                    http, "POST", f"{gw.url}/v1/send", {"intent": "slow.echo", "timeout_ms": 8000}
                )
                wait_until(lambda: metric(gw, "agent_reach_requests_in_delivery") == 1, 5)
                code, why, _ = reason(rpc(gw.url, "GetTask", {"id": task["id"]}))
                assert why == "OVERLOADED", (code, why)
                assert held.result(timeout=10)[0] == 200
            got = rpc(gw.url, "GetTask", {"id": task["id"]})
            assert got["result"]["id"] == task["id"], got
        finally:
            slow.stop()
            agent.stop()


def test_a_caller_gone_from_a2a_mid_send_frees_its_place_at_once() -> None:
    """A SendMessage to an agent that takes 5 s, its caller's connection closed once it is in
    delivery: the send stops then (its admission place freed), not when the agent answers
    (aiohttp does not cancel a handler whose client left; a review saw it run to the end)."""
    with gateway("--matcher", "none") as gw:
        slow = start_agent(gw.url, "agent://slow-gone", "slow", intents="slow.gone", delay_ms=5000)
        try:
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {
                    "message": {
                        "messageId": "m-gone",
                        "role": "ROLE_USER",
                        "parts": [{"data": {}}],
                        "metadata": {"intent": "slow.gone", "timeout_ms": 20000},
                    }
                },
            }
            body = json.dumps(call).encode()
            host, port = gw.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                head = f"POST /a2a HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
                wait_until(lambda: metric(gw, "agent_reach_requests_in_delivery") == 1, 3)
            closed = time.monotonic()
            wait_until(lambda: metric(gw, "agent_reach_requests_in_delivery") == 0, 3)
            assert time.monotonic() - closed < 2.0  # the agent would take 5 s
        finally:
            slow.stop()
