"""The gateway's API over NATS (``PREFIX.v1.register|heartbeat|deregister|send``), for real.

Real gateway processes (``--nats``, a random ``--nats-prefix`` per test), the real nats-server
(``AGENT_REACH_TEST_NATS``, default 127.0.0.1:4222; private ones on free ports where a test
stops its server), real Redis where two gateways share a registry. Callers are plain nats-py
requests, agents plain nats-py responders (tests/agents/bus_echo.py): nothing of our SDK.

What is shown: every operation answers over NATS what it answers over HTTP (status in
``Reach-Status``, present exactly when not 200, ``Retry-After`` beside a 429); heartbeats over
NATS alone keep an agent healthy; token mode reads the ``Authorization`` header; two gateways
serve the subjects as one queue group and one that stops leaves it without losing a request;
fuzzed bodies and headers get the contract's answers and change nothing; a gateway whose NATS
link is down still serves HTTP and says so.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats import errors as nats_errors

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService
from tests.fuzz_support import ROUTING_5XX, json_values
from tests.nats_support import (
    NATS_URL,
    Answer,
    Bus,
    PrivateNats,
    ask,
    check_reach_status,
    hpub,
    new_prefix,
    private_server,
    raw_connection,
    raw_request,
    start_bus_echo,
    unique,
)
from tests.support import (
    REDIS_URL,
    Proc,
    drop_prefix,
    gateway,
    health,
    http,
    http_full,
    metric,
    wait_until,
)

OPS = ("register", "heartbeat", "deregister", "send")


@pytest.fixture
def bus() -> Iterator[Bus]:
    caller = Bus()
    try:
        yield caller
    finally:
        caller.close()


@pytest.fixture
def private_nats() -> Iterator[PrivateNats]:
    with private_server() as server:
        yield server


# --- the same answers as over HTTP -----------------------------------------------------------


VOLATILE = {"msg_id", "trace_id", "latency_ms"}


def same_shape(body: Any) -> Any:
    """``body`` without what differs between two answers to the same request (fresh ids and
    measured latencies)."""
    if isinstance(body, dict):
        return {k: same_shape(v) for k, v in body.items() if k not in VOLATILE}
    if isinstance(body, list):
        return [same_shape(v) for v in body]
    return body


def test_each_operation_answers_over_nats_as_over_http(bus: Bus) -> None:
    prefix = new_prefix()
    subject = unique("parity")
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "30"]
    with gateway(*flags, "--max-body-bytes", "4096") as gw:
        agent = start_bus_echo(NATS_URL, subject)
        try:
            registration = {
                "endpoint_id": "agent://parity-a",
                "capabilities": ["parity.echo"],
                "endpoint_url": f"nats:{subject}",
            }
            gone = {  # a subject of its own: one live id's subject is refused to another
                **registration,
                "endpoint_id": "agent://parity-gone",
                "endpoint_url": f"nats:{unique('parity-gone')}",
            }

            def register_gone() -> None:
                assert http("POST", f"{gw.url}/v1/register", gone)[0] == 200

            cases: list[tuple[str, Any, int, Callable[[], None] | None]] = [
                ("register", registration, 200, None),
                ("register", b"not json", 400, None),
                ("register", b"[]", 422, None),
                ("register", {**registration, "endpoint_url": f"nats:{prefix}.v1.send"}, 422, None),
                ("register", {**registration, "endpoint_id": "agent://UPPER"}, 422, None),
                ("register", {**registration, "description": "x" * 5000}, 413, None),
                ("heartbeat", {"endpoint_id": "agent://parity-a"}, 200, None),
                ("heartbeat", {"endpoint_id": "agent://parity-nobody"}, 404, None),
                ("heartbeat", {}, 422, None),
                ("send", {"intent": "parity.echo", "payload": {"城市": "成都"}}, 200, None),
                ("send", {"intent": "parity.none", "fallback": False}, 404, None),
                ("send", {"intent": "parity.echo", "recipient_hint": "agent://nobody"}, 404, None),
                ("send", {"intent": "parity.echo", "timeout_ms": 0}, 422, None),
                ("send", b"\xff\xfe", 400, None),
                # over --max-body-bytes: a send's error names its ids here too (a review)
                ("send", {"intent": "parity.echo", "payload": {"x": "x" * 5000}}, 413, None),
                ("deregister", {"endpoint_id": "agent://parity-gone"}, 200, register_gone),
                ("deregister", {"endpoint_id": "bad id"}, 422, None),
            ]
            for op, body, expected, before in cases:
                if before is not None:
                    before()
                over_nats = bus.request(f"{prefix}.v1.{op}", body)
                check_reach_status(over_nats)
                if before is not None:
                    before()
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                status, over_http, _ = http_full("POST", f"{gw.url}/v1/{op}", raw=raw)
                assert (over_nats.status, status) == (expected, expected), (op, body, over_nats)
                assert over_nats.headers["Content-Type"] == "application/json"
                assert same_shape(over_nats.body) == same_shape(over_http), (op, body)
                if op == "send":  # every answer of a send names its ids, fresh when not given
                    assert over_nats.body["msg_id"] != over_http["msg_id"]
                    assert over_nats.body["trace_id"].startswith("trace_")

            # a send over NATS is a request like another: traced, and the agent was reached
            answer = bus.request(f"{prefix}.v1.send", {"intent": "parity.echo", "payload": [1]})
            assert answer.status == 200, answer
            assert answer.body["result"] == {
                "echo": [1],
                "pid": agent.pid,
                "msg_id": answer.body["msg_id"],
            }
            status, trace = http("GET", f"{gw.url}/v1/traces/{answer.body['trace_id']}")
            assert status == 200 and trace["events"], trace
            counted = metric(gw, "agent_reach_nats_api_requests_total", op="send", status="200")
            assert counted == 2
            assert metric(gw, "agent_reach_nats_api_requests_total", op="register") == 6
        finally:
            agent.stop()


def test_a_429_carries_retry_after_over_nats_as_over_http(bus: Bus) -> None:
    prefix = new_prefix()
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix]
    limits = ["--register-rate-limit", "1", "--register-rate-burst", "1"]
    with gateway(*flags, *limits) as gw:
        body = {
            "endpoint_id": "agent://limited-1",
            "capabilities": ["limited.echo"],
            "endpoint_url": f"nats:{unique('limited')}",
        }
        first, second = (bus.request(f"{prefix}.v1.register", body) for _ in range(2))
        http_first = http_full("POST", f"{gw.url}/v1/register", body)
        http_second = http_full("POST", f"{gw.url}/v1/register", body)
        for answer in (first, second):
            check_reach_status(answer)
        assert (first.status, http_first[0]) == (200, 200)
        assert first.body == http_first[1]
        assert (second.status, http_second[0]) == (429, 429)
        assert second.headers["Retry-After"] == http_second[2]["Retry-After"] == "1"
        for got in (second.body, http_second[1]):
            assert (got["ok"], got["error"], got["retry_after_s"]) == (False, "rate_limited", 1)
        # the caller's key over NATS is its reply inbox: another connection has its own bucket
        other = Bus()
        try:
            assert other.request(f"{prefix}.v1.register", body).status == 200
        finally:
            other.close()
        assert metric(gw, "agent_reach_nats_api_requests_total", op="register", status="429") == 1


def test_a_subject_a_live_id_holds_is_refused_to_another_id() -> None:
    """A review: two ids on one ``nats:`` subject are two queue groups, so both agents took
    every delivery, and the caller got whichever answered first (the other's 404). The second
    id is refused while the first is registered and not down; the first may register again."""
    prefix, subject = new_prefix(), f"nats:{unique('held')}"
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix) as gw:

        def register(endpoint_id: str) -> tuple[int, Any]:
            body = {"endpoint_id": endpoint_id, "capabilities": ["held.t"], "endpoint_url": subject}
            return http("POST", f"{gw.url}/v1/register", body)

        assert register("agent://held-1")[0] == 200
        status, answer = register("agent://held-2")
        assert (status, answer.get("field")) == (422, "endpoint_url"), answer
        assert "agent://held-1" in answer["detail"]
        assert register("agent://held-1")[0] == 200  # its own subject again
        assert http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://held-1"})[0] == 200
        assert register("agent://held-2")[0] == 200  # free again


def test_clients_with_one_inbox_a_request_are_not_one_caller() -> None:
    """A review: a reply subject of two tokens (an older client's ``_INBOX.<nuid>``, one per
    request) was cut to ``_INBOX``, so every such client shared one rate limit: the second
    one was refused on its very first request."""
    prefix = new_prefix()
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix]
    with gateway(*flags, "--register-rate-limit", "0.2", "--register-rate-burst", "1"):
        for n in range(2):  # two callers, one request each
            body = {
                "endpoint_id": f"agent://inbox-{n}",
                "capabilities": ["inbox.echo"],
                "endpoint_url": f"nats:{unique('inbox')}",
            }
            answer = raw_request(
                NATS_URL, f"{prefix}.v1.register", b"NATS/1.0\r\n\r\n", json.dumps(body).encode()
            )
            assert answer is not None and answer.status == 200, (n, answer)


def test_a_gateways_unreadable_delivery_is_told_the_loop_over_nats_as_over_http(
    bus: Bus,
) -> None:
    """A review: a gateway's delivery (``X-Reach-Attempt``) to this gateway's own send with a
    body that is not a send got 400 over NATS where HTTP answers it with the loop it is (422,
    field ``X-Reach-Attempt``)."""
    prefix = new_prefix()
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix, "--max-body-bytes", "4096"]
    with gateway(*flags) as gw:
        headers = {"X-Reach-Attempt": "1"}
        for body in (b"notjson", json.dumps({"payload": "x" * 5000}).encode()):
            over_nats = bus.request(f"{prefix}.v1.send", body, headers)
            status, over_http, _ = http_full("POST", f"{gw.url}/v1/send", raw=body, headers=headers)
            assert (over_nats.status, status) == (422, 422), (body[:20], over_nats)
            assert over_nats.body["field"] == over_http["field"] == "X-Reach-Attempt"


def test_a_forwarded_send_is_judged_over_nats_as_over_http(bus: Bus) -> None:
    """A review: the NATS API read no ``X-Reach-Hops`` / ``X-Reach-Origin``, so a send
    carrying them was not held to federation's rules (one forward, never again): a loop the
    HTTP edge answers 508 was served over NATS."""
    prefix = new_prefix()
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix, "--matcher", "none") as gw:
        body = {"intent": "hops.t", "payload": {}, "timeout_ms": 2000}
        for hops, status, error in (("2", 508, "loop_detected"), ("x", 422, "invalid_request")):
            headers = {"X-Reach-Hops": hops, "X-Reach-Origin": "elsewhere"}
            over_nats = bus.request(f"{prefix}.v1.send", body, headers)
            over_http = http_full("POST", f"{gw.url}/v1/send", body, headers=headers)
            assert (over_nats.status, over_http[0]) == (status, status), (hops, over_nats)
            assert over_nats.body["error"] == over_http[1]["error"] == error


# --- heartbeats over NATS only ------------------------------------------------------------------


def test_heartbeats_over_nats_alone_keep_an_agent_healthy(bus: Bus) -> None:
    prefix = new_prefix()
    interval = 0.5
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", str(interval)]
    with gateway(*flags) as gw:
        body = {
            "endpoint_id": "agent://beating-1",
            "capabilities": ["beating.echo"],
            "endpoint_url": f"nats:{unique('beating')}",
        }
        registered = bus.request(f"{prefix}.v1.register", body)
        assert registered.status == 200, registered
        assert registered.body["heartbeat_interval_s"] == interval
        started = time.monotonic()
        seen = []
        while time.monotonic() - started < 4 * interval:  # past down-after (3 intervals)
            beat = bus.request(f"{prefix}.v1.heartbeat", {"endpoint_id": "agent://beating-1"})
            assert (beat.status, beat.body["status"]) == (200, "healthy"), beat
            _, agent = http("GET", f"{gw.url}/v1/agents/beating-1")
            seen.append(agent["status"])
            time.sleep(interval / 4)
        assert seen and set(seen) == {"healthy"}, seen
        # and they were what kept it so: without them it leaves healthy within an interval or so
        wait_until(
            lambda: http("GET", f"{gw.url}/v1/agents/beating-1")[1]["status"] != "healthy", 5
        )
        assert metric(gw, "agent_reach_nats_api_requests_total", op="heartbeat") == len(seen)


# --- token mode ------------------------------------------------------------------------------


POLICY = """\
[[reach]]
senders = ["agent://caller-*"]
intents = ["tok.*"]

[[claim]]
endpoints = ["agent://tok-*"]
intents = ["tok.*"]
"""


def _tokens(keys: Path) -> TokenService:
    ring = KeyRing(keys)
    ring.load()
    return TokenService(ring)


def test_token_mode_reads_the_authorization_header(bus: Bus, tmp_path: Path) -> None:
    keys, policy = tmp_path / "keys", tmp_path / "policy.toml"
    generate_key(keys)
    policy.write_text(POLICY)
    issuer = _tokens(keys)
    enroll = issuer.issue(
        Kind.ENROLL, "enroll", 600, endpoints=["agent://tok-*"], intents=["tok.*"]
    )[0]
    client = issuer.issue(Kind.CLIENT, "agent://caller-1", 600)[0]
    prefix = new_prefix()
    subject = unique("tok")
    auth = ["--auth", "tokens", "--keys", str(keys), "--policy", str(policy)]
    with gateway(*auth, "--nats", NATS_URL, "--nats-prefix", prefix) as gw:
        agent = start_bus_echo(NATS_URL, subject)
        try:
            body = {
                "endpoint_id": "agent://tok-1",
                "capabilities": ["tok.echo"],
                "endpoint_url": f"nats:{subject}",
            }
            register = f"{prefix}.v1.register"
            refusals: list[tuple[dict[str, str] | None, str]] = [
                (None, ""),
                ({"Authorization": "Bearer not-a-jwt"}, "not-a-jwt"),
                ({"Authorization": f"Bearer {enroll}x"}, f"{enroll}x"),
                ({"Authorization": enroll}, enroll),  # no "Bearer "
            ]
            for headers, token in refusals:
                over_nats = bus.request(register, body, headers)
                check_reach_status(over_nats)
                http_headers = {"Authorization": headers["Authorization"]} if headers else None
                status, over_http = http(
                    "POST", f"{gw.url}/v1/register", body, headers=http_headers
                )
                assert (over_nats.status, status) == (401, 401), (token, over_nats)
                assert over_nats.body == over_http, token
                assert (over_http["ok"], over_http["error"]) == (False, "unauthorized")
                assert isinstance(over_http["detail"], str) and over_http["detail"]
            assert http("GET", f"{gw.url}/v1/agents", token=client)[1]["agents"] == []

            # a client token cannot register; an enrollment token can (header name in any case)
            refused = bus.request(register, body, {"Authorization": f"Bearer {client}"})
            assert (refused.status, refused.body["error"]) == (403, "forbidden")
            done = bus.request(register, body, {"authorization": f"Bearer {enroll}"})
            assert done.status == 200, done
            endpoint_token = done.body["token"]
            beat = bus.request(
                f"{prefix}.v1.heartbeat",
                {"endpoint_id": "agent://tok-1"},
                {"Authorization": f"Bearer {endpoint_token}"},
            )
            assert (beat.status, beat.body["status"]) == (200, "healthy"), beat
            unsigned = bus.request(f"{prefix}.v1.heartbeat", {"endpoint_id": "agent://tok-1"})
            assert unsigned.status == 401

            send = f"{prefix}.v1.send"
            work = {"intent": "tok.echo", "payload": {"n": 1}}
            assert bus.request(send, work).status == 401
            assert bus.request(send, work, {"Authorization": f"Bearer {enroll}"}).status == 403
            sent = bus.request(send, work, {"Authorization": f"Bearer {client}"})
            assert sent.status == 200, sent
            assert sent.body["result"]["echo"] == {"n": 1}
            assert sent.body["endpoint_id"] == "agent://tok-1"
            assert agent.stop()["handled"] == 1  # the refused sends reached nobody
        finally:
            agent.stop()
        assert metric(gw, "agent_reach_nats_api_requests_total", op="send", status="401") == 1


# --- two gateways, one queue group ------------------------------------------------------------


def _shared(prefix: str, registry_prefix: str) -> list[str]:
    return [
        "--registry",
        REDIS_URL,
        "--registry-prefix",
        registry_prefix,
        "--nats",
        NATS_URL,
        "--nats-prefix",
        prefix,
        "--heartbeat-interval",
        "30",
    ]


def _answered(gw: Proc) -> float:
    return metric(gw, "agent_reach_nats_api_requests_total", op="send", status="200")


def test_a_memory_registry_gateway_refuses_a_prefix_another_gateway_serves() -> None:
    """Gateways of one prefix share its requests, so each with a registry of its own would
    know a part of the agents (a review: split heartbeats, agents flapping). A gateway on
    memory:// refuses to start beside another (exit 2, saying why); on another prefix it
    starts."""
    prefix = new_prefix()
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix]
    serve = [sys.executable, "-m", "agent_reach", "serve", "--port", "0"]
    with gateway(*flags):
        second = subprocess.run([*serve, *flags], capture_output=True, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        assert b"another gateway already serves " + prefix.encode() in second.stderr
        assert b"--registry redis://" in second.stderr
        with gateway("--nats", NATS_URL, "--nats-prefix", new_prefix()) as other:
            assert http("GET", f"{other.url}/healthz")[0] == 200


def test_two_gateways_serve_the_api_as_one_queue_group(bus: Bus) -> None:
    prefix, registry_prefix = new_prefix(), f"test-{secrets.token_hex(6)}"
    subject = unique("group")
    send = f"{prefix}.v1.send"
    try:
        with (
            gateway(*_shared(prefix, registry_prefix)) as one,
            gateway(*_shared(prefix, registry_prefix)) as two,
        ):
            agent = start_bus_echo(
                NATS_URL,
                subject,
                "--register-nats",
                prefix,
                "--id",
                "agent://group-echo-1",
                "--intents",
                "group.echo",
            )
            try:
                for gw in (one, two):  # registered on one of them, seen by both (shared Redis)
                    wait_until(
                        lambda gw=gw: len(http("GET", f"{gw.url}/v1/agents")[1]["agents"]) == 1, 10
                    )

                async def burst(n: int) -> list[Answer]:
                    work = [{"intent": "group.echo", "payload": {"i": i}} for i in range(n)]
                    return list(await asyncio.gather(*(ask(bus.nc, send, w) for w in work)))

                answers = bus.run(burst(60))
                assert [a.status for a in answers] == [200] * 60, answers
                assert [a.body["result"]["echo"] for a in answers] == [{"i": i} for i in range(60)]
                shares = (_answered(one), _answered(two))
                assert sum(shares) == 60 and min(shares) > 0, shares  # both took a share

                # a steady stream while `one` stops: it leaves the group before it stops
                stop = threading.Event()
                outcomes: list[tuple[float, int | str]] = []

                async def stream() -> None:
                    i = 0
                    while not stop.is_set() and i < 5000:
                        i += 1
                        try:
                            answer = await ask(bus.nc, send, {"intent": "group.echo"}, wait_s=3)
                            outcomes.append((time.monotonic(), answer.status))
                        except nats_errors.Error as exc:
                            outcomes.append((time.monotonic(), type(exc).__name__))

                async def streams() -> None:
                    await asyncio.gather(*(stream() for _ in range(8)))

                with ThreadPoolExecutor(1) as pool:
                    running = pool.submit(bus.run, streams())
                    wait_until(lambda: len(outcomes) >= 40, 10)
                    stopped_at = time.monotonic()
                    one.popen.send_signal(signal.SIGTERM)
                    assert one.popen.wait(10) == 0
                    gone_at = time.monotonic()
                    wait_until(lambda: sum(1 for t, _ in outcomes if t > gone_at) >= 40, 15)
                    stop.set()
                    running.result(20)
                during = [s for t, s in outcomes if stopped_at <= t <= gone_at]
                print(f"\nstream: {len(outcomes)} answers, {len(during)} while one stopped")
                lost = [s for _, s in outcomes if s != 200]
                assert not lost, lost  # none dropped by the one leaving, none after it left

                # and what comes now is all the other's
                before = _answered(two)
                answers = bus.run(burst(30))
                assert [a.status for a in answers] == [200] * 30, answers
                assert _answered(two) - before == 30
            finally:
                agent.stop()
    finally:
        drop_prefix(registry_prefix)


# --- fuzz: bodies and headers to every subject -------------------------------------------------


VALID: dict[str, dict[str, Any]] = {
    "register": {
        "endpoint_id": "agent://fuzz-01",
        "capabilities": ["fuzz.echo"],
        "endpoint_url": "http://127.0.0.1:9/reach",
        "description": "x",
    },
    "heartbeat": {"endpoint_id": "agent://fuzz-base-0"},
    "deregister": {"endpoint_id": "agent://fuzz-nobody"},
    "send": {
        "intent": "fuzz.base",
        "msg_id": "m1",
        "trace_id": "t1",
        "sender": "agent://fuzz-caller",
        "recipient_hint": None,
        "payload": {},
        "priority": "normal",
        "timeout_ms": 50,
    },
}
HEADER_NAMES = st.sampled_from(
    [
        "Authorization",
        "authorization",
        "traceparent",
        "X-Reach-Attempt",
        "X-Reach-Msg-Id",
        "Reach-Status",
        "Status",
        "Content-Type",
        "Content-Encoding",
        "Retry-After",
    ]
) | st.from_regex(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,20}", fullmatch=True)
HEADER_VALUES = st.text(max_size=60) | st.sampled_from(
    ["Bearer ", "Bearer x.y.z", "503", "404", "gzip", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"]
)


@st.composite
def bodies(draw: st.DrawFn, op: str) -> bytes:
    body: dict[str, Any] = dict(VALID[op])
    how = draw(st.sampled_from(["valid", "replace", "drop", "add", "whole", "bytes"]))
    if how == "replace":
        body[draw(st.sampled_from(sorted(body)))] = draw(json_values)
    elif how == "drop":
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "add":
        body[draw(st.text(min_size=1, max_size=12))] = draw(json_values)
    elif how == "whole":
        return json.dumps(draw(json_values)).encode()
    elif how == "bytes":
        return draw(st.binary(max_size=300))
    return json.dumps(body).encode()


@dataclass
class Fuzzed:
    gw: Proc
    bus: Bus
    prefix: str


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Fuzzed]:
    prefix = new_prefix()
    flags = ["--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "600"]
    with gateway(*flags, "--register-rate-limit", "0") as gw:
        for i in range(3):  # a stable population that every refusal must leave untouched
            body = {
                "endpoint_id": f"agent://fuzz-base-{i}",
                "capabilities": ["fuzz.base"],
                "endpoint_url": "http://127.0.0.1:9/reach",
            }
            assert http("POST", f"{gw.url}/v1/register", body)[0] == 200
        caller = Bus()
        try:
            yield Fuzzed(gw, caller, prefix)
        finally:
            caller.close()


def snapshot(gw: Proc) -> list[tuple[Any, ...]]:
    status, body = http("GET", f"{gw.url}/v1/agents")
    assert status == 200, body
    return sorted(
        (a["endpoint_id"], tuple(a["capabilities"]), a["endpoint_url"], a["description"])
        for a in body["agents"]
    )


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_requests_get_contract_answers_and_refusals_change_nothing(
    fuzzed: Fuzzed, op: str, data: st.DataObject
) -> None:
    raw = data.draw(bodies(op), label="body")
    headers = data.draw(st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=4), label="headers")
    before = snapshot(fuzzed.gw)
    answer = fuzzed.bus.request(f"{fuzzed.prefix}.v1.{op}", raw, headers or None, wait_s=10)
    check_reach_status(answer)
    body = answer.body
    assert isinstance(body, dict), body
    assert 200 <= answer.status <= 599
    if answer.status == 200:
        assert body["ok"] is True, body
    else:
        assert body["ok"] is False, body
        assert isinstance(body["error"], str) and isinstance(body["detail"], str), body
        if answer.status >= 500:
            assert body["error"] in ROUTING_5XX.get(answer.status, ()), (answer.status, body)
            assert op == "send", body
        if answer.status in (400, 422):
            assert body["error"] == "invalid_request", body
        if op == "send":
            assert {"msg_id", "trace_id", "attempts"} <= set(body), body
        assert snapshot(fuzzed.gw) == before, (raw, headers, body)  # a refusal changes nothing
    if op == "register" and answer.status == 200:
        # what fuzzing registered goes again (nothing may be delivered off this host); the
        # population is then as it was (no fuzzed id is one of its own)
        assert body["endpoint_id"] not in {row[0] for row in before}, body
        http("POST", f"{fuzzed.gw.url}/v1/deregister", {"endpoint_id": body["endpoint_id"]})
        assert snapshot(fuzzed.gw) == before
    if op == "deregister" and answer.status == 200:
        assert body == {"ok": True}
        assert snapshot(fuzzed.gw) == before  # no fuzzed id is one of the population's


# --- fuzz: header blocks written in the NATS protocol itself --------------------------------


header_lines = st.lists(
    st.binary(max_size=40)
    | st.sampled_from(
        [
            b"Authorization: Bearer a",
            b"Authorization: Bearer b",
            b"authorization:",
            b"Authorization \xff: x",
            b"traceparent: \xff\xfe",
            b"X-Reach-Attempt: 1",
            b"no colon here",
            b": empty name",
            b"\xd8",
        ]
    ),
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(OPS),
    status_line=st.sampled_from([b"NATS/1.0", b"NATS/1.0 503", b"NATS/1.0 404 No Messages"]),
    lines=header_lines,
)
def test_raw_header_blocks_get_contract_answers(
    fuzzed: Fuzzed, op: str, status_line: bytes, lines: list[bytes]
) -> None:
    """Header blocks nats-py would not write (duplicate names, bytes that are not UTF-8, an
    inline status, lines without a colon): each request gets the contract's answer. (With an
    inline status, nats-py reads the lines after it as its description, and cannot read one
    that is not UTF-8: that case is the next test's.)"""
    if status_line != b"NATS/1.0":
        lines = [line for line in lines if _utf8(line)]
    block = b"\r\n".join([status_line, *lines]) + b"\r\n\r\n"
    before = snapshot(fuzzed.gw)
    subject = f"{fuzzed.prefix}.v1.{op}"
    answer = raw_request(NATS_URL, subject, block, json.dumps(VALID[op]).encode())
    if answer is None:
        return  # the server refused the block: nothing reached the gateway
    check_reach_status(answer)
    assert isinstance(answer.body, dict), answer
    if answer.status >= 500:
        assert answer.body["error"] in ROUTING_5XX.get(answer.status, ()), answer
    if answer.status >= 400:
        assert answer.body["ok"] is False and isinstance(answer.body["detail"], str)
        if answer.status < 500:
            assert snapshot(fuzzed.gw) == before
    if op == "register" and answer.status == 200:
        http("POST", f"{fuzzed.gw.url}/v1/deregister", {"endpoint_id": "agent://fuzz-01"})


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("reply", "block"),
    [
        (b"_INBOX.\xff\xfe", b"NATS/1.0\r\n\r\n"),
        (b"_INBOX.x", b"NATS/1.0 503 \xd8\r\n\r\n"),
    ],
    ids=["reply-subject-not-utf8", "status-description-not-utf8"],
)
def test_a_message_nats_py_cannot_read_leaves_the_link_serving(
    bus: Bus, reply: bytes, block: bytes
) -> None:
    """Any client of the NATS system may publish such a message to the gateway's subjects.
    nats-py 2.16 raises in its read loop on it, and the loop ends: the link went on saying it
    was connected and served nothing until its pings failed (``ping_interval_s`` 20 s, two
    outstanding). Now the message is dropped, and the next request is served."""
    prefix = new_prefix()
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix) as gw:
        sock, reader = raw_connection(NATS_URL)
        with sock, reader:
            body = json.dumps(VALID["heartbeat"]).encode()
            sock.sendall(hpub(f"{prefix}.v1.heartbeat", reply, block, body) + b"PING\r\n")
            assert reader.readline() == b"PONG\r\n"  # the server took it, and routed it
        answer = bus.request(f"{prefix}.v1.heartbeat", VALID["heartbeat"], wait_s=3)
        assert (answer.status, answer.body["error"]) == (404, "endpoint_not_registered")
        events = [line.get("event") for line in gw.log_lines()]
        assert "nats.unreadable_message" in events, events
        assert health(gw)["nats"]["reconnects"] == 0


def test_the_fuzzed_gateway_is_still_whole(fuzzed: Fuzzed) -> None:
    """After the fuzz tests above (pytest runs a module's tests in file order): the link was
    never lost, no request was dropped, and the population is whole."""
    state = health(fuzzed.gw)["nats"]
    assert (state["connected"], state["reconnects"], state["slow_consumers"]) == (True, 0, 0)
    assert len(snapshot(fuzzed.gw)) == 3
    logged = [line.get("event") for line in fuzzed.gw.log_lines()]
    assert "nats.unhandled" not in logged and "nats.responder_failed" not in logged


# --- NATS down, HTTP up ------------------------------------------------------------------------


def test_a_gateway_without_its_nats_link_serves_http_and_says_so(
    private_nats: PrivateNats,
) -> None:
    prefix = new_prefix()
    with gateway("--nats", private_nats.url, "--nats-prefix", prefix) as gw:
        state = health(gw)["nats"]
        assert (state["connected"], state["server"]) == (True, private_nats.url)
        assert metric(gw, "agent_reach_nats_connected") == 1

        private_nats.stop()
        wait_until(lambda: health(gw)["nats"]["connected"] is False, 10)
        state = health(gw)["nats"]
        assert state["server"] is None and state["last_error"], state
        assert metric(gw, "agent_reach_nats_connected") == 0
        # every HTTP endpoint still answers, a NATS endpoint still registers (it is the
        # gateway's link that is down, not the agent), and a send to it fails cleanly
        body = {
            "endpoint_id": "agent://down-1",
            "capabilities": ["down.echo"],
            "endpoint_url": f"nats:{unique('down')}",
        }
        assert http("POST", f"{gw.url}/v1/register", body)[0] == 200
        assert http("POST", f"{gw.url}/v1/heartbeat", {"endpoint_id": "agent://down-1"})[0] == 200
        status, answer = http(
            "POST", f"{gw.url}/v1/send", {"intent": "down.echo", "timeout_ms": 1500}
        )
        assert (status, answer["error"]) == (502, "all_attempts_failed"), answer
        assert [a["outcome"] for a in answer["attempts"]] == ["connect_error"]
        status, agent = http("GET", f"{gw.url}/v1/agents/down-1")
        assert status == 200 and agent["status"] == "healthy", agent  # not ejected for it
        assert http("GET", f"{gw.url}/v1/agents")[0] == 200

        private_nats.start()
        wait_until(lambda: health(gw)["nats"]["connected"] is True, 10)
        assert health(gw)["nats"]["reconnects"] >= 1
        assert metric(gw, "agent_reach_nats_connected") == 1
        caller = Bus(private_nats.url)
        try:  # and the API over NATS is served again on the same link
            beat = caller.request(f"{prefix}.v1.heartbeat", {"endpoint_id": "agent://down-1"})
            assert beat.status == 200, beat
        finally:
            caller.close()


def test_no_answer_is_published_to_a_reserved_subject_named_as_the_inbox() -> None:
    """A caller names ``$...`` (the server's and JetStream's API subjects: ``$JS.API.*``,
    ``$SYS.*``) as its reply subject: the gateway would publish there with its own
    permissions. It answers an ordinary inbox, and drops the other, logged."""
    prefix = new_prefix()
    tag = secrets.token_hex(4)
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix) as gw:
        sock, reader = raw_connection(NATS_URL)
        with sock, reader:
            sock.sendall(f"SUB $X.{tag} 1\r\nSUB _INBOX.{tag} 2\r\n".encode())
            body = json.dumps(VALID["heartbeat"]).encode()
            block = b"NATS/1.0\r\n\r\n"
            for reply in (f"$X.{tag}", f"_INBOX.{tag}"):  # the reserved one first
                sock.sendall(hpub(f"{prefix}.v1.heartbeat", reply.encode(), block, body))
            sock.sendall(b"PING\r\n")
            sock.settimeout(5)
            line = reader.readline()
            # the PONG may come after the answer: the gateway answers on a connection of its
            # own, which the server may serve before it gets to this one's PING (seen in CI)
            while line.startswith((b"PING", b"PONG", b"+OK")):
                line = reader.readline()
            # the first answer to come is the ordinary inbox's: the reserved one got none
            assert line.startswith(f"HMSG _INBOX.{tag} 2".encode()), line
        events = [entry.get("event") for entry in gw.log_lines()]
        assert "nats.reply_refused" in events, events
