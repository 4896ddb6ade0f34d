"""The intent dictionary on a real gateway process: start, /v1/intents, the registration modes,
reload (POST /v1/reload and SIGHUP) and the `agent-reach intents` commands.

Every gateway here runs the lexical matcher (--matcher lexical): what is checked is the
dictionary's wiring, not the semantic model (tests of matching are elsewhere).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import Proc, gateway, http, metric, start_agent, wait_until

GOOD = """\
[[intent]]
tag = "weather.query"
description = "Current or coming weather for a place and a date"
aliases = ["weather.lookup", "weather.get"]
examples = ["what is the weather in Chengdu tomorrow", "will it rain in Paris today"]

[[intent]]
tag = "note.create"
description = "Write a note down"
examples = ["remember to buy milk"]

[[intent]]
tag = "weather.old"
deprecated = true
replaced_by = "weather.query"
"""
# GOOD with one more entry
NEWER = GOOD + '\n[[intent]]\ntag = "flight.search"\ndescription = "Find flights"\n'
# the alias of line 9 is already weather.query's
BAD = GOOD.replace('tag = "note.create"', 'tag = "note.create"\naliases = ["weather.get"]')
BAD_LINE = 9
MATCHER = ("--matcher", "lexical")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


def register(gw: str, endpoint_id: str, *tags: str) -> tuple[int, Any]:
    body = {
        "endpoint_id": endpoint_id,
        "capabilities": list(tags),
        "endpoint_url": "http://127.0.0.1:9/reach",  # never delivered to here
    }
    return http("POST", f"{gw}/v1/register", body)


def listing(gw: str) -> dict[str, dict[str, Any]]:
    status, body = http("GET", f"{gw}/v1/intents")
    assert status == 200, body
    return {item["tag"]: item for item in body["intents"]}


def events(proc: Proc, name: str) -> list[dict[str, Any]]:
    return [line for line in proc.log_lines() if line.get("event") == name]


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "intents.toml"
    path.write_text(GOOD, encoding="utf-8")
    return path


# --- start ---------------------------------------------------------------------------------------


def test_a_bad_file_at_start_exits_2_naming_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD, encoding="utf-8")
    done = cli("serve", "--port", "0", "--intents", str(bad), *MATCHER, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{bad} line {BAD_LINE}:" in done.stderr
    assert "given to two tags" in done.stderr
    assert "listening" not in done.stdout
    missing = cli("serve", "--port", "0", "--intents", str(tmp_path / "nope.toml"), timeout=30)
    assert missing.returncode == 2 and "cannot read it" in missing.stderr


def test_intents_lists_the_dictionary_and_the_tags_agents_come_and_go_with(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER, "--heartbeat-interval", "0.3") as gw:
        assert events(gw, "intent.dictionary_loaded")[0]["entries"] == 3
        status, body = http("GET", f"{gw.url}/v1/intents")
        assert status == 200 and body["mode"] == "warn"  # the default with a file
        assert [i["tag"] for i in body["intents"]] == [
            "weather.query",
            "note.create",
            "weather.old",
        ]
        weather = body["intents"][0]
        assert weather == {
            "tag": "weather.query",
            "description": "Current or coming weather for a place and a date",
            "aliases": ["weather.lookup", "weather.get"],
            "examples": ["what is the weather in Chengdu tomorrow", "will it rain in Paris today"],
            "deprecated": False,
            "replaced_by": None,
            "known": True,
            "served_by": 0,
            "routable": 0,
        }
        old = body["intents"][2]
        assert (old["deprecated"], old["replaced_by"]) == (True, "weather.query")

        agent = start_agent(gw.url, "agent://dict-weather-1", intents="weather.query,side.thing")
        try:
            tags = listing(gw.url)
            assert (tags["weather.query"]["served_by"], tags["weather.query"]["routable"]) == (1, 1)
            extra = tags["side.thing"]  # registered outside the dictionary
            assert (extra["known"], extra["served_by"], extra["description"]) == (False, 1, "")
            # an endpoint that never heartbeats is served_by, and soon not routable
            assert register(gw.url, "agent://dict-silent", "weather.query")[0] == 200
            assert listing(gw.url)["weather.query"]["served_by"] == 2
            wait_until(lambda: listing(gw.url)["weather.query"]["routable"] == 1, 10)
            assert listing(gw.url)["weather.query"]["served_by"] == 2
        finally:
            agent.stop()
        wait_until(lambda: "side.thing" not in listing(gw.url), 10)  # it deregistered
        assert listing(gw.url)["weather.query"]["served_by"] == 1  # the silent one, listed
        assert listing(gw.url)["weather.query"]["routable"] == 0


# --- registration modes ----------------------------------------------------------------------


def test_strict_refuses_a_tag_outside_the_dictionary_and_registers_nothing(good: Path) -> None:
    with gateway("--intents", str(good), "--intent-mode", "strict", *MATCHER) as gw:
        status, body = register(gw.url, "agent://strict-1", "weather.query", "weather.lookup")
        assert (status, body["error"]) == (422, "unknown_intent"), body
        assert body["intents"] == ["weather.lookup"]  # an alias is not a canonical tag
        assert body["suggestions"][0] == {"tag": "weather.query", "confidence": 1.0}
        assert len(body["suggestions"]) <= 3
        status, body = register(gw.url, "agent://strict-2", "joke.tell")
        assert (status, body["error"]) == (422, "unknown_intent")
        assert body["intents"] == ["joke.tell"] and isinstance(body["suggestions"], list)
        assert all(
            s["tag"] in ("weather.query", "note.create", "weather.old") for s in body["suggestions"]
        )
        assert http("GET", f"{gw.url}/v1/agents")[1]["agents"] == []  # nothing registered
        assert metric(gw, "agent_reach_unknown_intent_registrations_total", mode="strict") == 2
        assert register(gw.url, "agent://strict-3", "weather.query", "note.create")[0] == 200
        refused = events(gw, "intent.unknown")
        assert [e["endpoint_id"] for e in refused] == ["agent://strict-1", "agent://strict-2"]


def test_warn_registers_and_counts_open_does_neither(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:  # warn: the default with a file
        assert register(gw.url, "agent://warn-1", "weather.query", "joke.tell")[0] == 200
        assert register(gw.url, "agent://warn-2", "weather.query")[0] == 200
        assert metric(gw, "agent_reach_unknown_intent_registrations_total", mode="warn") == 1
        (line,) = events(gw, "intent.unknown")
        assert (line["endpoint_id"], line["tags"], line["mode"]) == (
            "agent://warn-1",
            ["joke.tell"],
            "warn",
        )
        assert listing(gw.url)["joke.tell"]["known"] is False
    with gateway("--intents", str(good), "--intent-mode", "open", *MATCHER) as gw:
        assert register(gw.url, "agent://open-1", "joke.tell")[0] == 200
        assert metric(gw, "agent_reach_unknown_intent_registrations_total") == 0
        assert events(gw, "intent.unknown") == []
        assert http("GET", f"{gw.url}/v1/intents")[1]["mode"] == "open"


# --- reload ----------------------------------------------------------------------------------


def test_post_reload_takes_a_good_file_and_refuses_a_bad_one_by_line(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:
        status, answer = http("POST", f"{gw.url}/v1/reload")  # open mode, unchanged file
        assert status == 200, answer
        assert answer["intents"] == {"path": str(good), "entries": 3, "changed": False}
        good.write_text(NEWER, encoding="utf-8")
        status, answer = http("POST", f"{gw.url}/v1/reload")
        assert status == 200 and answer["intents"]["entries"] == 4, answer
        assert answer["intents"]["changed"] is True
        assert listing(gw.url)["flight.search"]["known"] is True
        good.write_text(BAD, encoding="utf-8")
        status, answer = http("POST", f"{gw.url}/v1/reload")
        assert (status, answer["error"], answer["line"]) == (422, "config_error", BAD_LINE)
        assert answer["source"] == "intents" and "the old one stays" in answer["detail"]
        assert "given to two tags" in answer["detail"]
        assert "flight.search" in listing(gw.url)  # the old (NEWER) one stays in force
        (refusal,) = events(gw, "intent.dictionary_refused")
        assert refusal["line"] == BAD_LINE
        # an alias of the dictionary in force still routes (weather.get)
        assert register(gw.url, "agent://reload-w", "weather.query")[0] == 200
        status, route = http("GET", f"{gw.url}/v1/route?intent=weather.get")
        assert status == 200 and route["chosen"] == "agent://reload-w", route


# the kinds of fault, each after GOOD's 15 lines and a blank one:
# (added text, line at fault, words)
RELOAD_FAULTS = [
    ('[[intent]]\ntag = "x.y"\ndescription = "open\n', 19, "not valid TOML"),
    ('[[intent]]\ntag = "note.create"\n', 18, "repeated (first at line 8)"),
    ('[[intent]]\ntag = "x.y"\naliases = ["weather.get"]\n', 19, "given to two tags"),
    ('[[intent]]\ntag = "x.y"\naliases = ["note.create"]\n', 19, "also a tag"),
    ('[[intent]]\ntag = "X..y"\n', 18, "not a valid tag"),
    ("#" * (10 * 1024 * 1024 + 1) + "\n", None, "over 10 MB"),
]


def test_every_kind_of_fault_is_refused_by_reload_and_nothing_changes(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:
        before = http("GET", f"{gw.url}/v1/intents")[1]
        assert GOOD.count("\n") == 15  # the lines RELOAD_FAULTS count from
        for added, line, words in RELOAD_FAULTS:
            good.write_text(GOOD + "\n" + added, encoding="utf-8")
            status, answer = http("POST", f"{gw.url}/v1/reload")
            assert (status, answer["error"], answer.get("line")) == (422, "config_error", line)
            assert words in answer["detail"] and "the old one stays" in answer["detail"]
            assert http("GET", f"{gw.url}/v1/intents")[1] == before
        assert len(events(gw, "intent.dictionary_refused")) == len(RELOAD_FAULTS)
        good.write_text(NEWER, encoding="utf-8")  # and a good file after them is taken
        status, answer = http("POST", f"{gw.url}/v1/reload")
        assert status == 200 and answer["intents"]["entries"] == 4, answer


def test_sighup_rereads_the_dictionary(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:
        good.write_text(NEWER, encoding="utf-8")
        gw.popen.send_signal(signal.SIGHUP)
        wait_until(lambda: "flight.search" in listing(gw.url), 10)
        reloaded = wait_until(lambda: events(gw, "intent.dictionary_reloaded"), 10)
        assert (reloaded[-1]["entries"], reloaded[-1]["changed"]) == (4, True)
        good.write_text(BAD, encoding="utf-8")
        gw.popen.send_signal(signal.SIGHUP)
        refused = wait_until(lambda: events(gw, "intent.dictionary_refused"), 10)
        assert refused[-1]["line"] == BAD_LINE
        assert gw.popen.poll() is None  # still serving
        assert "flight.search" in listing(gw.url) and len(listing(gw.url)) == 4


# --- the commands ----------------------------------------------------------------------------


def test_intents_check_prints_the_entries_or_the_refusal_by_line(
    good: Path, tmp_path: Path
) -> None:
    done = cli("intents", "check", str(good))
    assert done.returncode == 0, done.stderr
    assert f"{good}: ok, 3 entries, 2 aliases, 1 deprecated" in done.stdout
    assert "weather.query" in done.stdout and "weather.lookup" in done.stdout
    as_json = cli("intents", "check", str(good), "--json")
    assert as_json.returncode == 0
    assert [e["tag"] for e in json.loads(as_json.stdout)["entries"]] == [
        "weather.query",
        "note.create",
        "weather.old",
    ]
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD, encoding="utf-8")
    done = cli("intents", "check", str(bad))
    assert done.returncode == 2, done.stdout
    assert f"{bad} line {BAD_LINE}:" in done.stderr and done.stdout == ""


def test_intents_list_and_match(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:
        agent = start_agent(gw.url, "agent://cli-weather", intents="weather.query")
        try:
            done = cli("intents", "--gateway", gw.url)
            assert done.returncode == 0, done.stderr
            assert "3 intents: 3 in the dictionary, mode warn" in done.stdout
            assert "weather.lookup" in done.stdout and "1/1" in done.stdout
            assert "deprecated -> weather.query" in done.stdout
            as_json = cli("intents", "list", "--gateway", gw.url, "--json")
            assert as_json.returncode == 0
            assert json.loads(as_json.stdout) == http("GET", f"{gw.url}/v1/intents")[1]

            done = cli(
                "intents", "match", "what is the weather in Chengdu tomorrow", "--gateway", gw.url
            )
            assert done.returncode == 0, done.stdout + done.stderr
            assert (
                "weather.query" in done.stdout and "would go to agent://cli-weather" in done.stdout
            )
            by_alias = cli(
                "intents", "match", "x", "--intent", "weather.lookup", "--gateway", gw.url
            )
            assert by_alias.returncode == 0, by_alias.stdout + by_alias.stderr
            assert "1.00  weather.query  (alias match)" in by_alias.stdout
            none = cli("intents", "match", "zzz qqq", "--gateway", gw.url, "--json")
            assert none.returncode == 1, none.stdout + none.stderr
            assert json.loads(none.stdout)["error"] == "no_capable_agent"
        finally:
            agent.stop()


def test_doctor_names_unknown_tags_with_the_nearest_known_ones(good: Path) -> None:
    with gateway("--intents", str(good), *MATCHER) as gw:
        agent = start_agent(gw.url, "agent://doc-w", intents="weather.query")
        try:
            status, body = http("POST", f"{gw.url}/v1/send", {"intent": "weather.forecast"})
            assert (status, body["error"]) == (404, "no_capable_agent"), body
            status, diag = http("GET", f"{gw.url}/v1/diagnostics")
            assert status == 200, diag
            (unrouted,) = diag["unrouted_intents"]
            assert unrouted["intent"] == "weather.forecast"
            assert "weather.query" in [s["tag"] for s in unrouted["suggestions"]], unrouted
            done = cli("doctor", "--gateway", gw.url)
            assert done.returncode == 4, done.stdout + done.stderr
            assert "weather.forecast" in done.stdout
            assert "nearest known tags" in done.stdout
            assert "weather.query (" in done.stdout
        finally:
            agent.stop()
