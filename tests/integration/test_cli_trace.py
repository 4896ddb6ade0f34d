"""`agent-reach trace` of an agent-to-agent request, on real processes: the demo's scheduler
reaches the weather and note agents under its own trace id, and the waterfall shows those two
requests nested under the attempt that reached the scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support import ROOT, Proc, _start, gateway, http

TRACE_ID = "trace_cli_waterfall"
SCHEDULER, WEATHER, NOTE = "agent://scheduler-01", "agent://weather-cn-01", "agent://note-01"


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        agents: list[Proc] = []
        try:
            for name in ("weather", "note", "scheduler"):  # each registered once started
                agents.append(
                    _start(
                        [sys.executable, "-m", f"agent_reach.demo.{name}", "--gateway", proc.url]
                    )
                )
            yield proc
        finally:
            for agent in agents:
                agent.stop()


def trace(gw: Proc, *flags: str) -> subprocess.CompletedProcess[str]:
    """``agent-reach trace TRACE_ID`` in an 80-column terminal (a pipe: no colours)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", "trace", TRACE_ID, "--gateway", gw.url, *flags],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**env, "COLUMNS": "80"},
        check=False,
    )


def test_onward_reaches_nest_under_the_attempt_that_made_them(gw: Proc) -> None:
    code, body = http(
        "POST",
        f"{gw.url}/v1/send",
        {
            "intent": "schedule.plan",
            "payload": {"task": "visit the panda base", "city": "成都", "date": "2025-01-02"},
            "trace_id": TRACE_ID,
        },
    )
    assert code == 200, body
    assert body["result"]["hops"] == [WEATHER, NOTE]
    run = trace(gw)
    assert (run.returncode, run.stderr) == (0, "")
    lines = run.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[0].startswith(f"trace {TRACE_ID}  3 requests, ")

    def find(text: str) -> tuple[int, int]:
        """(row, column) of the only line that shows ``text``."""
        [(row, line)] = [(i, line) for i, line in enumerate(lines) if text in line]
        return row, line.index(text)

    plan, scheduler = find("schedule.plan  ok"), find(f"{SCHEDULER}  ok")
    weather, weather_hop = find("weather.query  ok"), find(f"{WEATHER}  ok")
    note, note_hop = find("note.create  ok"), find(f"{NOTE}  ok")
    # top to bottom: the scheduler's attempt, then each onward request and its own attempt
    rows = [plan, scheduler, weather, weather_hop, note, note_hop]
    assert [row for row, _ in rows] == sorted(row for row, _ in rows)
    # left to right: each level of the tree one step deeper
    assert plan[1] < scheduler[1] < weather[1] == note[1] < weather_hop[1] == note_hop[1]
    assert lines[weather[0]][weather[1] - 2 : weather[1]] == "├ "
    assert lines[note[0]][note[1] - 2 : note[1]] == "└ "  # the last of the two onward reaches

    def bar(row: int) -> tuple[int, int]:
        """Where the row's bar starts and ends."""
        line = lines[row]
        return line.index("█"), line.rindex("█")

    # the onward requests happen within the scheduler's attempt, one after the other
    outer = bar(scheduler[0])
    assert outer[0] <= bar(weather[0])[0] <= bar(weather[0])[1] <= bar(note[0])[0]
    assert bar(note[0])[1] <= outer[1]

    machine = trace(gw, "--json")  # the gateway's answer as it is
    assert (machine.returncode, machine.stderr) == (0, "")
    answer = http("GET", f"{gw.url}/v1/traces/{TRACE_ID}")[1]
    assert json.loads(machine.stdout) == answer
    senders = [e.get("sender") for e in answer["events"] if e["kind"] == "received"]
    assert senders == [None, SCHEDULER, SCHEDULER]
