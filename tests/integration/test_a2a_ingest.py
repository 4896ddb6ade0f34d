"""A2A agents registered by their Agent Card, tried with real a2a-sdk agents (CONTRACT.md
v1.1, "A2A"; docs/a2a.md).

A real gateway process with the demo's dictionary; agents built with the a2a-sdk's own server
(tests/agents/a2a_agent.py, served by uvicorn). The gateway is pointed at a card URL: its skills
become intents, the agent is reached by intent through ``/v1/send``, a twin takes over when one
is killed, the health falls through the levels when the card stops answering, a changed card is
mapped again, and bad cards are refused with nothing registered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from aiohttp import web

from agent_reach.auth.tokens import Kind
from agent_reach.gateway.cards import CARD_MAP
from agent_reach.registry.redis.store import key_prefix
from tests.support import (
    REDIS_URL,
    ROOT,
    Proc,
    _start,
    cli,
    drop_prefix,
    free_port,
    gateway,
    http,
    secured_setup,
    wait_until,
)

AGENT = ROOT / "tests" / "agents" / "a2a_agent.py"
DICTIONARY = ROOT / "src" / "agent_reach" / "demo" / "intents.toml"
WEATHER = [
    "--skill",
    "weather.query=Current weather for a city",
    "--skill",
    "Forecast=Weather forecast: the conditions and temperature for a city and a date",
    "--example",
    "Forecast=what is the weather in Chengdu tomorrow",
    "--example",
    "Forecast=成都明天天气怎么样",
    "--skill",
    "Jokes=Tells a joke about anything",
]


def a2a_agent(name: str, *flags: str) -> Proc:
    """A real a2a-sdk agent; its ``url`` is its card's URL."""
    return _start([sys.executable, str(AGENT), "--name", name, *flags])


def add(gw: str, card_url: str, endpoint_id: str, *flags: str) -> dict[str, Any]:
    run = cli("a2a", "add", card_url, "--id", endpoint_id, "--gateway", gw, "--json", *flags)
    assert run.code == 0, run
    answer: dict[str, Any] = run.json()
    return answer


def agents(gw: str) -> dict[str, dict[str, Any]]:
    status, answer = http("GET", f"{gw}/v1/agents")
    assert status == 200, answer
    return {a["endpoint_id"]: a for a in answer["agents"]}


def send(gw: str, **body: Any) -> tuple[int, dict[str, Any]]:
    # the default deadline (8000 ms) allows retries: a refused connection fails over
    status, answer = http("POST", f"{gw}/v1/send", body)
    return status, answer


def data_of(result: dict[str, Any]) -> dict[str, Any]:
    """The data part of an A2A answer (a Message, or a Task's artifact)."""
    if "message" in result:
        parts = result["message"]["parts"]
    else:
        parts = result["task"]["artifacts"][0]["parts"]
    return next(p["data"] for p in parts if "data" in p)


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--intents", str(DICTIONARY), "--heartbeat-interval", "0.5") as proc:
        yield proc


def test_a_card_becomes_an_agent_reached_by_intent(gw: Proc) -> None:
    agent = a2a_agent("weather-a2a", *WEATHER)
    try:
        answer = add(gw.url, agent.url, "agent://a2a-weather")
        card = answer["a2a"]
        assert card["card_version"] == "1.0"
        skills = {s["id"]: s for s in card["skills"]}
        assert skills["weather.query"]["intent"] == "weather.query"
        assert skills["weather.query"]["how"] == "id"
        # a skill id that is no tag: its words matched the dictionary's tag at the threshold
        assert skills["Forecast"]["intent"] == "weather.query"
        assert skills["Forecast"]["how"] == "dictionary"
        assert skills["Forecast"]["confidence"] >= 0.8
        assert skills["Jokes"]["intent"] is None
        assert card["unmapped_skills"] == ["Jokes"]
        listed = agents(gw.url)["agent://a2a-weather"]
        assert listed["capabilities"] == ["weather.query"]
        assert listed["endpoint_url"].startswith("a2a+http://127.0.0.1:")
        assert listed["a2a"]["unmapped_skills"] == ["Jokes"]
        assert listed["status"] == "healthy"
        # GET /v1/agents/NAME gives the same AGENT object (a review: without its a2a)
        status, one = http("GET", f"{gw.url}/v1/agents/a2a-weather")
        assert status == 200 and one["a2a"] == listed["a2a"], one

        status, sent = send(
            gw.url,
            intent="weather.query",
            payload={"city": "成都"},
            recipient_hint="agent://a2a-weather",
            sender="agent://caller-1",
            timeout_ms=3000,
        )
        assert status == 200, sent
        assert sent["endpoint_id"] == "agent://a2a-weather"
        seen = data_of(sent["result"])
        assert seen["data"] == {"city": "成都"}
        meta = seen["metadata"]
        assert meta["intent"] == "weather.query"
        assert meta["trace_id"] == sent["trace_id"]
        assert meta["msg_id"] == sent["msg_id"]
        assert meta["sender"] == "agent://caller-1"
        assert 0 < meta["deadline_ms"] <= 3000
        # in words only: the text goes as a text part
        status, words = send(gw.url, intent_text="帮我查一下明天成都的天气")
        assert status == 200, words
        assert words["endpoint_id"] == "agent://a2a-weather"
        assert data_of(words["result"])["parts"] == ["text"]
    finally:
        agent.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-weather"})


def test_a_v03_card_is_read_and_said(gw: Proc) -> None:
    agent = a2a_agent("old-a2a", "--v03", "--skill", "note.create=Write down a note")
    try:
        old_card = agent.url.replace("agent-card.json", "agent.json")
        answer = add(gw.url, old_card, "agent://a2a-old")
        assert answer["a2a"]["card_version"] == "0.3"
        assert agents(gw.url)["agent://a2a-old"]["capabilities"] == ["note.create"]
        status, sent = send(gw.url, intent="note.create", payload={"title": "t"})
        assert status == 200, sent
        assert data_of(sent["result"])["data"] == {"title": "t"}
    finally:
        agent.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-old"})


def test_a_twin_takes_over_when_one_is_killed(gw: Proc) -> None:
    twins = [a2a_agent(f"twin-{i}", "--skill", "air.query=Air quality") for i in range(2)]
    try:
        for i, twin in enumerate(twins):
            add(gw.url, twin.url, f"agent://a2a-twin-{i}")
        answered = {send(gw.url, intent="air.query")[1]["endpoint_id"] for _ in range(20)}
        assert answered == {"agent://a2a-twin-0", "agent://a2a-twin-1"}  # both served
        os.kill(twins[0].popen.pid, signal.SIGKILL)
        twins[0].popen.wait(5)
        results = [send(gw.url, intent="air.query") for _ in range(30)]
        assert all(status == 200 for status, _ in results), results
        assert {a["endpoint_id"] for _, a in results[-10:]} == {"agent://a2a-twin-1"}
    finally:
        for twin in twins:
            twin.stop()
        for i in range(2):
            http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": f"agent://a2a-twin-{i}"})


def test_health_follows_the_card_fetches(gw: Proc) -> None:
    """Card-only agents do not heartbeat: each fetch of the card that answers is one. A
    stopped process answers none, and falls through the levels; resumed, it is healthy."""
    agent = a2a_agent("paused-a2a", "--skill", "schedule.plan=Plans a day")
    try:
        add(gw.url, agent.url, "agent://a2a-paused")
        os.kill(agent.popen.pid, signal.SIGSTOP)
        seen = []

        def status() -> str:
            now = agents(gw.url)["agent://a2a-paused"]["status"]
            if not seen or seen[-1] != now:
                seen.append(now)
            return str(now)

        wait_until(lambda: status() == "down", 15)
        assert seen[0] == "healthy" and "suspect" in seen, seen  # (0.5 s interval: 1.5 s)
        os.kill(agent.popen.pid, signal.SIGCONT)
        wait_until(lambda: status() == "healthy", 10)
    finally:
        os.kill(agent.popen.pid, signal.SIGCONT)
        agent.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-paused"})


def test_a_changed_card_is_mapped_again_within_what_was_registered(gw: Proc) -> None:
    """A changed card is read again: a skill it drops is dropped, one it adds is not taken (a
    registration again, with its checks, adds it), and a moved interface is not followed."""
    port = str(free_port())
    both = ["--skill", "note.create=Notes", "--skill", "note.query=Finds notes"]
    first = a2a_agent("changing-a2a", "--port", port, *both)
    try:
        add(gw.url, first.url, "agent://a2a-changing")
        listed = agents(gw.url)["agent://a2a-changing"]
        assert listed["capabilities"] == ["note.create", "note.query"]
        first.stop()
        second = a2a_agent(
            "changing-a2a",
            "--port",
            port,
            "--card-version",
            "2.0.0",
            "--skill",
            "note.create=Notes",
            "--skill",
            "air.query=Air quality",
        )
        try:
            wait_until(
                lambda: agents(gw.url)["agent://a2a-changing"]["capabilities"] == ["note.create"],
                10,
            )
            added = [
                line
                for line in gw.log_lines()
                if line.get("event") == "a2a.card_new_skills"
                and line.get("endpoint_id") == "agent://a2a-changing"
            ]
            assert added and added[-1]["tags"] == ["air.query"], added
            assert agents(gw.url)["agent://a2a-changing"]["status"] == "healthy"
        finally:
            second.stop()

        def moves() -> int:
            return sum(
                1
                for line in gw.log_lines()
                if line.get("event") == "a2a.card_moved"
                and line.get("endpoint_id") == "agent://a2a-changing"
            )

        moved = a2a_agent("changing-a2a", "--port", port, "--rpc-path", "/rpc", *both)
        try:
            wait_until(lambda: moves() == 1, 10)
            # not followed: the record keeps the address its registration was checked with
            assert agents(gw.url)["agent://a2a-changing"]["endpoint_url"].endswith(f":{port}/")
            # and not heartbeated at it, in the rounds after the one that read the move either
            # (a review found it healthy again one round later, at the old address)
            wait_until(lambda: agents(gw.url)["agent://a2a-changing"]["status"] != "healthy", 5)
            watched = time.monotonic() + 2.0  # four rounds of the 0.5 s heartbeat interval
            while time.monotonic() < watched:
                assert agents(gw.url)["agent://a2a-changing"]["status"] != "healthy"
                time.sleep(0.1)  # polling interval
        finally:
            moved.stop()
        # the moved card changes again (a skill dropped), its interface still the new one: a
        # review found it registered then at the new address, with none of a registration's
        # checks, and heartbeated there
        again = a2a_agent(
            "changing-a2a", "--port", port, "--rpc-path", "/rpc", "--skill", "note.create=Notes"
        )
        try:
            wait_until(lambda: moves() == 2, 10)
            listed = agents(gw.url)["agent://a2a-changing"]
            assert listed["endpoint_url"].endswith(f":{port}/"), listed
            assert listed["capabilities"] == ["note.create"] and listed["status"] != "healthy"
        finally:
            again.stop()
    finally:
        first.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-changing"})


def test_bad_cards_are_refused_and_register_nothing(gw: Proc) -> None:
    before = agents(gw.url)
    nowhere = f"http://127.0.0.1:{free_port()}/.well-known/agent-card.json"
    unmapped = a2a_agent("unmapped-a2a", "--skill", "Jokes=Tells a joke")
    try:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"a2a_card_url": nowhere}, "a2a_card_url"),
            ({"a2a_card_url": f"{gw.url}/healthz"}, "a2a_card_url"),  # JSON, no card
            ({"a2a_card_url": f"{gw.url}/metrics"}, "a2a_card_url"),  # not JSON
            ({"a2a_card_url": "ftp://127.0.0.1/card"}, "a2a_card_url"),
            ({"a2a_card_url": "http://u:p@127.0.0.1:9/card"}, "a2a_card_url"),
            ({"a2a_card_url": "http://169.254.169.254/latest/card"}, "a2a_card_url"),
            ({"a2a_card_url": unmapped.url}, "capabilities"),  # no skill maps to a tag
            ({"a2a_card_url": unmapped.url, "endpoint_url": "http://127.0.0.1:9/"}, ""),
            ({"a2a_card_url": unmapped.url, "capabilities": ["Bad Tag"]}, "capabilities[0]"),
        ]
        for fields, field in cases:
            body = {"endpoint_id": "agent://a2a-bad", **fields}
            status, answer = http("POST", f"{gw.url}/v1/register", body)
            assert status in (400, 422), (fields, status, answer)
            assert answer["error"] == "invalid_request", answer
            if field:
                assert answer.get("field") == field, (fields, answer)
        # capabilities given win over the card's skills
        status, answer = http(
            "POST",
            f"{gw.url}/v1/register",
            {
                "endpoint_id": "agent://a2a-given",
                "a2a_card_url": unmapped.url,
                "capabilities": ["note.query"],
            },
        )
        assert status == 200, answer
        assert answer["a2a"]["unmapped_skills"] == ["Jokes"]
        assert agents(gw.url)["agent://a2a-given"]["capabilities"] == ["note.query"]
    finally:
        unmapped.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-given"})
    after = agents(gw.url)
    assert "agent://a2a-bad" not in after
    assert set(after) == set(before)


def test_every_gateway_of_a_shared_registry_keeps_the_card() -> None:
    """The kept cards live in the registry: on Redis, a gateway that did not register the
    agent keeps fetching its card when the one that did is gone."""
    prefix = f"test-{os.urandom(6).hex()}"
    shared = ["--registry", REDIS_URL, "--registry-prefix", prefix, "--heartbeat-interval", "1"]
    agent = a2a_agent("shared-a2a", "--skill", "note.create=Notes")
    try:
        with gateway(*shared) as second:
            with gateway(*shared) as first:
                add(first.url, agent.url, "agent://a2a-shared")
                wait_until(lambda: "agent://a2a-shared" in agents(second.url), 5)
            # the first gateway is gone: 3 intervals without its fetches and the agent would be
            # down, unless the second one fetches the card too (a late fetch under load may
            # make it degraded for a moment: 1 interval)
            seen = []
            deadline = time.monotonic() + 4.5
            while time.monotonic() < deadline:
                seen.append(agents(second.url)["agent://a2a-shared"]["status"])
                time.sleep(0.1)  # polling interval, not a settle delay
            assert not {"suspect", "down"} & set(seen), seen
            assert seen[-1] in ("healthy", "degraded"), seen
            status, sent = send(second.url, intent="note.create")
            assert status == 200, sent
            http("POST", f"{second.url}/v1/deregister", {"endpoint_id": "agent://a2a-shared"})
    finally:
        agent.stop()
        drop_prefix(prefix, REDIS_URL)


def test_a_kept_card_goes_with_its_id() -> None:
    """A card is kept while its id is an A2A agent's. Registered with a card, then registered
    again with a plain URL and deregistered, an id left its card kept for good while no other
    A2A agent was registered (the keeper skips its rounds then): 1,000 such rounds kept 1,000
    cards with nothing registered (a review of 2026-12-07). So did a card agent purged while
    alone. The kept cards are a Redis hash here, read as they are."""
    prefix = f"test-{os.urandom(6).hex()}"
    shared = ["--registry", REDIS_URL, "--registry-prefix", prefix]
    quick = ["--heartbeat-interval", "0.5", "--purge-after", "1.5"]  # down after 3 intervals
    agent = a2a_agent("kept-a2a", "--skill", "note.create=Notes")
    store = redis.Redis.from_url(REDIS_URL)
    key = f"{key_prefix(prefix)}:map:{CARD_MAP}"
    try:
        with gateway(*shared, *quick) as gw:
            add(gw.url, agent.url, "agent://a2a-kept")
            assert store.hexists(key, "agent://a2a-kept")
            plain = {
                "endpoint_id": "agent://a2a-kept",
                "capabilities": ["note.create"],
                "endpoint_url": "http://127.0.0.1:9/reach",
            }
            assert http("POST", f"{gw.url}/v1/register", plain)[0] == 200
            assert not store.hexists(key, "agent://a2a-kept")  # registered otherwise: let go
            ended = {"endpoint_id": "agent://a2a-kept"}
            assert http("POST", f"{gw.url}/v1/deregister", ended)[0] == 200

            # a card agent alone, its card host gone: down, purged, and its card forgotten
            # within the keeper's rounds (3 rounds missing, 0.3 s apart here)
            add(gw.url, agent.url, "agent://a2a-purged")
            agent.stop()
            wait_until(lambda: "agent://a2a-purged" not in agents(gw.url), 10)
            wait_until(lambda: store.hlen(key) == 0, 5)
    finally:
        agent.stop()
        store.close()
        drop_prefix(prefix, REDIS_URL)


def test_token_mode_judges_a_card_registration_as_any(tmp_path: Path) -> None:
    policy = '[[claim]]\nendpoints = ["agent://a2a-*"]\nintents = ["note.*"]\n'
    s = secured_setup(tmp_path, policy)
    agent = a2a_agent("secured-a2a", "--skill", "note.create=Notes", "--skill", "air.query=Air")
    try:
        with gateway(*s.flags, "--matcher", "none") as gw:
            enroll = s.token(Kind.ENROLL, "e", endpoints=["agent://a2a-*"], intents=["note.*"])
            body = {"endpoint_id": "agent://a2a-notes", "a2a_card_url": agent.url}
            # the card's skills include air.query, which the policy does not let it claim
            status, answer = http("POST", f"{gw.url}/v1/register", body, token=enroll)
            assert status == 403, answer
            status, answer = http("POST", f"{gw.url}/v1/register", body)  # no token
            assert status == 401, answer
            given = {**body, "capabilities": ["note.create"]}
            status, answer = http("POST", f"{gw.url}/v1/register", given, token=enroll)
            assert status == 200, answer
            client = s.token(Kind.CLIENT, "agent://caller-1")
            listed = http("GET", f"{gw.url}/v1/agents", token=s.operator)[1]["agents"]
            assert [a["endpoint_id"] for a in listed] == ["agent://a2a-notes"]
            assert client  # a sender may not reach note.create: no reach rule in this policy
            status, sent = http(
                "POST", f"{gw.url}/v1/send", {"intent": "note.create"}, token=client
            )
            assert status == 403, sent
    finally:
        agent.stop()


def test_signed_cards_are_verified_with_the_trusted_keys(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from jwt.algorithms import ECAlgorithm

    def key_pair(name: str) -> tuple[Path, dict[str, Any]]:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = tmp_path / f"{name}.pem"
        pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        jwk = json.loads(ECAlgorithm.to_jwk(key.public_key()))
        return pem, {**jwk, "kid": name, "alg": "ES256", "use": "sig"}

    trusted_pem, trusted_jwk = key_pair("trusted")
    other_pem, _ = key_pair("other")
    keys = tmp_path / "card-keys.json"
    keys.write_text(json.dumps({"keys": [trusted_jwk]}))
    skill = ["--skill", "note.create=Notes"]
    good = a2a_agent("signed-a2a", *skill, "--sign-key", str(trusted_pem), "--kid", "trusted")
    forged = a2a_agent("forged-a2a", *skill, "--sign-key", str(other_pem), "--kid", "trusted")
    unsigned = a2a_agent("unsigned-a2a", *skill)
    try:
        with gateway("--matcher", "none", "--a2a-card-keys", str(keys)) as gw:
            answer = add(gw.url, good.url, "agent://a2a-signed")
            assert answer["a2a"]["signature"] == "verified"
            body = {"endpoint_id": "agent://a2a-forged", "a2a_card_url": forged.url}
            status, refused = http("POST", f"{gw.url}/v1/register", body)
            assert status == 422, refused
            assert "no valid signature" in refused["detail"]
            assert refused["field"] == "a2a_card_url"
            # a card without signatures is taken as it is (and shown unsigned)
            assert add(gw.url, unsigned.url, "agent://a2a-unsigned")["a2a"]["signature"] is None
            assert set(agents(gw.url)) == {"agent://a2a-signed", "agent://a2a-unsigned"}
        with gateway("--matcher", "none") as gw:  # no keys configured: not checked, and said
            assert add(gw.url, forged.url, "agent://a2a-forged")["a2a"]["signature"] == "unchecked"
        bad_keys = tmp_path / "bad.json"
        bad_keys.write_text("{not json")
        run = cli("serve", "--port", "0", "--a2a-card-keys", str(bad_keys))
        assert run.code == 2, run
        assert "--a2a-card-keys" in run.err
    finally:
        for agent in (good, forged, unsigned):
            agent.stop()


class CardHost:
    """Cards served by this test's own aiohttp server (a thread with its own loop): each
    ``/c/NAME`` answers once, then, for names starting with ``h``, hangs (a card host that
    stops answering after its agent registered)."""

    def __init__(self) -> None:
        self.served: set[str] = set()
        self.loop = asyncio.new_event_loop()
        self.release = asyncio.Event()  # set at stop(): the hanging answers end
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def card(self, name: str) -> dict[str, Any]:
        skill = "note.create" if name.startswith("h") else "good.one"
        return {
            "name": name,
            "description": "a card of the test's",
            "version": "1",
            "supportedInterfaces": [
                {
                    "url": f"http://127.0.0.1:{self.port}/rpc",
                    "protocolBinding": "JSONRPC",
                    "protocolVersion": "1.0",
                }
            ],
            "capabilities": {},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": skill, "name": skill, "description": "d", "tags": ["t"]}],
        }

    async def _serve(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name.startswith("h") and name in self.served:
            await self.release.wait()  # hangs (the gateway gives up first), until stop()
        self.served.add(name)
        return web.json_response(self.card(name))

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/c/{name}", self._serve)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        ready.set()
        self.loop.run_forever()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/c/{name}"

    def stop(self) -> None:
        async def down() -> None:
            self.release.set()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()  # (its self-pipe sockets, else left to the collector: a warning)


def test_hanging_card_hosts_do_not_starve_a_good_card_agents_heartbeats() -> None:
    """80 card agents whose card hosts hang once registered, beside one whose host answers,
    at a 2 s heartbeat interval (rounds every 1.2 s, degraded past 2 s: 0.8 s of margin for
    a loaded machine): the good one stays healthy. Fetched 16 at a time for up to 1 s each,
    all of a round ended before the next began, and the good one fell to degraded and
    suspect every round (a review's run with 160 at 1 s)."""
    host = CardHost()
    try:
        with gateway("--matcher", "none", "--heartbeat-interval", "2") as gw:
            good = {"endpoint_id": "agent://card-good", "a2a_card_url": host.url("good")}
            assert http("POST", f"{gw.url}/v1/register", good)[0] == 200
            for i in range(80):
                body = {"endpoint_id": f"agent://card-h{i}", "a2a_card_url": host.url(f"h{i}")}
                status, answer = http("POST", f"{gw.url}/v1/register", body)
                assert status == 200, answer
            seen = []
            watched = time.monotonic() + 8.0  # six rounds
            while time.monotonic() < watched:
                seen.append(agents(gw.url)["agent://card-good"]["status"])
                time.sleep(0.2)  # polling interval
            assert set(seen) == {"healthy"}, seen
            # the hanging ones are not heartbeated: they fall (none answers its fetch)
            assert agents(gw.url)["agent://card-h0"]["status"] != "healthy"
    finally:
        host.stop()


def test_what_is_kept_of_a_card_is_bounded(gw: Proc) -> None:
    """A review: a card's name and skill names were kept and listed whole (a 300 KB name in
    every /v1/agents entry, and in the shared registry's map); they are cut to 256."""
    name = "n" * 5000
    skill = "note.create=" + "d" * 100
    agent = a2a_agent(name, "--skill", skill, "--skill", "x" * 3000 + "=Something")
    try:
        answer = add(gw.url, agent.url, "agent://a2a-big-names")
        assert answer["a2a"]["name"] == "n" * 256
        ids = [s["id"] for s in answer["a2a"]["skills"]]
        assert ids[0] == "note.create" and ids[1] == "x" * 256, ids
        listed = agents(gw.url)["agent://a2a-big-names"]
        assert len(listed["a2a"]["name"]) == 256
        assert all(len(s["name"]) <= 256 for s in listed["a2a"]["skills"])
    finally:
        agent.stop()
        http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": "agent://a2a-big-names"})
