"""MCP for LLM hosts, tried with the real ``mcp`` SDK client (CONTRACT.md v1.1, "MCP").

A real gateway process with the demo's dictionary and real agent processes; the SDK's
``Client`` talks to ``/mcp`` over streamable HTTP, in both protocol versions it speaks (the
2026 one it negotiates by default, and the 2025 handshake with sessions that today's hosts
use), and to ``agent-reach mcp`` over stdio. Every tool is called, answers are compared with the
HTTP API's, refusals are ``isError`` results carrying the v1 error body, token mode refuses
what the token may not do, and a change in the intents reachable is told to clients of both
protocol versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ToolListChangedNotification
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from agent_reach.edges.mcp.tools import MAX_STRUCTURED_BYTES, first_reachable, reachable_lines
from tests.support import (
    MCP_ACCEPT,
    MCP_INITIALIZE,
    ROOT,
    Proc,
    gateway,
    http,
    http_full,
    metric,
    secured_setup,
    start_agent,
    until,
    wait_until,
)

DICTIONARY = ROOT / "src" / "agent_reach" / "demo" / "intents.toml"
MODES = ["auto", "legacy"]
# intent_text a caller could send: binary, only emoji, mixed scripts, controls, whitespace
STRANGE_TEXTS = [
    "\x00\x01\x02",
    "😀😀😀",
    "天气 weather météo погода",
    "\x85\x9f",
    " \t\n",
    "🙂" * 600,
]  # the 2026 protocol (negotiated) and the 2025 handshake


@pytest.fixture(scope="module")
def net() -> Iterator[dict[str, Any]]:
    with gateway("--intents", str(DICTIONARY), "--mcp-max-sessions", "8") as gw:
        weather = start_agent(gw.url, "agent://weather-mcp", intents="weather.query")
        try:
            wait_until(lambda: _routable(gw.url, "weather.query"), 10)
            yield {"gw": gw, "url": gw.url, "weather": weather}
        finally:
            weather.stop()


def _routable(url: str, tag: str, token: str | None = None) -> bool:
    status, answer = http("GET", f"{url}/v1/intents", token=token)
    assert status == 200, answer
    return any(i["tag"] == tag and i["routable"] for i in answer["intents"])


@asynccontextmanager
async def mcp_client(
    url: str, mode: str = "auto", token: str | None = None, message_handler: Any = None
) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http_client = httpx2.AsyncClient(headers=headers, timeout=30)
    transport = streamable_http_client(f"{url}/mcp", http_client=http_client)
    try:
        async with Client(transport, mode=mode, message_handler=message_handler) as client:
            yield client
    finally:
        await http_client.aclose()


def _tool_list_changes() -> tuple[Any, asyncio.Queue[ToolListChangedNotification]]:
    """A client's ``message_handler``, and the queue of the ``notifications/tools/list_changed``
    it receives (the 2025 protocol's, pushed by the server)."""
    changes: asyncio.Queue[ToolListChangedNotification] = asyncio.Queue()

    async def handler(message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            changes.put_nowait(message)

    return handler, changes


async def _told_of(
    client: Any, changes: asyncio.Queue[ToolListChangedNotification], line: str, bound: float
) -> int:
    """Wait (within ``bound`` seconds) for notifications until, after one, ``reach``'s
    description has ``line``; how many came. (One may come first for a change made before.)"""
    deadline = time.monotonic() + bound
    told = 0
    while True:
        await asyncio.wait_for(changes.get(), max(deadline - time.monotonic(), 0.01))
        told += 1
        tools = {t.name: t for t in (await client.list_tools()).tools}
        if line in (tools["reach"].description or ""):
            return told


def _answer(result: Any) -> dict[str, Any]:
    """The v1 answer of a tool result: its structured content, which its text repeats."""
    text = json.loads(result.content[0].text)
    assert text == result.structured_content
    return dict(result.structured_content)


# --- the tools, over streamable HTTP ------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_four_tools_are_listed_for_a_model(net: dict[str, Any], mode: str) -> None:
    async with mcp_client(net["url"], mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"list_agents", "list_intents", "explain_route", "reach"}
    reach = tools["reach"]
    props = reach.input_schema["properties"]
    assert set(props) == {"intent", "intent_text", "payload", "recipient_hint", "timeout_ms"}
    assert "plain words" in props["intent_text"]["description"]
    assert "no_capable_agent" in reach.description  # what a refusal means
    # the intents reachable now are named, with the dictionary's words
    assert "- weather.query: Current or coming weather" in reach.description
    assert "note.create" not in reach.description  # no agent serves it
    assert tools["list_agents"].annotations.read_only_hint is True
    assert reach.annotations.read_only_hint is False


def _traces(url: str) -> list[dict[str, Any]]:
    status, answer = http("GET", f"{url}/v1/traces?intent=weather.query&limit=500")
    assert status == 200, answer
    traces: list[dict[str, Any]] = answer["traces"]
    assert len(traces) < 500  # all of them: the count below is exact
    return traces


@pytest.mark.parametrize("mode", MODES)
async def test_reach_by_intent_is_one_trace_like_any_other(net: dict[str, Any], mode: str) -> None:
    before = _traces(net["url"])
    async with mcp_client(net["url"], mode) as client:
        result = await client.call_tool(
            "reach", {"intent": "weather.query", "payload": {"city": "成都"}, "timeout_ms": 3000}
        )
    assert result.is_error is False
    answer = _answer(result)
    assert answer["ok"] is True
    assert answer["endpoint_id"] == "agent://weather-mcp"
    assert answer["result"]["payload"] == {"city": "成都"}
    trace_id = answer["trace_id"]
    assert answer["result"]["trace_id"] == trace_id  # the agent saw the same trace
    status, trace = http("GET", f"{net['url']}/v1/traces/{trace_id}")
    assert status == 200
    kinds = [e["kind"] for e in trace["events"]]
    assert kinds[0] == "received"
    assert "attempt" in kinds
    # one request answered, one trace: no other for the session, the listing or the call
    after = _traces(net["url"])
    assert len(after) == len(before) + 1
    assert after[0]["trace_id"] == trace_id
    assert after[0]["outcome"] == "ok"


@pytest.mark.parametrize(
    "words",
    ["check the weather in Chengdu tomorrow", "帮我查一下明天成都的天气"],
)
async def test_reach_by_plain_words(net: dict[str, Any], words: str) -> None:
    async with mcp_client(net["url"]) as client:
        result = await client.call_tool("reach", {"intent_text": words})
    answer = _answer(result)
    assert result.is_error is False, answer
    assert answer["endpoint_id"] == "agent://weather-mcp"
    assert answer["match"]["method"] == "semantic"
    assert answer["match"]["confidence"] >= 0.8
    assert answer["result"]["intent_text"] == words


@pytest.mark.parametrize("mode", MODES)
async def test_a_refusal_is_an_error_result_with_the_v1_body(
    net: dict[str, Any], mode: str
) -> None:
    async with mcp_client(net["url"], mode) as client:
        words = await client.call_tool("reach", {"intent_text": "tell me a joke"})
        tag = await client.call_tool("explain_route", {"intent": "unknown.action"})
    refused = _answer(words)
    assert words.is_error is True
    assert refused["ok"] is False
    assert refused["error"] == "no_capable_agent"
    assert refused["trace_id"].startswith("trace_")
    assert all(s["confidence"] < 0.8 for s in refused["suggestions"])
    # the same refusal /v1/route gives
    status, direct = http("GET", f"{net['url']}/v1/route?intent=unknown.action")
    assert status == 404
    assert tag.is_error is True
    assert _answer(tag)["error"] == direct["error"] == "no_capable_agent"


async def test_list_and_explain_answer_as_the_http_api(net: dict[str, Any]) -> None:
    url = net["url"]
    async with mcp_client(url) as client:
        agents = _answer(await client.call_tool("list_agents", {}))
        intents = _answer(await client.call_tool("list_intents", {}))
        route = _answer(await client.call_tool("explain_route", {"intent": "weather.lookup"}))
    _, direct_agents = http("GET", f"{url}/v1/agents")
    assert agents == direct_agents  # no argument: the v1 list, as /v1/agents with no query
    assert set(agents) == {"agents"} and agents["agents"]
    # a page at a time when asked, as /v1/agents pages (id order, total, cursor)
    extra = {
        "endpoint_id": "agent://zz-mcp-extra",
        "capabilities": ["extra.only"],
        "endpoint_url": "http://127.0.0.1:9/reach",
    }
    assert http("POST", f"{url}/v1/register", extra)[0] == 200
    try:
        async with mcp_client(url) as client:
            first = _answer(await client.call_tool("list_agents", {"limit": 1}))
            cursor = first["next_cursor"]
            rest = _answer(await client.call_tool("list_agents", {"cursor": cursor}))
            only = _answer(await client.call_tool("list_agents", {"intent": "extra.only"}))
        assert len(first["agents"]) == 1 and cursor and first["total"] == len(agents["agents"]) + 1
        ids = [a["endpoint_id"] for a in first["agents"] + rest["agents"]]
        assert ids == sorted([*(a["endpoint_id"] for a in agents["agents"]), extra["endpoint_id"]])
        assert [a["endpoint_id"] for a in only["agents"]] == [extra["endpoint_id"]]
    finally:
        http("POST", f"{url}/v1/deregister", {"endpoint_id": extra["endpoint_id"]})
    _, direct_intents = http("GET", f"{url}/v1/intents")
    assert intents == direct_intents
    _, direct_route = http("GET", f"{url}/v1/route?intent=weather.lookup")
    assert route["chosen"] == direct_route["chosen"] == "agent://weather-mcp"
    assert route["match"]["method"] == "alias"
    assert route["intent"] == "weather.query"


def _records(listing: dict[str, Any]) -> list[dict[str, Any]]:
    """A /v1/agents listing's records without what time alone changes (last_seen_at)."""
    return [{k: v for k, v in a.items() if k != "last_seen_at"} for a in listing["agents"]]


async def test_a_large_answer_is_carried_by_its_text_alone(net: dict[str, Any]) -> None:
    """Past MAX_STRUCTURED_BYTES of JSON (a listing of ~1,000 agents or more) a result carries
    the v1 answer as its text only: the SDK re-encodes a structured copy object by object on
    the gateway's event loop (0.4-0.7 s at 50,000 agents: benchmarks/routes_hold_bench.py). A
    small answer still carries both, and the big text is the v1 answer exactly."""
    url = net["url"]
    ids = [f"agent://zz-big-{i:03d}" for i in range(100)]  # 100 x ~3 KB: over 256 KiB
    for i, endpoint_id in enumerate(ids):
        body = {
            "endpoint_id": endpoint_id,
            "capabilities": [f"big.t{i}"],
            "endpoint_url": "http://127.0.0.1:9/reach",
            "description": f"agent {i} " + "of many words " * 214,
        }
        status, answer = http("POST", f"{url}/v1/register", body)
        assert status == 200, answer
    try:
        for mode in MODES:
            async with mcp_client(url, mode) as client:
                whole = await client.call_tool("list_agents", {})
                intents = await client.call_tool("list_intents", {})
                page = await client.call_tool("list_agents", {"limit": 2})
            _, direct = http("GET", f"{url}/v1/agents")
            text = whole.content[0].text
            assert len(text.encode()) > MAX_STRUCTURED_BYTES and not whole.is_error
            assert whole.structured_content is None
            assert _records(json.loads(text)) == _records(direct)
            # smaller answers, a page and the intents, carry both, the same
            assert [a["endpoint_id"] for a in _answer(page)["agents"]] == sorted(
                a["endpoint_id"] for a in direct["agents"]
            )[:2]
            assert _answer(intents) == http("GET", f"{url}/v1/intents")[1]
    finally:
        for endpoint_id in ids:
            http("POST", f"{url}/v1/deregister", {"endpoint_id": endpoint_id})


async def test_bad_arguments_get_invalid_request_and_change_nothing(net: dict[str, Any]) -> None:
    url = net["url"]
    before = http("GET", f"{url}/v1/agents")[1]
    cases: list[tuple[str, dict[str, Any], str | None]] = [
        ("reach", {}, "intent"),
        ("reach", {"intent": "Weather Query"}, "intent"),
        ("reach", {"intent_text": "x" * 2001}, "intent_text"),
        ("reach", {"intent_text": ""}, "intent_text"),
        ("reach", {"intent": "weather.query", "timeout_ms": 0}, "timeout_ms"),
        ("reach", {"intent": "weather.query", "timeout_ms": "300"}, "timeout_ms"),
        ("reach", {"intent": "weather.query", "recipient_hint": "weather"}, "recipient_hint"),
        ("reach", {"intent": "weather.query", "priority": "high"}, "priority"),
        ("explain_route", {"intent": "weather.query", "payload": {}}, "payload"),
        ("list_agents", {"all": True}, "all"),
        ("no_such_tool", {}, None),
    ]
    cases += [("reach", {"intent_text": value}, "intent_text") for value in STRANGE_TEXTS]
    async with mcp_client(url) as client:
        for name, arguments, field in cases:
            result = await client.call_tool(name, arguments)
            answer = _answer(result)
            assert result.is_error is True, (name, arguments, answer)
            # a strange text that is still text may be matched and refused: never delivered
            assert answer["error"] in ("invalid_request", "no_capable_agent"), answer
            if answer["error"] == "invalid_request" and field is not None:
                assert answer.get("field") == field, (arguments, answer)
            if name in ("reach", "explain_route"):  # ids, as every /v1/send error has
                assert answer["msg_id"].startswith("msg_"), answer
                assert answer["trace_id"].startswith("trace_"), answer
                assert answer["attempts"] == [], answer
    # nothing registered, changed or removed (a heartbeat may come meanwhile: last_seen_at)
    assert _records(http("GET", f"{url}/v1/agents")[1]) == _records(before)
    assert http("GET", f"{url}/healthz")[0] == 200
    delivered = [
        line for line in net["weather"].log_lines() if line.get("event") == "agent.request"
    ]
    assert all(line.get("intent") == "weather.query" for line in delivered)


async def test_open_mode_refuses_what_a_web_page_could_send(net: dict[str, Any]) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    status, answer, _ = http_full(
        "POST", f"{net['url']}/mcp", init, headers={"Origin": "http://evil.example"}
    )
    assert status == 403
    assert answer["ok"] is False
    assert answer["error"] == "forbidden"


# --- the tools' descriptions follow the agents ---------------------------------------------


async def test_a_new_intent_is_announced_and_listed(net: dict[str, Any]) -> None:
    url = net["url"]
    async with mcp_client(url) as client, client.listen(tools_list_changed=True) as changes:
        note = start_agent(url, "agent://note-mcp", intents="note.create")
        try:
            event = await asyncio.wait_for(changes.__anext__(), 15)
            assert type(event).__name__ == "ToolsListChanged"
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "- note.create: Write down a note" in tools["reach"].description
        finally:
            note.stop()


async def test_a_2025_session_is_told_that_the_tools_changed(net: dict[str, Any]) -> None:
    # what today's hosts speak: the handshake, a session, and its event stream (GET /mcp)
    url = net["url"]
    handler, changes = _tool_list_changes()
    async with mcp_client(url, "legacy", message_handler=handler) as client:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        tools = client.server_capabilities.tools
        assert tools is not None and tools.list_changed is True  # said at initialize
        air = start_agent(url, "agent://air-mcp", intents="air.query")
        try:
            told = await _told_of(client, changes, "- air.query: Air quality", 15)
        finally:
            air.stop()
    assert told in (1, 2)  # this change's, after at most one of a change made before


# --- sessions are bounded ------------------------------------------------------------------


def _initialize(url: str, session: str | None = None) -> tuple[int, dict[str, str]]:
    body = MCP_INITIALIZE
    headers = dict(MCP_ACCEPT)
    if session:
        headers["Mcp-Session-Id"] = session
    status, _, answer_headers = http_full("POST", f"{url}/mcp", body, headers=headers)
    return status, answer_headers


def test_sessions_are_bounded_in_count_and_idle_time() -> None:
    with gateway("--matcher", "none", "--mcp-max-sessions", "2", "--mcp-session-idle", "1") as gw:
        opened = []
        for _ in range(2):
            status, headers = _initialize(gw.url)
            assert status == 200
            opened.append(headers["mcp-session-id"])
        status, _ = _initialize(gw.url)
        assert status == 503  # a third waits until one ends
        assert metric(gw, "agent_reach_bound_hits_total", bound="mcp_sessions") == 1
        # idle sessions are closed: room again, and the old id is gone
        wait_until(lambda: _initialize(gw.url)[0] == 200, 15)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        status, _, _ = http_full(
            "POST",
            f"{gw.url}/mcp",
            ping,
            headers={
                **MCP_ACCEPT,
                "Mcp-Session-Id": opened[0],
                "Mcp-Protocol-Version": "2025-06-18",
            },
        )
        assert status == 404
        assert http("GET", f"{gw.url}/healthz")[0] == 200


def test_no_mcp_when_turned_off() -> None:
    with gateway("--matcher", "none", "--mcp-max-sessions", "0") as gw:
        status, answer = http("POST", f"{gw.url}/mcp", {})
    assert status == 404
    assert answer["error"] == "not_found"


# --- over stdio ----------------------------------------------------------------------------


def _stdio(
    url: str, token: str | None = None, mode: str = "auto", message_handler: Any = None
) -> Client:
    args = ["-m", "agent_reach", "mcp", "--gateway", url]
    if token:
        args += ["--token", token]
    server = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
    return Client(server, mode=mode, message_handler=message_handler)


async def test_stdio_serves_the_same_tools(net: dict[str, Any]) -> None:
    url = net["url"]
    async with _stdio(url) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        ok = await client.call_tool("reach", {"intent": "weather.lookup", "payload": {"x": 1}})
        refused = await client.call_tool("reach", {"intent": "unknown.action"})
        bad = await client.call_tool("reach", {"intent": "weather.query", "timeout_ms": -1})
        intents = await client.call_tool("list_intents", {})
    assert "- weather.query: Current or coming weather" in (tools["reach"].description or "")
    answer = _answer(ok)
    assert ok.is_error is False
    assert answer["endpoint_id"] == "agent://weather-mcp"
    assert answer["match"]["method"] == "alias"
    assert answer["result"]["payload"] == {"x": 1}
    assert refused.is_error is True
    assert _answer(refused)["error"] == "no_capable_agent"
    assert _answer(bad)["field"] == "timeout_ms"
    assert _answer(bad)["trace_id"].startswith("trace_") and _answer(bad)["attempts"] == []
    assert _answer(intents) == http("GET", f"{url}/v1/intents")[1]


async def test_stdio_tells_a_2025_host_that_the_tools_changed(net: dict[str, Any]) -> None:
    url = net["url"]
    handler, changes = _tool_list_changes()
    async with _stdio(url, mode="legacy", message_handler=handler) as client:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
        tools = client.server_capabilities.tools
        assert tools is not None and tools.list_changed is True  # said at initialize
        finder = start_agent(url, "agent://note-finder-mcp", intents="note.query")
        try:  # agent-reach mcp polls the gateway every 5 s
            told = await _told_of(client, changes, "- note.query: Find the notes", 20)
        finally:
            finder.stop()
    assert told in (1, 2)


async def test_stdio_answers_gateway_unavailable_when_it_is_away(tmp_path: Path) -> None:
    async with _stdio("http://127.0.0.1:9") as client:  # the discard port
        result = await client.call_tool("list_agents", {})
    assert result.is_error is True
    assert _answer(result)["error"] == "gateway_unavailable"


# --- token mode ----------------------------------------------------------------------------

POLICY = """\
[[reach]]
senders = ["agent://caller-*"]
intents = ["weather.*"]

[[claim]]
endpoints = ["agent://weather-*"]
intents = ["weather.*"]

[[claim]]
endpoints = ["agent://note-*"]
intents = ["note.*"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    s = secured_setup(tmp_path_factory.mktemp("mcp-secured"), POLICY)
    with gateway(*s.flags, "--matcher", "none") as gw:

        def issue(kind: str, **body: Any) -> str:
            status, answer = http(
                "POST", f"{gw.url}/v1/tokens", {"kind": kind, **body}, token=s.operator
            )
            assert status == 200, answer
            return str(answer["token"])

        agents: list[Proc] = []
        try:
            for endpoint_id, tag in (("weather-1", "weather.query"), ("note-1", "note.create")):
                enroll = issue("enroll", endpoints=[f"agent://{endpoint_id}"], intents=[tag])
                agents.append(
                    start_agent(gw.url, f"agent://{endpoint_id}", intents=tag, token=enroll)
                )
            wait_until(lambda: _routable(gw.url, "note.create", s.operator), 10)
            yield {
                "url": gw.url,
                "operator": s.operator,
                "caller": issue("client", subject="agent://caller-1"),
                "stranger": issue("client", subject="agent://stranger-1"),
            }
        finally:
            for agent in agents:
                agent.stop()


def test_token_mode_needs_a_bearer_token_on_mcp(secured: dict[str, Any]) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    status, answer = http("POST", f"{secured['url']}/mcp", init)
    assert status == 401
    assert answer["error"] == "unauthorized"
    status, answer = http("POST", f"{secured['url']}/mcp", init, token="not-a-token")
    assert status == 401


@pytest.mark.parametrize("mode", MODES)
async def test_token_mode_reach_sends_as_the_subject_within_the_policy(
    secured: dict[str, Any], mode: str
) -> None:
    url = secured["url"]
    async with mcp_client(url, mode, secured["caller"]) as client:
        ok = await client.call_tool("reach", {"intent": "weather.query"})
        denied = await client.call_tool("reach", {"intent": "note.create"})
    answer = _answer(ok)
    assert ok.is_error is False, answer
    assert answer["result"]["sender"] == "agent://caller-1"
    assert answer["result"]["verified"] is True
    assert denied.is_error is True
    assert _answer(denied)["error"] == "forbidden"
    async with mcp_client(url, mode, secured["stranger"]) as client:
        stranger = await client.call_tool("reach", {"intent": "weather.query"})
    assert _answer(stranger)["error"] == "forbidden"
    async with mcp_client(url, mode, secured["operator"]) as client:
        listed = await client.call_tool("list_agents", {})
        operator_reach = await client.call_tool("reach", {"intent": "weather.query"})
    assert {a["endpoint_id"] for a in _answer(listed)["agents"]} == {
        "agent://weather-1",
        "agent://note-1",
    }
    assert _answer(operator_reach)["error"] == "forbidden"  # an operator token sends nothing


def test_token_mode_a_session_is_bound_to_its_token(secured: dict[str, Any]) -> None:
    url = secured["url"]
    body = MCP_INITIALIZE
    accept = MCP_ACCEPT
    status, _, headers = http_full(
        "POST", f"{url}/mcp", body, token=secured["caller"], headers=accept
    )
    assert status == 200
    session = headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    theirs = {**accept, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
    status, _, _ = http_full("POST", f"{url}/mcp", ping, token=secured["stranger"], headers=theirs)
    assert status == 404  # as if the session did not exist
    status, _, _ = http_full("POST", f"{url}/mcp", ping, token=secured["caller"], headers=theirs)
    assert status == 200


async def test_token_mode_over_stdio(secured: dict[str, Any]) -> None:
    async with _stdio(secured["url"], secured["caller"]) as client:
        ok = await client.call_tool("reach", {"intent": "weather.query"})
        denied = await client.call_tool("reach", {"intent": "note.create"})
    assert _answer(ok)["result"]["sender"] == "agent://caller-1"
    assert _answer(denied)["error"] == "forbidden"
    async with _stdio(secured["url"]) as client:  # no token
        refused = await client.call_tool("list_agents", {})
    assert _answer(refused)["error"] == "unauthorized"


async def test_a_call_refused_for_want_of_a_stream_place_was_not_delivered() -> None:
    """``overloaded`` promises that nothing was delivered. A 2025 ``tools/call`` is answered
    as an event stream, and the SDK starts the call as it begins that answer: with every
    stream place taken, the call was refused 503 *and* delivered (a review of 2026-12-07).
    Now the place is taken before the SDK sees the request."""
    with gateway("--matcher", "none", "--mcp-max-sessions", "2") as gw:
        agent = start_agent(gw.url, "agent://mcp-counted")
        try:
            wait_until(lambda: _routable(gw.url, "test.echo"), 10)
            opened = http_full("POST", f"{gw.url}/mcp", MCP_INITIALIZE, headers=MCP_ACCEPT)
            status, _, headers = opened
            assert status == 200  # a session opened while there is room
            theirs = {
                **MCP_ACCEPT,
                "Mcp-Session-Id": headers["mcp-session-id"],
                "Mcp-Protocol-Version": "2025-06-18",
            }
            ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert http_full("POST", f"{gw.url}/mcp", ready, headers=theirs)[0] == 202

            def call(n: int) -> tuple[int, Any, dict[str, str]]:
                body = {
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "tools/call",
                    "params": {"name": "reach", "arguments": {"intent": "test.echo"}},
                }
                return http_full("POST", f"{gw.url}/mcp", body, headers=theirs)

            async with contextlib.AsyncExitStack() as stack:
                for _ in range(16):  # every place (at least 16) held by a listen stream
                    client = await stack.enter_async_context(mcp_client(gw.url))
                    await stack.enter_async_context(client.listen(tools_list_changed=True))
                status, refused, got = await asyncio.to_thread(call, 2)
            assert status == 503, refused
            assert refused["error"] == "overloaded"
            assert int(got["Retry-After"]) >= 1

            # the places are free once the gateway has seen the listens go (DISCONNECT_POLL_S)
            async def answered() -> bool:
                return (await asyncio.to_thread(call, 3))[0] == 200

            await until(answered, 10.0, "a call answered once there is room")
            # one delivery: the call answered; the refused one never started
            assert metric(gw, "agent_reach_attempts_total") == 1
        finally:
            agent.stop()


# --- pure --------------------------------------------------------------------------------------


def test_reachable_lines_name_live_tags_and_count_the_rest() -> None:
    listing = {
        "intents": [
            {"tag": "a.b", "description": "A", "routable": 2},
            {"tag": "c.d", "routable": 0},
            {"tag": "old.tag", "routable": 1, "deprecated": True},
            *({"tag": f"t.x{i}", "routable": 1} for i in range(45)),
        ]
    }
    lines = reachable_lines(*first_reachable(listing, 40))
    assert lines[0] == "- a.b: A (2 agents)"
    assert lines[1] == "- t.x0 (1 agent)"
    assert not any("c.d" in line or "old.tag" in line for line in lines)
    assert len(lines) == 41
    assert lines[-1] == "- ... and 6 more (call list_intents)"


# --- what a client can do to the HTTP side ---------------------------------------------------


def test_a_body_over_the_limit_is_refused_with_the_contract_body(net: dict[str, Any]) -> None:
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "' + b"x" * (2 << 20)
    status, answer = http("POST", f"{net['url']}/mcp", raw=big + b'"}}')
    assert status == 413
    assert answer["error"] == "payload_too_large"


async def test_stopping_ends_open_event_streams_at_once() -> None:
    with gateway("--matcher", "none") as gw:
        async with mcp_client(gw.url) as client, client.listen(tools_list_changed=True):
            started = time.monotonic()
            stopped = await asyncio.to_thread(gw.stop)
            took = time.monotonic() - started
    assert stopped == 0
    assert took < 4.0  # not the requests' grace (SHUTDOWN_S) nor twice it


async def test_event_streams_are_bounded_too() -> None:
    """The 2026 protocol's ``subscriptions/listen`` has no session: its streams were bounded
    by nothing (a review held 6 with ``--mcp-max-sessions 2``; enough of them fill the
    connection table). At most twice --mcp-max-sessions, at least 16, are open at once: the
    next is refused 503 and counted; once one ends there is room again."""
    with gateway("--matcher", "none", "--mcp-max-sessions", "2") as gw:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(16):
                client = await stack.enter_async_context(mcp_client(gw.url))
                await stack.enter_async_context(client.listen(tools_list_changed=True))
            assert metric(gw, "agent_reach_bound_hits_total", bound="mcp_streams") == 0
            with pytest.raises(Exception):  # noqa: B017 - the SDK's error for a 503, whatever it is
                async with (
                    mcp_client(gw.url) as extra,
                    extra.listen(tools_list_changed=True) as changes,
                ):
                    await asyncio.wait_for(changes.__anext__(), 10)
            assert metric(gw, "agent_reach_bound_hits_total", bound="mcp_streams") >= 1

        # the 16 ended: room again, once the gateway has seen them go (it looks every
        # DISCONNECT_POLL_S, 1 s; a loaded machine is given 10 s)
        async def listens() -> bool:
            try:
                async with mcp_client(gw.url) as client, client.listen(tools_list_changed=True):
                    return True
            except Exception:  # refused (503) while the places are still held
                return False

        await until(listens, 10.0, "a listen stream accepted again")
        assert http("GET", f"{gw.url}/healthz")[0] == 200
