"""`agent-reach demo` (and `make run`'s --keep-running) as a new user runs them: with a
nats-server (a private one, named by ``AGENT_REACH_NATS``) one agent serves over NATS; without
one, the demo says NATS was skipped and why, and plays the rest over HTTP. With the a2a-sdk's
server installed (as here) one agent is built with it and registered by its Agent Card, and a
scenario reaches it through A2A; without it (a plain install, played by hiding the server's
packages from the demo's process), the demo says A2A was skipped and why. Either way the
gateway runs with the dictionary shipped in the package, and the last two scenarios ask in words
only: one in Chinese reaches the weather agent by meaning (the semantic matcher, at or above the
threshold), one out of scope is refused with the nearest tags, all under it.

The demo starts its own gateway (in-memory registry) and picks each agent's transport itself, so
neither of tests/support.py's switches changes anything here: under them this module is skipped
(it ran in the plain pass).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_reach.demo import travel
from agent_reach.demo.stack import nats_unavailable
from agent_reach.demo.weather import understand
from agent_reach.intents.dictionary import load_dictionary
from tests.support import (
    MCP_ACCEPT,
    MCP_INITIALIZE,
    ROOT,
    NatsServer,
    cli,
    free_port,
    http,
    http_full,
    own_processes,
    private_nats,
)

pytestmark = own_processes

_GATEWAY = re.compile(r"gateway (http://127\.0\.0\.1:(\d+))")
DEMO_AGENTS = ("weather-cn-01", "note-01", "scheduler-01")  # written with our agent SDK
A2A_AGENT = "travel-a2a-01"  # built with the a2a-sdk, registered by its card
_CARD = re.compile(r"ingested by its card (http://127\.0\.0\.1:\d+/\.well-known/agent-card\.json)")
_TRACE = re.compile(r"trace (trace_[0-9a-f]+)")
THRESHOLD = 0.8  # the gateway's default --confidence-threshold, which the demo runs with
_MATCHED = re.compile(r"matched (\S+) \(method (\w+), confidence ([0-9.]+)\)")
_NEAREST = re.compile(r"nearest tags: (.+)")


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def nats() -> Iterator[NatsServer]:
    with private_nats() as server:
        yield server


def scenario(out: str, title: str) -> str:
    """The lines the demo printed for one scenario (from its title to the next blank line)."""
    start = out.index(title)
    end = out.find("\n\n", start)
    return out[start : end if end >= 0 else len(out)]


def nearest(part: str) -> list[tuple[str, float]]:
    """The nearest tags a refusal printed, with their confidences."""
    found = _NEAREST.search(part)
    assert found, part
    pairs = [item.rsplit(" ", 1) for item in found.group(1).split(", ")]
    return [(tag, float(confidence)) for tag, confidence in pairs]


def check_words(out: str, first: int, day: date) -> None:
    """The two scenarios in words, numbered from ``first``: the Chinese request answered by the
    weather agent by meaning; the joke refused with the nearest tags, all under the threshold.
    ``day``: the date when the demo was started."""
    words = scenario(out, f"{first}. Ask in words, no tag: send --text")
    assert '"帮我查一下明天成都的天气" (no intent, no payload)' in words, words
    assert "answered by agent://weather-cn-01" in words, words
    match = _MATCHED.search(words)
    assert match, words
    assert (match.group(1), match.group(2)) == ("weather.query", "semantic"), words
    assert THRESHOLD <= float(match.group(3)) <= 1.0, words
    # the agent read the city and the day out of the words (it was given no payload)
    tomorrow = {(day + timedelta(days=d)).isoformat() for d in (1, 2)}  # 2: past midnight
    assert '"city": "成都"' in words and any(f'"date": "{d}"' in words for d in tomorrow), words
    joke = scenario(out, f"{first + 1}. Out of scope, in words: send --text")
    assert '"tell me a joke"' in joke, joke
    assert "refused: no_capable_agent" in joke and "as expected" in joke, joke
    near = nearest(joke)
    assert 1 <= len(near) <= 3, joke
    assert all(0.0 <= c < THRESHOLD for _, c in near), joke
    assert [c for _, c in near] == sorted((c for _, c in near), reverse=True), joke
    # the seed's refusal keeps its outcome, and now shows how near it came
    unknown = scenario(out, "3. Refuse rather than misdeliver: send unknown.action")
    assert "refused: no_capable_agent" in unknown and "as expected" in unknown, unknown
    assert all(c < THRESHOLD for _, c in nearest(unknown)), unknown


def check_a2a(out: str, n: int, log_dir: Path) -> None:
    """The scenario numbered ``n``: travel.plan answered by the A2A agent, delivered as A2A to
    the interface its card names; the agent's own log has the request under its trace id."""
    (line,) = [x for x in out.splitlines() if x.startswith("A2A")]
    card = _CARD.search(line)
    assert card, line
    port = card.group(1).split(":")[2].split("/")[0]
    assert line == (
        f"A2A: agent://{A2A_AGENT} (a2a+http://127.0.0.1:{port}/) built with the a2a-sdk,"
        f" ingested by its card {card.group(1)}"
    ), line
    part = scenario(
        out, f'{n}. Over A2A, ingested by its card: send travel.plan {{"city": "成都"}}'
    )
    assert f"answered by agent://{A2A_AGENT}" in part, part
    assert f"delivered over A2A (SendMessage) to a2a+http://127.0.0.1:{port}/" in part, part
    assert '   answer "A day in 成都: the Giant Panda Base' in part, part
    trace = _TRACE.search(part)
    assert trace, part
    logged = (log_dir / f"{A2A_AGENT}.log").read_text()
    assert (
        f'"event":"travel.planned","logger":"agent_reach","city":"成都","trace_id":"{trace.group(1)}"'
        in logged
    )


def demo(log_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", "demo", "--log-dir", str(log_dir)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **env},
        check=False,
    )


def test_demo_plays_the_scenarios_and_leaves_nothing_running(
    tmp_path: Path, nats: NatsServer
) -> None:
    day = date.today()
    done = demo(tmp_path, AGENT_REACH_NATS=nats.url)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert (
        f"8/8 scenarios as expected; on NATS: agent://air-nats-01; over A2A: agent://{A2A_AGENT}"
    ) in out
    assert "Intents: dictionary " in out and "semantic matcher: " in out, out
    assert (
        f"NATS {nats.url}: agent://air-nats-01 (nats:agents.air-nats-01) over NATS,"
        " the others over HTTP"
    ) in out
    assert "answered by agent://weather-cn-01" in out
    assert "refused: no_capable_agent" in out and "as expected" in out
    # the scheduler's onward reaches, in its result
    assert "'agent://weather-cn-01', 'agent://note-01'" in out or (
        '"hops": ["agent://weather-cn-01", "agent://note-01"]' in out
    )
    # ... and the gateway's trace of it as `agent-reach trace` draws it: the two onward
    # requests nested under the scheduler's own hop, each over the attempt that answered it
    assert "3 requests, " in out, out
    waterfall = out[out.index("3 requests, ") :].splitlines()

    def place(hop: str) -> tuple[int, int]:  # (row, column) of a hop's label
        return next((i, line.index(hop)) for i, line in enumerate(waterfall) if hop in line)

    outer_row, outer_column = place("agent://scheduler-01  ok")
    for onward, answered in [
        ("weather.query  ok", "agent://weather-cn-01  ok"),
        ("note.create  ok", "agent://note-01  ok"),
    ]:
        (row, column), (attempt_row, attempt_column) = place(onward), place(answered)
        assert outer_row < row < attempt_row, out
        assert outer_column < column < attempt_column, out
    # the request over NATS: answered by the agent that opens no port, and said so
    nats_part = out[out.index("5. Over NATS, no inbound port: send air.query") :]
    assert "answered by agent://air-nats-01" in nats_part, out
    assert "delivered over NATS to nats:agents.air-nats-01" in nats_part, out
    assert '"aqi": ' in nats_part, out
    check_a2a(out, 6, tmp_path)
    check_words(out, 7, day)
    match = _GATEWAY.search(out)
    assert match, out
    assert _refused(int(match.group(2)))  # the gateway is gone
    logs = {p.name for p in tmp_path.iterdir()}
    assert logs == {
        "gateway.log",
        "air-nats-01.log",
        f"{A2A_AGENT}.log",
        *(f"{n}.log" for n in DEMO_AGENTS),
    }
    for name in (*DEMO_AGENTS, "air-nats-01"):
        # stopped before the gateway: each one deregistered
        assert '"event":"agent.deregistered"' in (tmp_path / f"{name}.log").read_text()


def test_without_nats_the_demo_says_why_and_plays_the_rest(tmp_path: Path) -> None:
    closed = f"nats://127.0.0.1:{free_port()}"
    # AGENT_REACH_SERVE in the caller's shell: the demo's HTTP agents serve over HTTP anyway
    # (had they taken it, they could not serve, and the demo would not start)
    day = date.today()
    done = demo(tmp_path, AGENT_REACH_NATS=closed, AGENT_REACH_SERVE=closed)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    (line,) = [x for x in out.splitlines() if x.startswith("NATS")]
    assert line == (
        f"NATS skipped: no nats-server answers on {closed} (Connection refused);"
        " every agent over HTTP"
    ), out
    assert f"7/7 scenarios as expected; NATS skipped; over A2A: agent://{A2A_AGENT}" in out
    assert "air.query" not in out and "delivered over NATS" not in out
    check_a2a(out, 5, tmp_path)
    check_words(out, 6, day)
    assert {p.name for p in tmp_path.iterdir()} == {
        "gateway.log",
        f"{A2A_AGENT}.log",
        *(f"{n}.log" for n in DEMO_AGENTS),
    }


def test_as_from_a_plain_install_the_demo_says_what_it_skips_and_plays_the_rest(
    tmp_path: Path,
) -> None:
    # as without the semantic extra, where the gateway falls back to the lexical matcher, and
    # without the a2a-sdk's server extra: a sitecustomize hides starlette and sse-starlette from
    # the demo's own process (find_spec answers None, an import fails, as when not installed);
    # it takes its variable out, so the gateway and the agents it starts run as usual
    site, logs = tmp_path / "site", tmp_path / "logs"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if os.environ.pop('HIDE_A2A_SERVER', None):\n"
        "    sys.modules.update(starlette=None, sse_starlette=None)\n"
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    done = demo(
        logs,
        AGENT_REACH_NATS="",
        AGENT_REACH_MATCHER="lexical",
        HIDE_A2A_SERVER="1",
        PYTHONPATH=path,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    (line,) = [x for x in out.splitlines() if x.startswith("A2A")]
    assert line == (
        "A2A skipped: the a2a-sdk's server is not installed (missing starlette, sse-starlette;"
        " pip install 'agent-reach-gateway[a2a]' 'a2a-sdk[http-server]' uvicorn);"
        " no agent over A2A"
    ), line
    assert "travel.plan" not in out and A2A_AGENT not in out, out
    (line,) = [x for x in out.splitlines() if x.startswith("Intents:")]
    assert line.endswith(
        "lexical matcher: word overlap with the tags and their texts;"
        " 'Ask in words, no tag' skipped"
    ), line
    assert "帮我查一下明天成都的天气" not in out  # not played
    assert "5. Out of scope, in words" in out and "refused: no_capable_agent" in out
    assert (
        "5/5 scenarios as expected; NATS skipped; A2A skipped;"
        " 'Ask in words, no tag' skipped (lexical matcher)"
    ) in out
    assert {p.name for p in logs.iterdir()} == {"gateway.log", *(f"{n}.log" for n in DEMO_AGENTS)}


def test_the_nats_probe_is_bounded_and_wants_a_nats_server() -> None:
    # a port that takes the connection and says nothing, and one that speaks another protocol
    with socket.socket() as silent, socket.socket() as other:
        for s in (silent, other):
            s.bind(("127.0.0.1", 0))
            s.listen()
        stop = threading.Event()

        def speak() -> None:
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                stop.wait(5)

        talker = threading.Thread(target=speak, daemon=True)
        talker.start()
        try:
            t0 = time.monotonic()
            url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
            assert nats_unavailable(url, timeout_s=0.3) == (
                f"no nats-server answered on {url} within 0.3 s"
            )
            assert time.monotonic() - t0 < 1.0
            url = f"nats://127.0.0.1:{other.getsockname()[1]}"
            assert nats_unavailable(url, timeout_s=2) == f"{url} answered, but not as a nats-server"
        finally:
            stop.set()
            talker.join(5)
    assert nats_unavailable("http://127.0.0.1:4222") == (
        "'http://127.0.0.1:4222' is not a nats://HOST:PORT address"
    )


def test_keep_running_serves_until_sigint(tmp_path: Path, nats: NatsServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_reach", "demo", "--keep-running", "--log-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
            "AGENT_REACH_NATS": nats.url,
        },
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        text = "".join(lines)
        assert "Agent-Reach is running" in text, text
        assert f"AGENT_REACH_SERVE={nats.url} python -m agent_reach.demo.air" in text, text
        match = _GATEWAY.search(text)
        assert match, text
        url, port = match.group(1), int(match.group(2))
        code, body = http("GET", f"{url}/v1/agents")
        assert code == 200
        assert {a["endpoint_id"]: (a["status"], a["endpoint_url"][:5]) for a in body["agents"]} == {
            "agent://weather-cn-01": ("healthy", "http:"),
            "agent://note-01": ("healthy", "http:"),
            "agent://scheduler-01": ("healthy", "http:"),
            "agent://air-nats-01": ("healthy", "nats:"),
            f"agent://{A2A_AGENT}": ("healthy", "a2a+h"),
        }
        # the A2A agent: ingested by its card (the one printed), delivered to over A2A
        card = _CARD.search(text)
        assert card, text
        (listed,) = [a for a in body["agents"] if a["endpoint_id"] == f"agent://{A2A_AGENT}"]
        assert listed["endpoint_url"].startswith("a2a+http://127.0.0.1:"), listed
        assert listed["capabilities"] == ["travel.plan"], listed
        assert listed["a2a"]["card_url"] == card.group(1), listed
        assert listed["a2a"]["card_version"] == "1.0", listed
        assert [(s["id"], s["intent"], s["how"]) for s in listed["a2a"]["skills"]] == [
            ("travel.plan", "travel.plan", "id")
        ], listed
        assert f"  agent://{A2A_AGENT}" in text and "(A2A, ingested by its card" in text, text
        # the Try block's two lines: a send over A2A, and the card added again with the CLI
        # (named after the card: the same id, registered again)
        assert f'agent-reach send travel.plan \'{{"city": "北京"}}\' --gateway {url}' in text
        assert f"agent-reach a2a add {card.group(1)} --gateway {url}" in text, text
        added = cli("a2a", "add", card.group(1), "--gateway", url)
        assert added.code == 0, added
        assert added.out.splitlines() == [
            f"registered agent://{A2A_AGENT} from its A2A 1.0 card",
            "  skill travel.plan -> travel.plan (id)",
        ], added
        code, sent = http(
            "POST", f"{url}/v1/send", {"intent": "travel.plan", "payload": {"city": "北京"}}
        )
        assert code == 200 and sent["endpoint_id"] == f"agent://{A2A_AGENT}", sent
        parts = sent["result"]["message"]["parts"]
        assert parts[0]["text"].startswith("A day in 北京: the Forbidden City"), sent
        assert parts[1]["data"]["city"] == "北京", sent
        assert http("GET", f"{url}/healthz")[1]["nats"]["connected"] is True
        # the dictionary shipped in the package, in force: every demo tag known and served
        assert "  intents     " in text and "intents.toml (--intents)" in text, text
        assert f"agent-reach send --text '北京明天会下雨吗' --gateway {url}" in text, text
        code, listing = http("GET", f"{url}/v1/intents")
        assert code == 200 and listing["mode"] == "warn", listing
        entries = {i["tag"]: i for i in listing["intents"]}
        for tag in ("weather.query", "note.create", "schedule.plan", "air.query", "travel.plan"):
            assert entries[tag]["known"] and entries[tag]["routable"] == 1, entries[tag]
            assert entries[tag]["description"] and entries[tag]["examples"], entries[tag]
        assert entries["weather.query"]["aliases"] == ["weather.lookup", "weather.get"]
        # how to point an MCP host at it, and /mcp answers an MCP client's first request
        assert f"claude mcp add --transport http agent-reach {url}/mcp" in text, text
        assert f"mcp --gateway {url}" in text, text
        initialize = MCP_INITIALIZE
        accept = MCP_ACCEPT
        code, _, headers = http_full("POST", f"{url}/mcp", initialize, headers=accept)
        assert code == 200 and headers.get("mcp-session-id"), (code, headers)
        # what an LLM host does asked to "check the weather in Chengdu tomorrow": reach, in words
        reached = asyncio.run(_reach_over_mcp(url, "check the weather in Chengdu tomorrow"))
        assert reached.is_error is False, reached
        assert reached.structured_content["endpoint_id"] == "agent://weather-cn-01"
        assert reached.structured_content["trace_id"].startswith("trace_")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
        assert _refused(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


async def _reach_over_mcp(url: str, words: str) -> Any:
    from mcp import Client

    async with Client(f"{url}/mcp") as client:
        return await client.call_tool("reach", {"intent_text": words})


def test_the_travel_agents_card_and_the_dictionary_describe_travel_plan_alike() -> None:
    # the gateway maps the skill by its id; its words are the dictionary's, so that a request
    # in words and the card tell the same story
    entry = load_dictionary(str(ROOT / "src" / "agent_reach" / "demo" / "intents.toml")).entries[
        travel.SKILL
    ]
    (skill,) = travel.build_card("http://127.0.0.1:1").skills
    assert (skill.id, skill.description, list(skill.examples)) == (
        entry.tag,
        entry.description,
        list(entry.examples),
    )
    assert travel.plan_for("成都")[1] == list(travel.PLANS["成都"])
    assert travel.plan_for("拉萨")[0].startswith("A day in 拉萨: the old town")


@pytest.mark.parametrize(
    ("words", "city", "days"),
    [
        ("帮我查一下明天成都的天气", "成都", 1),
        ("what is the weather in Beijing tomorrow", "北京", 1),
        ("上海后天会下雨吗", "上海", 2),
        ("weather in shanghai the day after tomorrow", "上海", 2),
        ("how hot is it in Chengdu", "成都", 0),
        ("北京和上海今天的天气", "北京", 0),  # the first city named
        ("the weather tomorrow", None, 1),
        ("Beijingers say it rains", None, 0),  # Latin names as whole words only
    ],
)
def test_the_weather_agent_reads_a_city_and_a_day_out_of_words(
    words: str, city: str | None, days: int
) -> None:
    today = date(2025, 1, 2)
    assert understand(words, today) == (city, (today + timedelta(days=days)).isoformat())
