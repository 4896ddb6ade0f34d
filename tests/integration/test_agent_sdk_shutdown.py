"""The agent SDK as it stops, and what a direct POST may make it hold: a real Agent in this
process (its own aiohttp server on 127.0.0.1, its heartbeat line on its own thread) against a
stand-in for the gateway's HTTP API (an external edge: an aiohttp server answering register,
heartbeat, deregister and send).

- ``stop()`` called while a handler awaits an onward ``ctx.reach``: the reach goes through, the
  delivery is answered 200, and a reach the handler starts after the deregistration goes out
  through the same client with the agent's endpoint token.
- ``stop()`` returns within its bound even when an async handler swallows its cancellation.
- A ``msg_id`` longer than the gateway ever sends is refused 422 naming ``msg_id``, and the
  dedup memory's byte count includes the keys.
- An agent process whose sync handler never returns exits on SIGTERM (a real process: its
  worker threads must not hold the interpreter's exit).
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent_reach.sdk import Agent, ReachContext
from tests.support import served

WAIT_S = 10.0  # the bound on every wait for something to happen
ENDPOINT_TOKEN = "ept-shutdown-0123456789"


@dataclass
class StandIn:
    """The gateway's register, heartbeat, deregister and send calls. In token mode
    (``token``) the registration answers with ``ENDPOINT_TOKEN``. The first send is held
    until ``release`` is set (``reached`` says it arrived); each send's Authorization is kept
    in ``sent``. ``deregistered`` is set on the deregistration."""

    token: bool = False
    sent: list[str | None] = field(default_factory=list)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    deregistered: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer: dict[str, Any] = {"ok": True, "endpoint_id": body["endpoint_id"]}
        answer["heartbeat_interval_s"] = 10.0
        if self.token:
            answer["token"] = ENDPOINT_TOKEN
        return web.json_response(answer)

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(
            {"ok": True, "endpoint_id": body["endpoint_id"], "status": "healthy"}
        )

    async def deregister(self, request: web.Request) -> web.Response:
        self.deregistered.set()
        return web.json_response({"ok": True})

    async def send(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.sent.append(request.headers.get("Authorization"))
        if len(self.sent) == 1:
            self.reached.set()
            await asyncio.wait_for(self.release.wait(), WAIT_S)
        return web.json_response(
            {
                "ok": True,
                "msg_id": "msg_onward",
                "trace_id": body.get("trace_id") or "trace_onward",
                "intent": body["intent"],
                "endpoint_id": "agent://sdk-downstream-01",
                "result": {"n": len(self.sent)},
                "attempts": [],
                "latency_ms": 1.0,
            }
        )


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    gw = StandIn()
    app = web.Application()
    app.router.add_post("/v1/register", gw.register)
    app.router.add_post("/v1/heartbeat", gw.heartbeat)
    app.router.add_post("/v1/deregister", gw.deregister)
    app.router.add_post("/v1/send", gw.send)
    async with served(app) as url:
        gw.url = url
        try:
            yield gw
        finally:
            gw.release.set()  # what still waits on it ends, so that the server can stop


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        # (a stream: aiohttp warns of a large body given as bytes)
        session.post(url, data=io.BytesIO(json.dumps(body).encode())) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize("token", [False, True], ids=["open", "token"])
async def test_stop_lets_a_handler_in_flight_finish_its_onward_reaches(
    stand_in: StandIn, token: bool
) -> None:
    """The client was closed on deregistering, before the deliveries in flight had ended: the
    reach in flight failed (the delivery answered 500), and one started after made a client
    never closed, with no token in token mode."""
    stand_in.token = token
    agent = Agent(
        "agent://sdk-stopping-01",
        gateway=stand_in.url,
        token="enroll-token" if token else None,
        verify_deliveries=False,
        shutdown_timeout=WAIT_S,
    )

    @agent.handle("sdk.relay")
    async def relay(payload: Any, ctx: ReachContext) -> Any:
        first = await ctx.reach("sdk.downstream", {"n": 1})  # in flight while stop() begins
        second = await ctx.reach("sdk.downstream", {"n": 2})  # started after deregistering
        return [first.result, second.result]

    await agent.start()
    assert agent.url is not None
    stopping: asyncio.Task[None] | None = None
    try:
        delivery = asyncio.create_task(
            post(agent.url, {"intent": "sdk.relay", "msg_id": "msg_relay_01", "payload": {}})
        )
        await asyncio.wait_for(stand_in.reached.wait(), WAIT_S)
        stopping = asyncio.create_task(agent.stop())
        await asyncio.wait_for(stand_in.deregistered.wait(), WAIT_S)
        stand_in.release.set()
        status, answer = await asyncio.wait_for(delivery, WAIT_S)
        assert (status, answer) == (200, [{"n": 1}, {"n": 2}])
        await asyncio.wait_for(stopping, WAIT_S)
    finally:
        stand_in.release.set()
        if stopping is None:
            await agent.stop()
    expected = f"Bearer {ENDPOINT_TOKEN}" if token else None
    assert stand_in.sent == [expected, expected]  # both as this agent
    assert agent.endpoint_token is None  # let go once stopped


async def test_stop_returns_within_its_bound_when_a_handler_swallows_cancellation(
    stand_in: StandIn,
) -> None:
    """RunOnce.close waited for the cancelled runs with no bound: stop() hung for good."""
    bound_s = 0.5
    agent = Agent("agent://sdk-stubborn-01", gateway=stand_in.url, shutdown_timeout=bound_s)
    started, done = asyncio.Event(), asyncio.Event()

    @agent.handle("sdk.stubborn")
    async def stubborn(payload: Any, ctx: ReachContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(WAIT_S)
        except asyncio.CancelledError:  # what this test is about: a handler that will not stop
            await asyncio.sleep(WAIT_S)
        finally:
            done.set()
        return {}

    await agent.start()
    assert agent.url is not None
    delivery = asyncio.create_task(
        post(agent.url, {"intent": "sdk.stubborn", "msg_id": "msg_stubborn_01"})
    )
    await asyncio.wait_for(started.wait(), WAIT_S)
    began = time.monotonic()
    # the runner's wait for the delivery, then the cancelled run's: a bound each
    await asyncio.wait_for(agent.stop(), WAIT_S)
    assert time.monotonic() - began < 4 * bound_s + 1.0
    assert not done.is_set()  # left behind, still sleeping
    with pytest.raises(aiohttp.ClientError):  # the server closed the connection
        await delivery
    # the run left behind ends with the test, not with the event loop
    for task in asyncio.all_tasks():
        if task.get_coro().__qualname__.startswith("RunOnce."):  # type: ignore[union-attr]
            task.cancel()
            await asyncio.wait_for(done.wait(), WAIT_S)


async def test_a_msg_id_longer_than_the_gateway_sends_is_refused_and_keys_are_counted(
    stand_in: StandIn,
) -> None:
    """Only the answer's bytes were counted: ~1 MiB msg_ids held ~1 GiB across the entries
    while the memory reported a few KB."""
    agent = Agent("agent://sdk-keys-01", gateway=stand_in.url, max_body_bytes=4 << 20)
    agent.handle("sdk.echo")(lambda payload, ctx: payload)
    await agent.start()
    try:
        assert agent.url is not None
        huge = "m" * (1 << 20)
        status, answer = await post(agent.url, {"intent": "sdk.echo", "msg_id": huge})
        assert status == 422
        assert (answer["error"], answer["field"]) == ("invalid_request", "msg_id")
        status, answer = await post(agent.url, {"intent": "sdk.echo", "msg_id": "m" * 129})
        assert (status, answer["field"]) == (422, "msg_id")
        memory = agent._dispatcher.once.cache  # the dedup memory: what it says it holds
        assert len(memory) == 0
        # the longest the gateway sends is answered, and counted with its key
        longest, sender = "k" * 128, "agent://sdk-caller-01"
        status, answer = await post(
            agent.url,
            {"intent": "sdk.echo", "msg_id": longest, "sender": sender, "payload": {"a": 1}},
        )
        assert (status, answer) == (200, {"a": 1})
        assert len(memory) == 1
        assert memory.bytes == len(b'{"a":1}') + len(longest) + len("sdk.echo") + len(sender)
    finally:
        await agent.stop()


HUNG_AGENT = """
import sys, threading
from agent_reach.sdk import Agent

agent = Agent("agent://sdk-hung-01", gateway=sys.argv[1], shutdown_timeout=0.5)

@agent.handle("t.hang")
def hang(payload, ctx):
    print("handler entered", flush=True)
    threading.Event().wait()  # a blocking call without a timeout: it never returns

agent.run()
"""


async def test_an_agent_whose_sync_handler_never_returns_exits_on_sigterm(
    stand_in: StandIn,
) -> None:
    """A review found such a process never exited: stop() ran, but the interpreter joined the
    thread pool's (non-daemon) worker at exit, so SIGTERM left it hanging until a SIGKILL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HUNG_AGENT, stand_in.url, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(WAIT_S):
            line = (await proc.stdout.readline()).decode()
        url = line.split(" at ", 1)[1].strip()  # "<id> serving [...] at <url>"
        delivery = asyncio.create_task(post(url, {"intent": "t.hang", "msg_id": "m-hang"}))
        async with asyncio.timeout(WAIT_S):
            assert (await proc.stdout.readline()).decode().strip() == "handler entered"
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT_S):  # stop() waits 0.5 s for the run, then exits
            code = await proc.wait()
        assert code == 0
        assert stand_in.deregistered.is_set()
        delivery.cancel()
        await asyncio.gather(delivery, return_exceptions=True)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
