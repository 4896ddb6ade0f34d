"""The client SDK and the CLI reaching a real gateway over NATS (nats://HOST:PORT/PREFIX): a
gateway process started with --nats and a prefix of its own, real agent processes (over HTTP)
reached through it, the real nats-server; register, heartbeat, send and deregister, the typed
errors, the time left as the request's timeout, the refusals, token mode, and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService
from agent_reach.errors import (
    DeadlineExceeded,
    EndpointNotRegistered,
    GatewayUnavailable,
    InvalidRequest,
    NoCapableAgent,
    RateLimited,
    Unauthorized,
)
from agent_reach.sdk._natsgateway import NatsGatewayPool
from agent_reach.sdk.client import ReachClient, SyncReachClient
from tests.support import (
    BEHAVE,
    ROOT,
    Proc,
    cli,
    gateway,
    http,
    start_agent,
    start_sdk_agent,
)

NATS_URL = os.environ.get("AGENT_REACH_TEST_NATS", "nats://127.0.0.1:4222")
NOWHERE = "http://127.0.0.1:9/reach"  # the discard port: never delivered to here
SLOW = 800  # ms the slow agent takes: past nats-py's default request timeout of 0.5 s


@dataclass
class Stack:
    gw: Proc
    prefix: str

    @property
    def nats(self) -> str:
        """The gateway URL over NATS."""
        return f"{NATS_URL}/{self.prefix}"

    def nats_api(self, op: str, status: str) -> float:
        """The gateway's count of NATS API requests of ``op`` answered ``status``."""
        _, text = http("GET", f"{self.gw.url}/metrics")
        line = f'agent_reach_nats_api_requests_total{{op="{op}",status="{status}"}} '
        found = [row for row in str(text).splitlines() if row.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0


def _prefix() -> str:
    return f"reach-test-{secrets.token_hex(4)}"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    prefix = _prefix()
    flags = ("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "30")
    with gateway(*flags) as gw:
        agents = [
            start_agent(gw.url, "agent://natsc-echo-01", intents="natsc.echo"),
            start_agent(
                gw.url, "agent://natsc-slow-01", "slow", intents="natsc.slow", delay_ms=800
            ),
        ]
        try:
            yield Stack(gw, prefix)
        finally:
            for agent in agents:
                agent.stop()


def _listed(stack: Stack) -> set[str]:
    _, body = http("GET", f"{stack.gw.url}/v1/agents")
    return {row["endpoint_id"] for row in body["agents"]}


# --- register, heartbeat, send, deregister --------------------------------------------------


async def test_register_heartbeat_and_deregister_go_over_nats(stack: Stack) -> None:
    before = stack.nats_api("register", "200")
    async with ReachClient(stack.nats) as client:
        answer = await client.register("agent://natsc-rec-01", ["natsc.rec"], NOWHERE, "a record")
        assert (answer.endpoint_id, answer.heartbeat_interval_s) == ("agent://natsc-rec-01", 30.0)
        assert "agent://natsc-rec-01" in _listed(stack)
        assert stack.nats_api("register", "200") == before + 1  # over NATS, not HTTP
        assert await client.heartbeat("agent://natsc-rec-01") == "healthy"
        assert client.gateway == stack.nats  # the server connected to, with the prefix
        await client.deregister("agent://natsc-rec-01")
        assert "agent://natsc-rec-01" not in _listed(stack)
        with pytest.raises(EndpointNotRegistered) as gone:
            await client.heartbeat("agent://natsc-rec-01")
        assert gone.value.http_status == 404
        assert stack.nats_api("heartbeat", "404") >= 1


async def test_a_send_over_nats_answers_with_its_ids_and_typed_errors(stack: Stack) -> None:
    async with ReachClient(stack.nats, sender="agent://natsc-caller-01") as client:
        reply = await client.send(
            "natsc.echo", {"city": "成都"}, msg_id="msg_natsc_1", trace_id="trace_natsc_1"
        )
        assert (reply.msg_id, reply.trace_id) == ("msg_natsc_1", "trace_natsc_1")
        assert reply.endpoint_id == "agent://natsc-echo-01"
        assert reply.result["payload"] == {"city": "成都"}
        assert reply.result["sender"] == "agent://natsc-caller-01"
        assert reply.result["trace_id"] == "trace_natsc_1"
        assert [a.outcome for a in reply.attempts] == ["ok"]

        with pytest.raises(NoCapableAgent) as none:
            await client.send("natsc.nobody", msg_id="msg_natsc_2")
        assert none.value.http_status == 404
        assert none.value.msg_id == "msg_natsc_2"
        assert none.value.trace_id is not None
        assert none.value.attempts == []

        with pytest.raises(InvalidRequest) as bad:
            await client.send("Not A Tag")  # the gateway's 422, over NATS
        assert (bad.value.http_status, bad.value.fields["field"]) == (422, "intent")
        assert bad.value.fields["msg_id"]  # the ids of a refused send, as over HTTP
    assert stack.nats_api("send", "422") >= 1


async def test_a_handler_slower_than_half_a_second_is_answered_within_the_deadline(
    stack: Stack,
) -> None:
    async with ReachClient(stack.nats) as client:
        started = time.monotonic()
        reply = await client.send("natsc.slow", timeout_ms=3000)
        took = time.monotonic() - started
    assert reply.endpoint_id == "agent://natsc-slow-01"
    assert 0.8 <= took < 3.0  # nats-py's 0.5 s default timeout would have cut it short


async def test_no_answer_in_time_after_sending_is_the_call_s_late_error(stack: Stack) -> None:
    pool = NatsGatewayPool((stack.nats,))
    try:
        # the slow agent answers after 800 ms: a call bound of 0.3 s runs out first
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="no answer over NATS to"):
            await pool.call(
                "POST",
                "/v1/send",
                late=DeadlineExceeded,
                timeout_s=0.3,
                body={"intent": "natsc.slow", "timeout_ms": 3000},
            )
        assert time.monotonic() - started < 0.8
    finally:
        await pool.close()


async def test_concurrent_first_calls_wait_for_one_connection(stack: Stack) -> None:
    async with ReachClient(stack.nats) as client:
        replies = await asyncio.gather(*(client.send("natsc.echo", {"i": i}) for i in range(20)))
    assert [reply.result["payload"]["i"] for reply in replies] == list(range(20))


async def test_a_sync_client_over_nats(stack: Stack) -> None:
    def run() -> str:
        with SyncReachClient(stack.nats) as client:
            return client.send("natsc.echo").endpoint_id

    assert await asyncio.to_thread(run) == "agent://natsc-echo-01"


# --- nothing serves the prefix, nothing listens ------------------------------------------------


async def test_no_gateway_on_the_prefix_is_gateway_unavailable_at_once(stack: Stack) -> None:
    async with ReachClient(f"{NATS_URL}/{_prefix()}") as client:
        started = time.monotonic()
        with pytest.raises(GatewayUnavailable) as caught:
            await client.send("natsc.echo", msg_id="msg_natsc_none")
        took = time.monotonic() - started
    assert "no gateway serves" in str(caught.value)
    assert "on NATS (is it started with --nats?)" in str(caught.value)
    assert caught.value.fields["msg_id"] == "msg_natsc_none"
    assert took < 1.0  # no responders: not the 9 s of the send's timeout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_no_nats_server_is_gateway_unavailable_within_the_connect_bound() -> None:
    url = f"nats://127.0.0.1:{_free_port()}/{_prefix()}"
    async with ReachClient(url, connect_timeout_s=0.5) as client:
        for _ in range(2):  # and the next call tries again, bounded the same
            started = time.monotonic()
            with pytest.raises(GatewayUnavailable, match="nothing was sent"):
                await client.heartbeat("agent://natsc-nobody-01", timeout_s=5.0)
            assert time.monotonic() - started < 1.5


# --- headers: Retry-After as over HTTP ---------------------------------------------------------


async def test_reply_headers_come_back_as_over_http() -> None:
    prefix = _prefix()
    flags = (
        "--nats",
        NATS_URL,
        "--nats-prefix",
        prefix,
        "--rate-limit",
        "0.2",
        "--rate-burst",
        "1",
    )
    with gateway(*flags):
        pool = NatsGatewayPool((f"{NATS_URL}/{prefix}",))
        try:
            statuses = []
            for _ in range(2):
                status, answer, headers, url = await pool.call(
                    "POST",
                    "/v1/send",
                    late=GatewayUnavailable,
                    timeout_s=5.0,
                    body={"intent": "natsc.none"},
                )
                statuses.append(status)
            assert statuses == [404, 429]  # no agent, then over the rate
            assert answer["error"] == "rate_limited"
            assert headers["reach-status"] == "429"
            assert float(headers["Retry-After"]) > 0
            assert url == f"{NATS_URL}/{prefix}"
        finally:
            await pool.close()
        # the limit is per caller: a new client (a new NATS connection) has its own bucket
        async with ReachClient(f"{NATS_URL}/{prefix}") as client:
            with pytest.raises(NoCapableAgent):
                await client.send("natsc.none")
            with pytest.raises(RateLimited) as limited:
                await client.send("natsc.none")
        assert limited.value.fields["retry_after_s"] > 0


# --- token mode --------------------------------------------------------------------------------

POLICY = """\
[[reach]]
senders = ["agent://natsc-caller-*"]
intents = ["natsc.*"]

[[claim]]
endpoints = ["agent://natsc-*"]
intents = ["natsc.*"]
"""


@dataclass
class Secured:
    stack: Stack
    keys: Path

    def token(self, kind: Kind, subject: str, **claims: Any) -> str:
        ring = KeyRing(self.keys)
        ring.load()
        return TokenService(ring).issue(kind, subject, 600, **claims)[0]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("natsc-secured")
    keys = root / "keys"
    generate_key(keys)
    policy = root / "policy.toml"
    policy.write_text(POLICY)
    prefix = _prefix()
    flags = ["--auth", "tokens", "--keys", str(keys), "--policy", str(policy)]
    with gateway(*flags, "--nats", NATS_URL, "--nats-prefix", prefix) as gw:
        made = Secured(Stack(gw, prefix), keys)
        enroll = made.token(
            Kind.ENROLL, "natsc fleet", endpoints=["agent://natsc-*"], intents=["natsc.*"]
        )
        agent = start_agent(gw.url, "agent://natsc-secured-01", intents="natsc.echo", token=enroll)
        try:
            yield made
        finally:
            agent.stop()


async def test_token_mode_the_authorization_header_travels_over_nats(secured: Secured) -> None:
    nats = secured.stack.nats
    async with ReachClient(nats) as anonymous:
        with pytest.raises(Unauthorized) as refused:
            await anonymous.send("natsc.echo")
        assert refused.value.http_status == 401
        with pytest.raises(Unauthorized):
            await anonymous.register("agent://natsc-tok-01", ["natsc.echo"], NOWHERE)
    caller = secured.token(Kind.CLIENT, "agent://natsc-caller-01")
    async with ReachClient(nats, token=caller, sender="agent://natsc-caller-01") as client:
        reply = await client.send("natsc.echo", {"n": 1})
    assert reply.endpoint_id == "agent://natsc-secured-01"
    assert reply.result["sender"] == "agent://natsc-caller-01"
    assert reply.result["verified"] is True  # the gateway signed the delivery for its agent
    # an enrollment token registers over NATS; the endpoint token it answers with beats
    enroll = secured.token(
        Kind.ENROLL, "natsc fleet", endpoints=["agent://natsc-tok-*"], intents=["natsc.*"]
    )
    async with ReachClient(nats, token=enroll) as agent:
        answer = await agent.register("agent://natsc-tok-01", ["natsc.echo"], NOWHERE)
        assert answer.token is not None
        assert agent.endpoint_token("agent://natsc-tok-01") == answer.token
        assert await agent.heartbeat("agent://natsc-tok-01") == "healthy"
        await agent.deregister("agent://natsc-tok-01")


async def test_token_mode_an_agent_with_nothing_but_nats_verifies_its_deliveries(
    secured: Secured,
) -> None:
    """Registered, heartbeated and reached over NATS only, the agent fetches the gateway's
    keys over NATS too (PREFIX.v1.keys) and verifies every delivery with them."""
    nats = secured.stack.nats
    gw = secured.stack.gw
    async with ReachClient(nats) as anonymous:
        over_nats = await anonymous.get("/v1/keys")  # public, as over HTTP
    assert over_nats == http("GET", f"{gw.url}/v1/keys")[1]
    assert over_nats["keys"], over_nats
    enroll = secured.token(
        Kind.ENROLL, "natsc fleet", endpoints=["agent://natsc-bus-*"], intents=["natsc.*"]
    )
    agent = start_sdk_agent(
        [
            sys.executable,
            str(BEHAVE),
            "--gateway",
            nats,
            "--id",
            "agent://natsc-bus-01",
            "--intents",
            "natsc.bus",
            "--serve",
            NATS_URL,
        ],
        env={"AGENT_REACH_TOKEN": enroll},
    )
    try:
        assert agent.url.startswith("nats:")
        caller = secured.token(Kind.CLIENT, "agent://natsc-caller-01")
        async with ReachClient(gw.url, token=caller, sender="agent://natsc-caller-01") as client:
            reply = await client.send("natsc.bus", {"n": 2})
        assert reply.endpoint_id == "agent://natsc-bus-01"
        assert reply.result["verified"] is True
    finally:
        agent.stop()


# --- the CLI -----------------------------------------------------------------------------------


def test_the_cli_sends_registers_beats_and_deregisters_over_nats(stack: Stack) -> None:
    sent = cli("send", "natsc.echo", '{"k": 1}', "--gateway", stack.nats, "--json")
    assert sent.code == 0, sent.err
    body = json.loads(sent.out)
    assert (body["endpoint_id"], body["result"]["payload"]) == ("agent://natsc-echo-01", {"k": 1})

    registered = cli(
        "register", "natsc-cli-01", NOWHERE, "--intent", "natsc.cli", "--gateway", stack.nats
    )
    assert registered.code == 0, registered.err
    assert registered.out == "registered agent://natsc-cli-01: heartbeat every 30 s\n"
    assert "agent://natsc-cli-01" in _listed(stack)
    env = {"AGENT_REACH_GATEWAY": stack.nats}  # the variable, as the flag
    beat = cli("heartbeat", "agent://natsc-cli-01", "--json", env=env)
    assert beat.code == 0, beat.err
    assert json.loads(beat.out) == {"endpoint_id": "agent://natsc-cli-01", "status": "healthy"}
    gone = cli("deregister", "natsc-cli-01", env=env)
    assert (gone.code, gone.out) == (0, "deregistered agent://natsc-cli-01\n")
    assert "agent://natsc-cli-01" not in _listed(stack)
    again = cli("heartbeat", "natsc-cli-01", env=env)
    assert again.code == 1  # the gateway's answer: endpoint_not_registered
    assert "endpoint_not_registered" in again.err

    nobody = cli("send", "natsc.echo", "--gateway", f"{NATS_URL}/{_prefix()}")
    assert nobody.code == 3  # no gateway serves that prefix
    assert "no gateway serves" in nobody.err


@pytest.mark.parametrize(
    "args",
    [("agents",), ("route", "natsc.echo"), ("trace", "trace_x"), ("doctor",)],
)
def test_cli_commands_not_served_over_nats_are_refused_before_sending(
    stack: Stack, args: tuple[str, ...]
) -> None:
    run = cli(*args, "--gateway", stack.nats)
    assert (run.code, run.out) == (2, "")
    assert f"`agent-reach {args[0]}` is not served over NATS" in run.err
    assert "only register, heartbeat, deregister, send and its public keys" in run.err
    assert "Traceback" not in run.err


def test_cli_mixed_gateways_are_a_usage_error() -> None:
    run = cli("send", "natsc.echo", "--gateway", f"http://127.0.0.1:9,{NATS_URL}")
    assert run.code == 2
    assert "cannot mix http(s) and NATS" in run.err


# --- without the nats extra --------------------------------------------------------------------


def test_the_sdk_imports_without_nats_py_and_says_what_to_install() -> None:
    script = (
        "import sys\n"
        "sys.modules['nats'] = None\n"  # as if nats-py were not installed
        "from agent_reach import ReachClient\n"
        "from agent_reach.errors import ConfigError\n"
        "ReachClient('http://127.0.0.1:7700')\n"
        "try:\n"
        "    ReachClient('nats://127.0.0.1:4222')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'agent-reach-gateway[nats]'" in done.stdout
