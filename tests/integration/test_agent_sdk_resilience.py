"""The agent SDK under what a gateway, or overload, may throw at it: a real Agent in this
process (its own aiohttp server on 127.0.0.1, its heartbeat line on its own thread) against a
stand-in for the gateway's HTTP API (an external edge: an aiohttp server here, answering what
each test needs it to).

- The heartbeat line outlives an answer it cannot read (JSON nested past the decoder's depth,
  an error body that breaks the typed error): the heartbeats carry on.
- Under overload, a sync run whose deadline passed while it waited for a worker is not run:
  answered 503, and a retry of the message runs.
- In token mode, signed deliveries arriving together while the agent has no keys yet all wait
  for one key fetch and are accepted.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import TokenService
from agent_reach.sdk import Agent, ReachContext
from tests.support import served

WAIT_S = 10.0  # the bound on every wait for something to happen


@dataclass
class StandIn:
    """The gateway's register, heartbeat, deregister and keys calls. ``beats`` are the
    answers to the first heartbeats ((status, raw body), in order; then 200 healthy), and
    ``beaten`` is set once ``want_beats`` heartbeats were answered 200. ``keys`` (token mode)
    is the JWKS ``GET /v1/keys`` answers, after ``keys_delay_s``."""

    interval_s: float = 10.0
    token: str | None = None
    beats: list[tuple[int, bytes]] = field(default_factory=list)
    want_beats: int = 0
    keys: dict[str, Any] | None = None
    keys_delay_s: float = 0.0
    heartbeats: int = 0  # answered 200
    key_fetches: list[str | None] = field(default_factory=list)  # their Authorization
    beaten: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = {"ok": True, "endpoint_id": body["endpoint_id"]}
        answer["heartbeat_interval_s"] = self.interval_s
        if self.token is not None:
            answer["token"] = self.token
        return web.json_response(answer)

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.beats:
            status, raw = self.beats.pop(0)
            return web.Response(status=status, body=raw, content_type="application/json")
        self.heartbeats += 1
        if self.heartbeats >= self.want_beats:
            self.beaten.set()
        return web.json_response(
            {"ok": True, "endpoint_id": body["endpoint_id"], "status": "healthy"}
        )

    async def deregister(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def jwks(self, request: web.Request) -> web.Response:
        self.key_fetches.append(request.headers.get("Authorization"))
        await asyncio.sleep(self.keys_delay_s)  # a slow gateway, as the test wants it
        return web.json_response(self.keys or {"keys": []})


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    gw = StandIn()
    app = web.Application()
    app.router.add_post("/v1/register", gw.register)
    app.router.add_post("/v1/heartbeat", gw.heartbeat)
    app.router.add_post("/v1/deregister", gw.deregister)
    app.router.add_get("/v1/keys", gw.jwks)
    async with served(app) as url:
        gw.url = url
        yield gw


def nested(depth: int) -> bytes:
    """Valid JSON nested ``depth`` deep: msgspec raises RecursionError on it, not DecodeError."""
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param((200, nested(5000)), id="nested-json"),
        # a field named like AgentReachError.__init__'s first parameter: making the typed
        # error raises TypeError (not one of ours)
        pytest.param(
            (503, b'{"ok": false, "error": "unavailable", "detail": "x", "self": 1}'),
            id="error-body-breaking-the-typed-error",
        ),
    ],
)
async def test_heartbeats_carry_on_after_an_answer_the_line_cannot_read(
    stand_in: StandIn, answer: tuple[int, bytes]
) -> None:
    stand_in.interval_s = 0.05  # a heartbeat every 30-40 ms
    stand_in.beats = [answer]
    stand_in.want_beats = 5
    agent = Agent("agent://sdk-resilient-01", gateway=stand_in.url)
    agent.handle("sdk.echo")(lambda payload, ctx: payload)
    await agent.start()
    try:
        # the line died on the first heartbeat's answer before: the server saw no more
        await asyncio.wait_for(stand_in.beaten.wait(), WAIT_S)
        assert not stand_in.beats  # the bad answer was given, and the line went on
        assert agent.registered
    finally:
        await agent.stop()


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, Any]:
    raw = json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **headers}
    async with session.post(url, data=raw, headers=sent) as resp:
        return resp.status, await resp.json()


async def test_sync_runs_whose_deadline_passed_in_the_queue_are_answered_503_unrun(
    stand_in: StandIn,
) -> None:
    ran: list[str] = []
    lock = threading.Lock()

    def slow(payload: Any, ctx: ReachContext) -> str:
        with lock:
            ran.append(ctx.msg_id)
        time.sleep(0.2)  # the handler's work
        return ctx.msg_id

    agent = Agent("agent://sdk-deadlines-01", gateway=stand_in.url, workers=1)
    agent.handle("sdk.slow")(slow)
    await agent.start()
    try:
        url = agent.url or ""
        ids = [f"m{n}" for n in range(5)]
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(
                *(
                    post(
                        session,
                        url,
                        {"intent": "sdk.slow", "msg_id": m},
                        {"X-Reach-Deadline-Ms": "100"},
                    )
                    for m in ids
                )
            )
            by_id = dict(zip(ids, answers, strict=True))
            late = [m for m, (status, _) in by_id.items() if status == 503]
            # one worker, 200 ms a run: no run but the first can start within 100 ms
            assert len(late) >= 4, by_id
            for m in late:
                assert by_id[m][1]["error"] == "backend_unavailable", by_id[m]
            assert sorted(ran) == sorted(set(ids) - set(late))  # the late ones never ran
            # not remembered: a retry of the message, with time to run, runs
            retried = await post(
                session,
                url,
                {"intent": "sdk.slow", "msg_id": late[0]},
                {"X-Reach-Deadline-Ms": "5000"},
            )
            assert retried == (200, late[0])
            assert ran.count(late[0]) == 1
    finally:
        await agent.stop()


async def test_signed_deliveries_arriving_together_wait_for_one_key_fetch(
    stand_in: StandIn, tmp_path: Path
) -> None:
    endpoint, owner = "agent://sdk-signed-01", "gen-1"
    generate_key(tmp_path)
    keys = KeyRing(tmp_path)
    keys.load()
    signer = TokenService(keys)
    stand_in.token = "ep-1"  # the endpoint token the registration answers with
    stand_in.keys = keys.jwks(recipient=(endpoint, owner))
    stand_in.keys_delay_s = 0.2

    agent = Agent(endpoint, gateway=stand_in.url, token="enroll-1")
    agent.handle("sdk.signed")(lambda payload, ctx: {"verified": ctx.verified})
    await agent.start()
    try:
        assert agent.verifies_deliveries and agent.endpoint_token == "ep-1"
        url = agent.url or ""

        def delivery(msg_id: str) -> tuple[dict[str, Any], dict[str, str]]:
            body = {"intent": "sdk.signed", "msg_id": msg_id, "sender": "agent://caller-1"}
            assertion = signer.sign_delivery(
                sender="agent://caller-1",
                recipient=endpoint,
                owner=owner,
                intent="sdk.signed",
                msg_id=msg_id,
                body=json.dumps(body).encode(),  # what post() sends
                expires_at=time.time() + 30,
            )
            return body, {"X-Reach-Assertion": assertion}

        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(
                *(post(session, url, *delivery(m)) for m in ("s1", "s2", "s3"))
            )
        # before: the first fetched, the two others found the fetch "done within a second"
        # and were refused 401 for a key "the gateway does not publish"
        assert answers == [(200, {"verified": True})] * 3
        assert stand_in.key_fetches == ["Bearer ep-1"]  # one fetch, all three waited for it
    finally:
        await agent.stop()
