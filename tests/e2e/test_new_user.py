"""The issues' walk-throughs, as a new user does them, on real processes.

Write a 15-line agent with the SDK (examples/hello_agent.py), start it, see it in
`agent-reach agents`, reach it from another script and from the CLI, kill it and watch its status
fall through the four levels.

Issue 12: write a dictionary file, start the gateway with it (`serve --intents FILE`, the
default matcher) and the demo's weather and note agents, then ask for `weather.lookup` (an
alias), for nothing but the words "帮我查一下明天成都的天气", and for "tell me a joke": the first
two reach the weather agent and say how they matched; the third is refused, with the nearest
tags and their confidences.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

from agent_reach import SyncReachClient
from tests.support import ROOT, Proc, gateway, http, start_sdk_agent

THRESHOLD = 0.8  # the default --confidence-threshold
# the new user's dictionary: the contract's example entry, and one for notes
DICTIONARY = """\
[[intent]]
tag = "weather.query"                        # the canonical tag (v1 tag grammar)
description = "Current or coming weather for a place and a date"
aliases = ["weather.lookup", "weather.get"]  # other tags callers may use
examples = ["what is the weather in Chengdu tomorrow", "成都明天天气怎么样"]   # any language

[[intent]]
tag = "note.create"
description = "Write down a note with a title and a text"
examples = ["take a note: buy tea", "记一下明天开会"]
"""


def cli(gw: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "AGENT_REACH_GATEWAY": gw, "COLUMNS": "200"},
        check=False,
    )


def test_write_start_see_reach_kill_watch_it_fall() -> None:
    source = (ROOT / "examples" / "hello_agent.py").read_text()
    code_lines = [
        line for line in source.splitlines() if line.strip() and not line.startswith('"""')
    ]
    assert len(code_lines) <= 15

    with gateway("--heartbeat-interval", "0.5") as gw:
        agent = start_sdk_agent(
            [sys.executable, str(ROOT / "examples" / "hello_agent.py")],
            env={"AGENT_REACH_GATEWAY": gw.url},
        )
        try:
            listed = cli(gw.url, "agents")
            assert listed.returncode == 0, listed.stderr
            assert "agent://hello-01" in listed.stdout and "greeting.say" in listed.stdout
            assert "healthy" in listed.stdout

            with SyncReachClient(gw.url) as client:
                reply = client.send("greeting.say", {"name": "ada"})
                assert reply.result["text"] == "hello, ada"
                assert reply.endpoint_id == "agent://hello-01"

                sent = cli(gw.url, "send", "greeting.say", '{"name": "bob"}')
                assert sent.returncode == 0, sent.stderr
                assert "hello, bob" in sent.stdout

                agent.popen.send_signal(signal.SIGKILL)  # no deregistration: it just dies
                agent.popen.wait(5)
                seen: list[str] = []
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (not seen or seen[-1] != "down"):
                    status = client.agent("hello-01").status
                    if not seen or seen[-1] != status:
                        seen.append(status)
                    time.sleep(0.02)
            assert seen == ["healthy", "degraded", "suspect", "down"]
            final = cli(gw.url, "agents", "--json")
            assert final.returncode == 0
            (hello,) = json.loads(final.stdout)["agents"]
            assert hello["status"] == "down"
        finally:
            agent.stop()


def matcher_answers(gw: Proc, timeout: float = 20.0) -> None:
    """Until the gateway's matcher scores words (its first index, built off the request path
    as it starts, is in force): a dry run matched, or refused with suggestions."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = http("GET", f"{gw.url}/v1/route?intent_text=weather+query")
        if code == 200 or body.get("suggestions"):
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def test_a_dictionary_then_ask_by_alias_by_words_and_out_of_scope(tmp_path: Path) -> None:
    path = tmp_path / "intents.toml"
    path.write_text(DICTIONARY)
    checked = cli("", "intents", "check", str(path))
    assert checked.returncode == 0 and "ok, 2 entries, 2 aliases" in checked.stdout, checked
    day = date.today()
    with gateway("--intents", str(path)) as gw:
        agents = [
            start_sdk_agent([sys.executable, "-m", f"agent_reach.demo.{name}", "--gateway", gw.url])
            for name in ("weather", "note")
        ]
        try:
            (started,) = [x for x in gw.log_lines() if x.get("event") == "intent.matcher"]
            assert started["matcher"] == "semantic", started  # the default, installed
            matcher_answers(gw)

            # an alias: the canonical tag's agent, confidence 1.0, and the CLI says so
            sent = cli(gw.url, "send", "weather.lookup", '{"city": "成都"}')
            assert sent.returncode == 0, sent.stderr
            assert "endpoint agent://weather-cn-01  match alias weather.query 1.00" in sent.stdout
            answer = json.loads(cli(gw.url, "send", "weather.lookup", "{}", "--json").stdout)
            assert answer["ok"] is False and answer["error"] == "agent_error"  # no city: 422
            with SyncReachClient(gw.url) as client:
                reply = client.send("weather.lookup", {"city": "成都"})
            assert (reply.endpoint_id, reply.intent) == ("agent://weather-cn-01", "weather.query")
            assert reply.match is not None
            assert (reply.match.method, reply.match.tag, reply.match.confidence) == (
                "alias",
                "weather.query",
                1.0,
            )

            # nothing but words: the weather agent by meaning, which reads the city and the day
            words = "帮我查一下明天成都的天气"
            sent = cli(gw.url, "send", "--text", words)
            assert sent.returncode == 0, sent.stdout + sent.stderr
            said = re.search(r"endpoint (\S+)  match (\w+) (\S+) ([0-9.]+)", sent.stdout)
            assert said, sent.stdout
            assert said.groups()[:3] == ("agent://weather-cn-01", "semantic", "weather.query")
            answer = json.loads(cli(gw.url, "send", "--text", words, "--json").stdout)
            assert answer["endpoint_id"] == "agent://weather-cn-01", answer
            assert (answer["match"]["method"], answer["match"]["tag"]) == (
                "semantic",
                "weather.query",
            )
            assert THRESHOLD <= answer["match"]["confidence"] <= 1.0, answer
            assert answer["result"]["city"] == "成都", answer
            tomorrow = {(day + timedelta(days=d)).isoformat() for d in (1, 2)}  # 2: midnight
            assert answer["result"]["date"] in tomorrow, answer

            # out of scope: refused, with the nearest tags and how near they came
            refused = cli(gw.url, "send", "--text", "tell me a joke")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            shown = refused.stdout + refused.stderr
            assert "no_capable_agent" in shown and "nearest  " in shown, shown
            answer = json.loads(cli(gw.url, "send", "--text", "tell me a joke", "--json").stdout)
            assert answer["error"] == "no_capable_agent" and answer["attempts"] == [], answer
            near = [(s["tag"], s["confidence"]) for s in answer["suggestions"]]
            assert 1 <= len(near) <= 3, answer
            assert all(0.0 <= c < THRESHOLD for _, c in near), answer
            assert [c for _, c in near] == sorted((c for _, c in near), reverse=True), answer
            nearest = shown[shown.index("nearest  ") :].splitlines()[0]
            for tag, confidence in near:  # as printed
                assert f"{tag} {confidence:.2f}" in nearest, nearest
        finally:
            for agent in agents:
                agent.stop()
