"""Token mode, tried for real: every forbidden move gets its 401/403/429 and changes nothing.

One gateway in token mode (real process, real key directory and policy file) with real agent
processes enrolled; each test makes forbidden moves and checks the answer's code, that nothing
was registered, changed or delivered, and that the denial left an audit line.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
import redis

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService
from agent_reach.registry.redis.scripts import UPSERT
from agent_reach.registry.redis.store import key_prefix
from tests.support import (
    REDIS_URL,
    Proc,
    drop_prefix,
    gateway,
    http,
    http_full,
    secured_setup,
    start_agent,
    wait_until,
)
from tests.support import service_of as _service

POLICY = """\
# who may reach what
[[reach]]
senders = ["agent://caller-*"]
intents = ["weather.*"]

[[reach]]
senders = ["agent://caller-*"]
intents = ["note.create"]
endpoints = ["agent://note-a"]

# which ids may claim which intents
[[claim]]
endpoints = ["agent://weather-*"]
intents = ["weather.*"]

[[claim]]
endpoints = ["agent://note-*"]
intents = ["note.*"]
"""
NOWHERE = "http://127.0.0.1:9/reach"  # the discard port: nothing is delivered there


@dataclass
class Net:
    gw: str
    proc: Proc
    keys: Path
    policy: Path
    operator: str
    agents: dict[str, Proc]

    def issue(self, kind: str, **body: Any) -> str:
        status, answer = http(
            "POST", f"{self.gw}/v1/tokens", {"kind": kind, **body}, token=self.operator
        )
        assert status == 200, answer
        return str(answer["token"])

    def enroll(self, endpoints: str, intents: str) -> str:
        return self.issue("enroll", endpoints=[endpoints], intents=[intents])

    def client(self, subject: str) -> str:
        return self.issue("client", subject=subject)

    def registered(self) -> dict[str, dict[str, Any]]:
        status, answer = http("GET", f"{self.gw}/v1/agents", token=self.operator)
        assert status == 200, answer
        return {a["endpoint_id"]: a for a in answer["agents"]}

    def audit(self, event: str = "audit.denied") -> list[dict[str, Any]]:
        return [line for line in self.proc.log_lines() if line.get("event") == event]

    def delivered(self, msg_id: str) -> bool:
        """Whether any agent process was handed ``msg_id``."""
        return any(
            line.get("event") == "agent.request" and line.get("msg_id") == msg_id
            for agent in self.agents.values()
            for line in agent.log_lines()
        )


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    s = secured_setup(tmp_path_factory.mktemp("secured"), POLICY)
    flags = [*s.flags, "--rate-limit", "50", "--rate-burst", "50", "--reload-interval", "0.2"]
    with gateway(*flags) as proc:
        net = Net(proc.url, proc, s.keys, s.policy, s.operator, {})
        weather = net.enroll("agent://weather-*", "weather.*")
        notes = net.enroll("agent://note-*", "note.*")
        net.agents = {
            "weather-1": start_agent(
                proc.url, "agent://weather-1", intents="weather.query", token=weather
            ),
            "note-a": start_agent(proc.url, "agent://note-a", intents="note.create", token=notes),
            "note-b": start_agent(proc.url, "agent://note-b", intents="note.create", token=notes),
        }
        try:
            wait_until(lambda: len(net.registered()) == 3, 10)
            yield net
        finally:
            for agent in net.agents.values():
                agent.stop()


def _tampered(token: str) -> str:
    """``token`` with its claims changed (intents widened) and the old signature kept."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["intents"] = ["*"]
    claims["endpoints"] = ["*"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def _register_body(endpoint_id: str, intents: list[str], url: str = NOWHERE) -> dict[str, Any]:
    return {"endpoint_id": endpoint_id, "capabilities": intents, "endpoint_url": url}


def _register(
    gw: str, token: str | None, endpoint_id: str, intents: list[str], url: str = NOWHERE
) -> tuple[int, Any]:
    """``POST /v1/register`` of ``gw`` with ``token``: (status, answer)."""
    return http("POST", f"{gw}/v1/register", _register_body(endpoint_id, intents, url), token=token)


# --- the open parts ------------------------------------------------------------------------


def test_health_metrics_and_keys_need_no_token(net: Net) -> None:
    assert http("GET", f"{net.gw}/healthz")[0] == 200
    assert http("GET", f"{net.gw}/metrics")[0] == 200
    status, jwks = http("GET", f"{net.gw}/v1/keys")
    assert status == 200
    ring = KeyRing(net.keys)
    ring.load()
    assert [k["kid"] for k in jwks["keys"]] == list(ring.keys)
    assert all(k["kty"] == "OKP" and k["crv"] == "Ed25519" and "d" not in k for k in jwks["keys"])


def test_an_endpoint_token_gets_its_own_delivery_keys_and_no_one_elses(net: Net) -> None:
    """``GET /v1/keys`` with an endpoint token adds that registration's delivery keys (one per
    gateway key, HS256); a client token, or none, gets the public keys only; a bad token is
    refused, not answered as if it were none."""
    status, answer = _register(
        net.gw, net.enroll("agent://weather-*", "weather.*"), "agent://weather-k", ["weather.query"]
    )
    assert status == 200, answer
    token = answer["token"]
    try:
        status, jwks, headers = http_full("GET", f"{net.gw}/v1/keys", token=token)
        assert status == 200, jwks
        assert {k.lower(): v for k, v in headers.items()}.get("cache-control") == "no-store"
        secret = [k for k in jwks["keys"] if k["kty"] == "oct"]
        ring = KeyRing(net.keys)
        ring.load()
        owner = jwt.decode(token, options={"verify_signature": False})["gen"]
        expected = [ring.signing_key().delivery_jwk("agent://weather-k", owner)]
        assert secret == expected
        public = http("GET", f"{net.gw}/v1/keys")[1]
        assert http("GET", f"{net.gw}/v1/keys", token=net.client("agent://caller-1"))[1] == public
        assert all(k["kty"] == "OKP" for k in public["keys"])
        status, refused = http("GET", f"{net.gw}/v1/keys", token=token[:-4] + "AAAA")
        assert status == 401 and refused["error"] == "unauthorized", refused
    finally:  # the other tests' weather.query must not find it
        body = {"endpoint_id": "agent://weather-k"}
        assert http("POST", f"{net.gw}/v1/deregister", body, token=token)[0] == 200


@pytest.mark.parametrize(
    "path", ["/v1/agents", "/v1/agents/weather-1", "/v1/traces", "/v1/diagnostics", "/v1/inflight"]
)
def test_reading_needs_a_token(net: Net, path: str) -> None:
    status, answer = http("GET", f"{net.gw}{path}")
    assert (status, answer["error"]) == (401, "unauthorized")


def test_operator_only_reads_refuse_other_tokens(net: Net) -> None:
    client = net.client("agent://caller-reader")
    for path in ("/v1/traces", "/v1/diagnostics", "/v1/inflight"):
        status, answer = http("GET", f"{net.gw}{path}", token=client)
        assert (status, answer["error"]) == (403, "forbidden"), path
    assert http("GET", f"{net.gw}/v1/agents", token=client)[0] == 200
    assert http("GET", f"{net.gw}/v1/diagnostics", token=net.operator)[0] == 200


# --- registration ----------------------------------------------------------------------------


def test_register_refusals_change_nothing(net: Net, tmp_path: Path) -> None:
    weather = net.enroll("agent://weather-*", "weather.*")
    anything = net.enroll("agent://*", "*")
    generate_key(tmp_path / "other")
    stranger, _ = _service(tmp_path / "other").issue(
        Kind.ENROLL, "enroll", 600, endpoints=["agent://*"], intents=["*"]
    )
    expired, _ = _service(net.keys, wall=lambda: time.time() - 7200).issue(
        Kind.ENROLL, "enroll", 60, endpoints=["agent://weather-*"], intents=["weather.*"]
    )
    narrow = net.enroll("agent://weather-narrow", "weather.query")
    cases: list[tuple[str | None, dict[str, Any], int, str]] = [
        (None, _register_body("agent://weather-x", ["weather.query"]), 401, "bearer token"),
        ("not-a-jwt", _register_body("agent://weather-x", ["weather.query"]), 401, "malformed"),
        (stranger, _register_body("agent://weather-x", ["weather.query"]), 401, "unknown key"),
        (expired, _register_body("agent://weather-x", ["weather.query"]), 401, "expired"),
        (
            _tampered(narrow),
            _register_body("agent://weather-x", ["weather.query"]),
            401,
            "signature",
        ),
        (
            net.client("agent://weather-x"),
            _register_body("agent://weather-x", ["weather.query"]),
            403,
            "client token cannot register",
        ),
        (weather, _register_body("agent://note-x", ["weather.query"]), 403, "token does not"),
        (weather, _register_body("agent://weather-x", ["note.create"]), 403, "token does not"),
        (
            weather,
            _register_body("agent://weather-x", ["weather.query", "note.create"]),
            403,
            "note.create",
        ),
        (anything, _register_body("agent://other-1", ["other.thing"]), 403, "policy"),
        (
            weather,
            _register_body("agent://weather-x", ["weather.query"], "http://169.254.169.254/x"),
            403,
            "169.254.169.254",
        ),
        (
            weather,
            _register_body(
                "agent://weather-x", ["weather.query"], "http://[::ffff:169.254.169.254]/x"
            ),
            403,
            "169.254",
        ),
        (
            weather,
            _register_body(
                "agent://weather-x", ["weather.query"], "http://metadata.google.internal/"
            ),
            403,
            "metadata",
        ),
    ]
    before = net.registered()
    denials = len(net.audit())
    for token, body, status, why in cases:
        got, answer = http("POST", f"{net.gw}/v1/register", body, token=token)
        assert got == status, (body, answer)
        assert answer["error"] == ("unauthorized" if status == 401 else "forbidden")
        assert why in answer["detail"], answer
    assert net.registered().keys() == before.keys()
    assert len(net.audit()) >= denials + len(cases)  # each denial is an audit line


def test_an_endpoint_token_binds_its_id(net: Net) -> None:
    weather = net.enroll("agent://weather-*", "weather.*")
    url = f"{net.gw}/v1"
    status, x = _register(net.gw, weather, "agent://weather-bx", ["weather.query"])
    assert status == 200 and x["token"], x
    status, y = _register(net.gw, weather, "agent://weather-by", ["weather.query"])
    assert status == 200, y
    y_before = net.registered()["agent://weather-by"]
    other = {"endpoint_id": "agent://weather-by"}
    moves: list[tuple[str, str | None, int, str]] = [
        ("heartbeat", None, 401, "bearer token"),
        ("heartbeat", x["token"], 403, "not agent://weather-by"),
        ("heartbeat", weather, 403, "enroll token cannot heartbeat"),
        ("heartbeat", net.operator, 403, "operator token cannot heartbeat"),
        ("deregister", x["token"], 403, "not agent://weather-by"),
        ("deregister", net.client("agent://weather-by"), 403, "client token cannot deregister"),
    ]
    for action, token, code, why in moves:
        status, answer = http("POST", f"{url}/{action}", other, token=token)
        assert status == code, (action, answer)
        assert why in answer["detail"], answer
    # the live id cannot be taken over by a new enrollment, nor moved by another endpoint token
    status, answer = _register(
        net.gw, weather, "agent://weather-by", ["weather.query"], "http://127.0.0.1:8/evil"
    )
    assert (status, answer.get("reason")) == (403, "endpoint_held"), answer
    status, answer = _register(
        net.gw, x["token"], "agent://weather-by", ["weather.query"], "http://127.0.0.1:8/evil"
    )
    assert status == 403, answer
    after = net.registered()["agent://weather-by"]
    assert after["endpoint_url"] == NOWHERE
    assert after["last_seen_at"] == y_before["last_seen_at"]  # not even a heartbeat counted
    # its own token works; an operator may deregister anyone (an audited admin action)
    status, answer = http("POST", f"{url}/heartbeat", other, token=y["token"])
    assert status == 200, answer
    admin_before = len(net.audit("audit.admin"))
    assert http("POST", f"{url}/deregister", other, token=net.operator)[0] == 200
    admin = net.audit("audit.admin")[admin_before:]
    assert any(a["action"] == "deregister" and a["target"] == "agent://weather-by" for a in admin)
    # re-enrolled, the id belongs to the new registration: y's old token no longer touches it
    status, fresh = _register(net.gw, weather, "agent://weather-by", ["weather.query"])
    assert status == 200, fresh
    status, answer = http("POST", f"{url}/heartbeat", other, token=y["token"])
    assert status == 403 and "earlier registration" in answer["detail"], answer
    for endpoint_id, token in (
        ("agent://weather-bx", x["token"]),
        ("agent://weather-by", fresh["token"]),
    ):
        assert (
            http("POST", f"{url}/deregister", {"endpoint_id": endpoint_id}, token=token)[0] == 200
        )


def test_a_stale_endpoint_token_spares_a_registration_made_elsewhere_on_redis(
    tmp_path: Path,
) -> None:
    """On Redis, x is registered again (another registration, another gateway) and the notice
    has not reached this gateway (here it never does): the earlier registration's endpoint
    token is refused, 403, where the record is written, and the new registration stands, in
    Redis and in this gateway's listing. Before, the view's check passed and x was removed."""
    s = secured_setup(tmp_path, POLICY)
    prefix = f"test-{secrets.token_hex(6)}"
    endpoint_id, elsewhere = "agent://weather-rz", "http://127.0.0.1:9/elsewhere"
    try:
        with gateway(*s.flags, "--registry", REDIS_URL, "--registry-prefix", prefix) as proc:
            net = Net(proc.url, proc, s.keys, s.policy, s.operator, {})
            enroll = net.enroll("agent://weather-*", "weather.*")
            status, first = _register(proc.url, enroll, endpoint_id, ["weather.query"])
            assert status == 200, first
            p = key_prefix(prefix)
            keys = [f"{p}:ep:{endpoint_id}", f"{p}:seen", f"{p}:ver", f"{p}:elsewhere"]
            keys += [f"{p}:seq", f"{p}:gone:{endpoint_id}"]
            args = [endpoint_id, '["weather.query"]', elsewhere, "", "", "", "gen-x", "", "", ""]
            with redis.Redis.from_url(REDIS_URL, decode_responses=True) as r:
                r.eval(UPSERT, len(keys), *keys, *args)  # on a channel the gateway does not hear
                status, answer = http(
                    "POST",
                    f"{proc.url}/v1/deregister",
                    {"endpoint_id": endpoint_id},
                    token=first["token"],
                )
                assert status == 403 and "earlier registration" in answer["detail"], answer
                assert r.hget(keys[0], "owner") == "gen-x"
                assert r.zscore(keys[1], endpoint_id) is not None
            assert net.registered()[endpoint_id]["endpoint_url"] == elsewhere
            assert any(a["target"] == endpoint_id for a in net.audit())
    finally:
        drop_prefix(prefix)


# --- sending -------------------------------------------------------------------------------


def _send(net: Net, token: str | None, **body: Any) -> tuple[int, dict[str, Any]]:
    body.setdefault("timeout_ms", 3000)
    return http("POST", f"{net.gw}/v1/send", body, token=token)


def test_send_refusals_deliver_nothing(net: Net) -> None:
    caller = net.client("agent://caller-1")
    enroll = net.enroll("agent://weather-*", "weather.*")
    cases: list[tuple[str | None, dict[str, Any], int, str]] = [
        (None, {"intent": "weather.query"}, 401, "bearer token"),
        (_tampered(caller), {"intent": "weather.query"}, 401, "signature"),
        (caller, {"intent": "weather.query", "sender": "agent://caller-2"}, 403, "not the token"),
        # words only: the sender is judged before anything is matched (or traced)
        (
            caller,
            {"intent_text": "weather in Chengdu", "sender": "agent://caller-2"},
            403,
            "not the token",
        ),
        (caller, {"intent": "note.delete"}, 403, "note.delete"),
        (caller, {"intent": "note.create", "recipient_hint": "agent://note-b"}, 403, "note-b"),
        (enroll, {"intent": "weather.query"}, 403, "enroll token cannot send"),
        (net.operator, {"intent": "weather.query"}, 403, "operator token cannot send"),
        (net.client("agent://stranger-1"), {"intent": "weather.query"}, 403, "reach"),
    ]
    for n, (token, body, code, why) in enumerate(cases):
        msg_id = f"msg_forbidden_{n}_{time.monotonic_ns()}"
        status, answer = _send(net, token, msg_id=msg_id, **body)
        assert status == code, (body, answer)
        assert why in answer["detail"], answer
        assert answer["msg_id"] == msg_id and answer["trace_id"] and answer["attempts"] == []
        denial = [a for a in net.audit() if a.get("trace_id") == answer["trace_id"]]
        assert denial and denial[0]["why"], f"no audit line for {answer}"
        assert not net.delivered(msg_id)


def test_allowed_sends_carry_the_token_sender_and_stay_within_the_policy(net: Net) -> None:
    caller = net.client("agent://caller-1")
    status, answer = _send(net, caller, intent="weather.query", payload={"city": "Chengdu"})
    assert status == 200, answer
    assert answer["result"]["sender"] == "agent://caller-1"  # taken from the token
    assert answer["result"]["verified"] is True  # the agent checked the gateway's signature
    # note.create may go only to note-a, although note-b declares it too and is healthy
    chosen = {_send(net, caller, intent="note.create")[1]["endpoint_id"] for _ in range(8)}
    assert chosen == {"agent://note-a"}
    status, route = http("GET", f"{net.gw}/v1/route?intent=note.create", token=caller)
    assert status == 200 and route["chosen"] == "agent://note-a"


def test_traces_are_read_by_their_sender_and_operators(net: Net) -> None:
    mine, theirs = net.client("agent://caller-7"), net.client("agent://caller-8")
    status, answer = _send(net, mine, intent="weather.query")
    assert status == 200, answer
    path = f"{net.gw}/v1/traces/{answer['trace_id']}"
    assert http("GET", path, token=mine)[0] == 200
    assert http("GET", path, token=theirs)[0] == 404
    assert http("GET", path, token=net.operator)[0] == 200
    reads = [a for a in net.audit("audit.admin") if a["action"] == "trace.read"]
    assert any(a["target"] == answer["trace_id"] for a in reads)


def test_a_shared_trace_id_shows_each_sender_its_own_requests_only(net: Net) -> None:
    """A review: who could read a trace was decided by the sender of its first request, so
    the first user of a trace id read every later request under it (another sender's words
    included) and the later senders could not read their own. Trace ids are the callers' to
    choose, and onward reaches share their caller's: each sender now reads its requests'
    events only, an operator all of them."""
    first, second = net.client("agent://caller-21"), net.client("agent://caller-22")
    shared = "trace_shared_21"
    for token in (first, second):
        status, answer = _send(net, token, intent="weather.query", trace_id=shared)
        assert status == 200, answer
    path = f"{net.gw}/v1/traces/{shared}"

    def senders(token: str) -> set[str]:
        status, trace = http("GET", path, token=token)
        assert status == 200, trace
        return {e["sender"] for e in trace["events"] if e["kind"] == "received"}

    assert senders(first) == {"agent://caller-21"}
    assert senders(second) == {"agent://caller-22"}
    assert senders(net.operator) == {"agent://caller-21", "agent://caller-22"}
    stranger = net.client("agent://caller-23")
    assert http("GET", path, token=stranger)[0] == 404


def test_rate_limit_per_sender(net: Net) -> None:
    burst = net.client("agent://caller-burst")
    started = time.monotonic()
    codes: list[int] = []
    retry_after = None
    for _ in range(120):
        status, answer, headers = http_full(
            "POST", f"{net.gw}/v1/send", {"intent": "weather.none", "fallback": False}, token=burst
        )
        codes.append(status)
        if status == 429:
            assert answer["error"] == "rate_limited" and answer["trace_id"]
            retry_after = headers.get("Retry-After")
            break
    elapsed = time.monotonic() - started
    assert 429 in codes, f"no 429 after {len(codes)} sends in {elapsed:.2f} s"
    assert retry_after is not None and int(retry_after) >= 1
    assert len(codes) - 1 <= 50 + 50 * elapsed + 1  # never more than the bucket allows
    # another sender is not held back by it
    other = net.client("agent://caller-other")
    assert _send(net, other, intent="weather.none", fallback=False)[0] == 404


# --- policy reload ---------------------------------------------------------------------------


def test_policy_reload_refuses_a_bad_file_and_keeps_the_old_one(net: Net) -> None:
    caller = net.client("agent://caller-9")

    def route_status(intent: str) -> int:
        return http("GET", f"{net.gw}/v1/route?intent={intent}", token=caller)[0]

    assert route_status("weather.query") == 200
    assert route_status("extra.thing") == 403
    try:
        net.policy.write_text(
            POLICY + '\n[[reach]]\nsenders = ["agent://caller-*"]\nintents = "extra.*"\n'
        )
        status, answer = http("POST", f"{net.gw}/v1/reload", token=net.operator)
        bad_line = len(POLICY.splitlines()) + 4  # the added rule's `intents = ...`
        assert status == 422 and answer["line"] == bad_line, answer
        assert "intents" in answer["detail"]
        assert route_status("weather.query") == 200  # the old policy is still in force
        assert route_status("extra.thing") == 403
        failed = [line for line in net.proc.log_lines() if line["event"] == "auth.reload_failed"]
        assert failed and failed[-1]["line"] == bad_line
        # a good file is picked up without a restart (polled) and without asking
        net.policy.write_text(
            POLICY + '\n[[reach]]\nsenders = ["agent://caller-*"]\nintents = ["extra.*"]\n'
        )
        wait_until(lambda: route_status("extra.thing") == 404, 10)  # now allowed: no agent
    finally:
        net.policy.write_text(POLICY)
        status, answer = http("POST", f"{net.gw}/v1/reload", token=net.operator)
        assert status == 200, answer
    assert route_status("extra.thing") == 403


# --- key rotation ----------------------------------------------------------------------------


def test_key_rotation_without_downtime(tmp_path: Path) -> None:
    s = secured_setup(tmp_path, POLICY)
    keys, old_operator = s.keys, s.operator
    (old_path,) = keys.glob("*.pem")
    with gateway(*s.flags) as proc:
        gw = proc.url
        old_client = http(
            "POST",
            f"{gw}/v1/tokens",
            {"kind": "client", "subject": "agent://caller-1"},
            token=old_operator,
        )[1]["token"]
        # a key added to be active in the future is published at once, not yet used to sign
        old_kid = http("GET", f"{gw}/v1/keys")[1]["keys"][0]["kid"]
        staged = generate_key(keys, activate_in_s=3600)
        answer = http("POST", f"{gw}/v1/reload", token=old_operator)[1]
        assert answer["keys"] == 2 and answer["signing_kid"] == old_kid, answer
        kids = [k["kid"] for k in http("GET", f"{gw}/v1/keys")[1]["keys"]]
        assert len(kids) == 2 and kids[0] == old_kid  # published; the signing key first
        staged.unlink()
        # a new key, active now: signs from the next reload on; the old one still verifies
        new_path = generate_key(keys)
        answer = http("POST", f"{gw}/v1/reload", token=old_operator)[1]
        ring = KeyRing(keys)
        ring.load()
        new_kid = next(k.kid for k in ring.keys.values() if k.path == str(new_path))
        assert answer["signing_kid"] == new_kid
        new_client = http(
            "POST",
            f"{gw}/v1/tokens",
            {"kind": "client", "subject": "agent://caller-1"},
            token=old_operator,
        )[1]["token"]
        header = json.loads(base64.urlsafe_b64decode(new_client.split(".")[0] + "=="))
        assert header["kid"] == new_kid
        assert http("GET", f"{gw}/v1/agents", token=old_client)[0] == 200
        # retiring the old key: what it signed stops working; what the new one signed works
        old_path.unlink()
        assert http("POST", f"{gw}/v1/reload", token=old_operator)[0] == 200
        status, answer = http("GET", f"{gw}/v1/agents", token=old_client)
        assert status == 401 and "unknown key" in answer["detail"]
        assert http("GET", f"{gw}/v1/agents", token=new_client)[0] == 200


# --- open mode ---------------------------------------------------------------------------------


def test_open_mode_warns_and_still_guards_endpoint_urls() -> None:
    with gateway() as proc:
        status, answer = http(
            "POST",
            f"{proc.url}/v1/register",
            _register_body("agent://meta-1", ["x.y"], "http://169.254.169.254/latest/meta-data"),
        )
        assert (status, answer["error"]) == (403, "forbidden")
        assert http("GET", f"{proc.url}/v1/agents")[1]["agents"] == []
        assert http("GET", f"{proc.url}/v1/keys")[1] == {"keys": []}
        assert any(line["event"] == "auth.open_mode" for line in proc.log_lines())


def test_open_mode_refuses_what_a_web_page_could_send() -> None:
    """A page in the operator's browser may POST across origins, or rebind a name of its own to
    127.0.0.1: with no credentials to check, Origin and Host are."""
    body = _register_body("agent://csrf-1", ["x.y"], "https://evil.example/steal")
    with gateway() as proc:
        authority = proc.url.removeprefix("http://")
        status, answer = http(
            "POST", f"{proc.url}/v1/register", body, headers={"Origin": "https://evil.example"}
        )
        assert (status, answer["error"]) == (403, "forbidden") and "cross-origin" in answer[
            "detail"
        ]
        status, answer = http("GET", f"{proc.url}/v1/agents", headers={"Host": "evil.example:80"})
        assert (status, answer["error"]) == (403, "forbidden") and "loopback" in answer["detail"]
        # a rebinding page's own request (its Origin matches its Host) teaches the gateway
        # nothing: the same Origin towards the loopback Host is still cross-origin
        rebound = {"Host": "evil.example:80", "Origin": "http://evil.example:80"}
        assert http("POST", f"{proc.url}/v1/register", body, headers=rebound)[0] == 403
        poisoned = {"Origin": "http://evil.example:80"}
        assert http("POST", f"{proc.url}/v1/register", body, headers=poisoned)[0] == 403
        assert http("GET", f"{proc.url}/v1/agents")[1]["agents"] == []
        # the gateway's own page (same origin) and plain programs are served
        status, _ = http(
            "POST",
            f"{proc.url}/v1/register",
            _register_body("agent://page-1", ["x.y"]),
            headers={"Origin": f"http://{authority}"},
        )
        assert status == 200
        status, _ = http("GET", f"{proc.url.replace('127.0.0.1', 'localhost')}/v1/agents")
        assert status == 200


# --- signed deliveries -------------------------------------------------------------------------


async def test_agents_refuse_unsigned_replayed_and_misaddressed_deliveries(
    net: Net, tmp_path: Path
) -> None:
    """A real SDK agent (verifying, the default with a token) behind a recording proxy: the
    gateway's own delivery is answered; copies and forgeries of it are refused."""
    from aiohttp import ClientSession, web

    from agent_reach.sdk import Agent

    ran: list[str] = []
    agent = Agent(
        "agent://weather-v", gateway=net.gw, token=net.enroll("agent://weather-*", "weather.*")
    )

    @agent.handle("weather.query")
    async def query(payload: Any, ctx: Any) -> dict[str, Any]:
        ran.append(ctx.msg_id)
        return {"sender": ctx.sender, "verified": ctx.verified}

    recorded: list[tuple[bytes, dict[str, str]]] = []
    await agent.start()
    assert agent.verifies_deliveries and agent.endpoint_token

    async with ClientSession() as session:

        async def relay(request: web.Request) -> web.Response:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-reach")}
            recorded.append((body, headers))
            async with session.post(agent.url or "", data=body, headers=headers) as resp:
                return web.Response(body=await resp.read(), status=resp.status)

        app = web.Application()
        app.router.add_post("/relay", relay)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            # the agent moves its endpoint behind the proxy (its own token: same registration)
            async with session.post(
                f"{net.gw}/v1/register",
                json=_register_body(
                    "agent://weather-v", ["weather.query"], f"http://127.0.0.1:{port}/relay"
                ),
                headers={"Authorization": f"Bearer {agent.endpoint_token}"},
            ) as resp:
                assert resp.status == 200, await resp.text()
            caller = net.client("agent://caller-1")
            async with session.post(
                f"{net.gw}/v1/send",
                json={"intent": "weather.query", "recipient_hint": "agent://weather-v"},
                headers={"Authorization": f"Bearer {caller}"},
            ) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
            assert answer["result"] == {"sender": "agent://caller-1", "verified": True}
            assert len(recorded) == 1 and "X-Reach-Assertion" in recorded[0][1]
            body, headers = recorded[0]
            msg_id = json.loads(body)["msg_id"]

            async def deliver(data: bytes, sent: dict[str, str]) -> tuple[int, str]:
                async with session.post(agent.url or "", data=data, headers=sent) as resp:
                    return resp.status, str((await resp.json()).get("detail"))

            signer = _service(net.keys)
            generate_key(tmp_path / "stranger")
            stranger = _service(tmp_path / "stranger")

            # the registration the gateway derives the agent's delivery key from
            owner = jwt.decode(agent.endpoint_token, options={"verify_signature": False})["gen"]

            def signed(service: TokenService, **changes: Any) -> dict[str, str]:
                claims: dict[str, Any] = {
                    "sender": "agent://caller-1",
                    "recipient": "agent://weather-v",
                    "owner": owner,
                    "intent": "weather.query",
                    "msg_id": msg_id,
                    "body": body,
                    "expires_at": time.time() + 30,
                    **changes,
                }
                return {**headers, "X-Reach-Assertion": service.sign_delivery(**claims)}

            unsigned = {k: v for k, v in headers.items() if k != "X-Reach-Assertion"}
            other_body = body.replace(b"weather.query", b"weather.query", 1).replace(
                b'"payload":{}', b'"payload":{"x":1}'
            )
            assert other_body != body
            refusals = [
                (body, headers, "replayed"),
                (other_body, headers, "body"),
                (body, unsigned, "unsigned"),
                (body, signed(signer, recipient="agent://weather-1"), "another endpoint"),
                (body, signed(signer, expires_at=time.time() - 60), "expired"),
                (body, signed(signer, sender="agent://caller-2"), "sender"),
                (body, signed(stranger), "does not publish"),
            ]
            for data, sent, why in refusals:
                status, detail = await deliver(data, sent)
                assert status == 401 and why in detail, (why, detail)
            assert ran == [msg_id]  # none of them reached the handler
            # the positive control: a fresh assertion of the gateway's key is accepted (the
            # msg_id was answered before, so the answer comes from the agent's memory)
            assert (await deliver(body, signed(signer)))[0] == 200
        finally:
            await runner.cleanup()
            await agent.stop()


def test_endpoint_tokens_are_renewed_by_heartbeats(tmp_path: Path) -> None:
    s = secured_setup(tmp_path, POLICY)
    operator = s.operator
    with gateway(*s.flags, "--endpoint-token-ttl", "2", "--heartbeat-interval", "0.2") as proc:
        enroll = http(
            "POST",
            f"{proc.url}/v1/tokens",
            {"kind": "enroll", "endpoints": ["agent://weather-*"], "intents": ["weather.*"]},
            token=operator,
        )[1]["token"]
        agent = start_agent(proc.url, "agent://weather-r", intents="weather.query", token=enroll)
        try:
            client = http(
                "POST",
                f"{proc.url}/v1/tokens",
                {"kind": "client", "subject": "agent://caller-1"},
                token=operator,
            )[1]["token"]
            started = time.monotonic()
            # well past the first endpoint token's 2 s: heartbeats keep renewing it
            wait_until(lambda: time.monotonic() - started > 3.5, 10, interval=0.25)
            status, answer = http("GET", f"{proc.url}/v1/agents/weather-r", token=operator)
            assert status == 200 and answer["status"] == "healthy", answer
            status, answer = http(
                "POST", f"{proc.url}/v1/send", {"intent": "weather.query"}, token=client
            )
            assert status == 200, answer
            events = [line["event"] for line in agent.log_lines()]
            assert "agent.endpoint_token_refused" not in events
            assert "agent.reregistering" not in events
        finally:
            agent.stop()


# --- across gateways, and at delivery time ------------------------------------------------------


def test_ids_stay_bound_across_gateways_sharing_redis(tmp_path: Path) -> None:
    """Two token-mode gateways on one Redis registry and one key directory: the endpoint token
    from one works at the other, and the other refuses to hand the live id to anyone else."""
    from tests.support import REDIS_URL, drop_prefix

    s = secured_setup(tmp_path, POLICY)
    operator = s.operator
    prefix = f"test-{time.monotonic_ns()}"
    flags = [*s.flags, "--registry", REDIS_URL, "--registry-prefix", prefix]
    try:
        with gateway(*flags) as one, gateway(*flags) as two:
            enroll = http(
                "POST",
                f"{one.url}/v1/tokens",
                {"kind": "enroll", "endpoints": ["agent://weather-*"], "intents": ["weather.*"]},
                token=operator,
            )[1]["token"]
            body = _register_body("agent://weather-shared", ["weather.query"])
            status, grant = http("POST", f"{one.url}/v1/register", body, token=enroll)
            assert status == 200, grant
            beat = {"endpoint_id": "agent://weather-shared"}
            # at once, before gateway two's view may have it: refused all the same (checked
            # where the record is written, in Redis)
            evil = _register_body(
                "agent://weather-shared", ["weather.query"], "http://127.0.0.1:8/"
            )
            status, answer = http("POST", f"{two.url}/v1/register", evil, token=enroll)
            assert (status, answer.get("reason")) == (403, "endpoint_held"), answer

            def seen_by_two() -> bool:
                status, _ = http("GET", f"{two.url}/v1/agents/weather-shared", token=operator)
                return status == 200

            wait_until(seen_by_two, 5)
            status, answer = http("POST", f"{two.url}/v1/heartbeat", beat, token=grant["token"])
            assert status == 200, answer
            evil = _register_body(
                "agent://weather-shared", ["weather.query"], "http://127.0.0.1:8/"
            )
            status, answer = http("POST", f"{two.url}/v1/register", evil, token=enroll)
            assert (status, answer.get("reason")) == (403, "endpoint_held"), answer
            status, record = http("GET", f"{one.url}/v1/agents/weather-shared", token=operator)
            assert record["endpoint_url"] == NOWHERE
    finally:
        drop_prefix(prefix)


async def test_delivery_refuses_names_that_resolve_into_denied_networks() -> None:
    """The transport checks every address a name resolves to when it connects (DNS rebinding):
    ``localhost`` is 127.0.0.1, outside the allowed 10.0.0.0/8 here, so nothing is sent."""
    from aiohttp import web

    from agent_reach.core.model import Outcome
    from agent_reach.core.netguard import AddressGuard
    from agent_reach.transport import HttpTransport

    hits: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/reach", record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    guarded = HttpTransport(address_guard=AddressGuard(allowed=["10.0.0.0/8"]))
    open_ = HttpTransport(address_guard=AddressGuard())
    await guarded.start()
    await open_.start()
    try:
        url = f"http://localhost:{port}/reach"
        refused = await guarded.deliver(url, b"{}", {}, 2.0)
        assert refused.outcome is Outcome.CONNECT_ERROR and not refused.reached
        assert "outside the allowed networks" in (refused.detail or ""), refused.detail
        # an address in the URL is checked too (a record written by another gateway), in the
        # legacy forms some HTTP clients dial without asking a resolver as well
        for host in ("127.0.0.1", "127.1", "2130706433", "0177.0.0.1"):
            literal = await guarded.deliver(f"http://{host}:{port}/reach", b"{}", {}, 2.0)
            assert literal.outcome is Outcome.CONNECT_ERROR and not literal.reached, host
        assert hits == []
        allowed = await open_.deliver(url, b"{}", {}, 2.0)  # the control: the same URL works
        assert allowed.outcome is Outcome.OK and hits == [b"{}"]
    finally:
        await guarded.close()
        await open_.close()
        await runner.cleanup()


def test_denials_are_counted_in_the_metrics(net: Net) -> None:
    def denied() -> float:
        text = http("GET", f"{net.gw}/metrics")[1]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith('agent_reach_denied_total{action="send",status="401"}')
        )

    before = denied()
    assert _send(net, None, intent="weather.query")[0] == 401
    assert denied() == before + 1


def test_fallback_matches_stay_within_the_policy(tmp_path: Path) -> None:
    """A fallback (non-exact) match may only land on intents the sender may reach itself:
    alpha.beta.gamma is allowed, but the only near tag, alpha.beta, is not."""
    s = secured_setup(
        tmp_path,
        '[[reach]]\nsenders = ["agent://caller-*"]\n'
        'intents = ["weather.*", "alpha.beta.*", "gamma.delta.*"]\n'
        '[[reach]]\nsenders = ["agent://caller-*"]\nintents = ["gamma.delta"]\n'
        'endpoints = ["agent://near-3"]\n'
        '[[claim]]\nendpoints = ["agent://*"]\nintents = ["*"]\n',
    )
    operator = s.operator
    # a tag read as words is matched only at a low confidence (docs/intents.md): this test is
    # about the policy around a fallback, so it takes what the matcher ranks first
    with gateway(*s.flags, "--confidence-threshold", "0.01") as proc:
        enroll = s.token(Kind.ENROLL, "enroll", endpoints=["agent://*"], intents=["*"])
        for name, intent in (
            ("near-1", "weather.query"),
            ("near-2", "alpha.beta"),
            ("near-3", "gamma.delta"),
            ("near-4", "gamma.delta"),
        ):
            body = _register_body(f"agent://{name}", [intent])
            assert http("POST", f"{proc.url}/v1/register", body, token=enroll)[0] == 200
        caller = s.token(Kind.CLIENT, "agent://caller-1")

        def route(intent: str) -> tuple[int, Any]:
            return http("GET", f"{proc.url}/v1/route?intent={intent}", token=caller)

        # falls back to weather.query: allowed. The index of the new tags is built at the
        # lowest CPU priority (docs/matching.md): on a busy machine it may take a while
        def indexed() -> bool:  # the last registration's tag too (it may come a build later)
            status, answer = route("gamma.delta.x")
            return status == 200 and answer["match"]["tag"] == "gamma.delta"

        wait_until(lambda: route("weather.query.hourly")[0] == 200 and indexed(), timeout=60)
        status, answer = route("weather.query.hourly")
        assert status == 200 and answer["chosen"] == "agent://near-1", answer
        assert answer["match"]["method"] == "semantic"
        # allowed itself; its nearest tag, alpha.beta, is not: never chosen, never suggested
        status, answer = route("alpha.beta.gamma")
        if status == 200:  # a reachable tag was near enough
            assert answer["chosen"] != "agent://near-2", answer
            assert answer["match"]["tag"] in ("weather.query", "gamma.delta"), answer
        else:
            assert (status, answer["error"]) == (404, "no_capable_agent"), answer
            assert "alpha.beta" not in [s["tag"] for s in answer["suggestions"]], answer
        status, answer = http("GET", f"{proc.url}/v1/route?intent=alpha.beta.gamma", token=operator)
        assert status == 200 and answer["chosen"] == "agent://near-2"  # the control
        # gamma.delta may be reached only at near-3: a fallback to it keeps that limit
        for _ in range(5):
            status, answer = route("gamma.delta.x")
            assert status == 200 and answer["chosen"] == "agent://near-3", answer
            assert [c["endpoint_id"] for c in answer["candidates"]] == ["agent://near-3"]


def test_a_policy_change_evicts_ids_it_no_longer_allows(tmp_path: Path) -> None:
    s = secured_setup(tmp_path, POLICY)
    policy, operator = s.policy, s.operator
    enroll = s.token(Kind.ENROLL, "enroll", endpoints=["agent://*"], intents=["*"])
    with gateway(*s.flags) as proc:
        for endpoint_id, intent in (
            ("agent://note-e", "note.create"),
            ("agent://weather-e", "weather.query"),
        ):
            body = _register_body(endpoint_id, [intent])
            assert http("POST", f"{proc.url}/v1/register", body, token=enroll)[0] == 200
        policy.write_text(
            POLICY.replace('endpoints = ["agent://note-*"]', 'endpoints = ["agent://notes-*"]')
        )
        status, answer = http("POST", f"{proc.url}/v1/reload", token=operator)
        assert status == 200 and answer["evicted"] == ["agent://note-e"], answer
        agents = http("GET", f"{proc.url}/v1/agents", token=operator)[1]["agents"]
        assert [a["endpoint_id"] for a in agents] == ["agent://weather-e"]
        body = _register_body("agent://note-e", ["note.create"])
        status, answer = http("POST", f"{proc.url}/v1/register", body, token=enroll)
        assert status == 403 and "policy" in answer["detail"]
        assert any(line["event"] == "agent.evicted" for line in proc.log_lines())


def test_hosts_that_are_not_ascii_are_refused() -> None:
    """A Unicode digit makes a name for Python and an address for the HTTP client: refused."""
    with gateway("--endpoint-networks", "10.0.0.0/8") as proc:
        for url in ("http://\U0001fbf127.0.0.1:9/x", "http://\U0001fbf169.254.\U0001fbf169.254/"):
            status, answer = http(
                "POST", f"{proc.url}/v1/register", _register_body("agent://uni-1", ["x.y"], url)
            )
            assert (status, answer["error"], answer.get("field")) == (
                422,
                "invalid_request",
                "endpoint_url",
            ), answer
        assert http("GET", f"{proc.url}/v1/agents")[1]["agents"] == []


# --- agent to agent ------------------------------------------------------------------------------


def test_agents_reach_each_other_as_themselves_and_only_where_allowed(tmp_path: Path) -> None:
    """The demo's scheduler reaches weather and note agents from its handler (ctx.reach): it
    sends as itself with its endpoint token, and the policy lets it reach weather.query but not
    note.create, so the plan fails on that hop with the gateway's 403 and nothing reaches the
    note agent."""
    import sys

    from tests.support import _start

    s = secured_setup(
        tmp_path,
        '[[reach]]\nsenders = ["agent://caller-*"]\nintents = ["schedule.plan"]\n'
        '[[reach]]\nsenders = ["agent://scheduler-*"]\nintents = ["weather.query"]\n'
        '[[claim]]\nendpoints = ["agent://*"]\nintents = ["*"]\n',
    )
    enroll = s.token(Kind.ENROLL, "demo", endpoints=["agent://*"], intents=["*"])
    with gateway(*s.flags) as proc:
        agents = [
            _start(
                [sys.executable, "-m", f"agent_reach.demo.{name}", "--gateway", proc.url],
                env={"AGENT_REACH_TOKEN": enroll},
            )
            for name in ("weather", "note", "scheduler")
        ]
        try:
            caller = s.token(Kind.CLIENT, "agent://caller-1")
            status, answer = http(
                "POST",
                f"{proc.url}/v1/send",
                {"intent": "schedule.plan", "payload": {"task": "walk", "city": "Chengdu"}},
                token=caller,
            )
            assert status == 502 and answer["error"] == "agent_error", answer
            refusal = answer["agent_answer"]
            assert refusal["error"] == "forbidden" and "note.create" in refusal["detail"], refusal
            assert len(answer["attempts"]) == 1  # final: the plan is not run again
            trace = http("GET", f"{proc.url}/v1/traces/{answer['trace_id']}", token=s.operator)[1]
            received = [e for e in trace["events"] if e["kind"] == "received"]
            # the onward hops carried the request's trace id, sent as the scheduler itself
            assert {e["sender"] for e in received} >= {"agent://caller-1", "agent://scheduler-01"}
            weather_hop = [e for e in received if e["intent"] == "weather.query"]
            assert weather_hop and weather_hop[0]["sender"] == "agent://scheduler-01"
            denied = [
                line
                for line in proc.log_lines()
                if line.get("event") == "audit.denied" and line.get("target") == "note.create"
            ]
            assert denied and denied[0]["who"] == "agent://scheduler-01"
            note_log = agents[1].log_lines()
            assert not [line for line in note_log if line.get("event") == "agent.request"]
        finally:
            for agent in agents:
                agent.stop()


def test_a_client_registering_an_agent_keeps_its_endpoint_token_renewed(tmp_path: Path) -> None:
    """An agent written without the SDK, on SyncReachClient with its enrollment token: the
    client adopts the endpoint token of its registration and the renewals its heartbeats bring,
    so its heartbeats still work after the first endpoint token (2 s) has expired."""
    from agent_reach import SyncReachClient

    s = secured_setup(tmp_path, POLICY)
    enroll = s.token(Kind.ENROLL, "raw", endpoints=["agent://weather-*"], intents=["weather.*"])
    flags = [*s.flags, "--endpoint-token-ttl", "2", "--heartbeat-interval", "0.2"]
    with gateway(*flags) as proc, SyncReachClient(proc.url, token=enroll) as client:
        ids = ("agent://weather-raw", "agent://weather-raw2")  # one client, two registrations
        for endpoint_id in ids:
            registration = client.register(endpoint_id, ["weather.query"], NOWHERE)
            assert registration.token and registration.token_expires_at
        started = time.monotonic()
        beats = 0
        while time.monotonic() - started < 3.0 and beats < 100:  # past the first token's life
            for endpoint_id in ids:
                assert client.heartbeat(endpoint_id) == "healthy"
            beats += 1
            time.sleep(0.1)  # the agent's own heartbeat period, not a settling wait
        assert time.monotonic() - started >= 3.0
        for endpoint_id in ids:
            client.deregister(endpoint_id)  # each with its own (renewed) endpoint token
        assert http("GET", f"{proc.url}/v1/agents", token=s.operator)[1]["agents"] == []


def test_bad_credentials_from_an_address_do_not_lock_out_its_verified_tokens(
    tmp_path: Path,
) -> None:
    """Behind a proxy every caller shares an address: a flood of forged tokens from it is held
    back (429 before any signature check), while tokens already verified keep working."""
    s = secured_setup(tmp_path, POLICY)
    caller = s.token(Kind.CLIENT, "agent://caller-1")
    with gateway(*s.flags, "--rate-limit", "1", "--rate-burst", "2") as proc:
        agents = f"{proc.url}/v1/agents"
        assert http("GET", agents, token=caller)[0] == 200  # verified once, now known
        codes = [http("GET", agents, token=f"forged-{n}")[0] for n in range(3)]
        assert codes[:2] == [401, 401] and codes[2] == 429
        assert http("GET", agents, token=caller)[0] == 200
        fresh = s.token(Kind.CLIENT, "agent://caller-2")  # not seen before: waits its turn
        status, answer, headers = http_full("GET", agents, token=fresh)
        assert status == 429 and int(headers["Retry-After"]) >= 1, answer
        limited = [
            line
            for line in proc.log_lines()
            if line.get("event") == "audit.denied" and line.get("status") == 429
        ]
        assert limited


def test_a_heartbeat_under_a_policy_that_no_longer_allows_the_claim_evicts(
    tmp_path: Path,
) -> None:
    """An id registered under one policy (a registration that raced a reload, here: a gateway
    still on the old file) is evicted at its next heartbeat under the new one."""
    from tests.support import REDIS_URL, drop_prefix

    old = secured_setup(tmp_path / "old", POLICY)
    new_policy = tmp_path / "new.toml"
    new_policy.write_text(POLICY.replace('"agent://note-*"]', '"agent://notes-*"]'))
    prefix = f"test-{time.monotonic_ns()}"
    shared = ["--registry", REDIS_URL, "--registry-prefix", prefix]
    flags_new = [*old.flags[:-1], str(new_policy), *shared]
    try:
        with gateway(*old.flags, *shared) as before, gateway(*flags_new) as after:
            enroll = old.token(Kind.ENROLL, "e", endpoints=["agent://*"], intents=["*"])
            body = _register_body("agent://note-r", ["note.create"])
            status, grant = http("POST", f"{before.url}/v1/register", body, token=enroll)
            assert status == 200, grant
            wait_until(
                lambda: http("GET", f"{after.url}/v1/agents/note-r", token=old.operator)[0] == 200,
                5,
            )
            beat = {"endpoint_id": "agent://note-r"}
            status, answer = http("POST", f"{after.url}/v1/heartbeat", beat, token=grant["token"])
            assert (status, answer["error"]) == (403, "forbidden"), answer
            assert http("GET", f"{after.url}/v1/agents/note-r", token=old.operator)[0] == 404
            assert any(line["event"] == "agent.evicted" for line in after.log_lines())
    finally:
        drop_prefix(prefix)
