"""The client commands' renderers: typed results in, plain text (and the contract's JSON) out."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from rich.console import Console, RenderableType

from agent_reach.cli import render
from agent_reach.errors import AllAttemptsFailed, GatewayUnavailable, NoCapableAgent
from agent_reach.sdk.client import (
    AgentInfo,
    Attempt,
    Candidate,
    Reply,
    RouteExplanation,
    Trace,
)
from agent_reach.wire.answers import MatchInfo

NOW = 1_700_000_000.0


def text(renderable: RenderableType, width: int = 200, *, soft_wrap: bool = False) -> str:
    """What a console without colours (a pipe) shows; ``soft_wrap`` as the CLI prints lines
    that must stay whole (JSON, the send summary, the timeline)."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False)
    console.print(renderable, soft_wrap=soft_wrap)
    return out.getvalue()


def agent(name: str, status: str = "healthy", **fields: Any) -> AgentInfo:
    return AgentInfo(
        endpoint_id=f"agent://{name}",
        capabilities=fields.pop("capabilities", ["test.echo"]),
        endpoint_url="http://127.0.0.1:9001/reach",
        status=status,
        last_seen_at=fields.pop("last_seen_at", NOW - 3.4),
        **fields,
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "-"), (0.0, "0.0 ms"), (12.34, "12.3 ms"), (2000, "2000.0 ms")],
)
def test_latency(value: float | None, shown: str) -> None:
    assert render.ms(value) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-2.0, "0 s ago"),
        (0.4, "0 s ago"),
        (3.9, "3 s ago"),
        (59.9, "59 s ago"),
        (60, "1 min ago"),
        (3599, "59 min ago"),
        (7200, "2 h ago"),
        (3 * 86400 + 5, "3 d ago"),
    ],
)
def test_age(seconds: float, shown: str) -> None:
    assert render.age(seconds) == shown


@pytest.mark.parametrize(
    ("status", "style"),
    [
        ("healthy", "green"),
        ("degraded", "yellow"),
        ("suspect", "magenta"),
        ("down", "red"),
        ("from_the_future", ""),
    ],
)
def test_status_colours(status: str, style: str) -> None:
    shown = render.status_text(status)
    assert (shown.plain, shown.style) == (status, style)


def test_filter_agents_by_intent_and_status_keeps_the_order() -> None:
    agents = [
        agent("a", capabilities=["x.one"]),
        agent("b", "down", capabilities=["x.one", "x.two"]),
        agent("c", "suspect", capabilities=["x.two"]),
    ]
    names = lambda found: [a.endpoint_id for a in found]  # noqa: E731
    assert names(render.filter_agents(agents)) == ["agent://a", "agent://b", "agent://c"]
    assert names(render.filter_agents(agents, intent="x.two")) == ["agent://b", "agent://c"]
    assert names(render.filter_agents(agents, intent="x")) == []  # whole tags only
    assert names(render.filter_agents(agents, statuses=["down", "suspect"])) == [
        "agent://b",
        "agent://c",
    ]
    assert names(render.filter_agents(agents, intent="x.one", statuses=["healthy"])) == [
        "agent://a"
    ]


def test_agents_table_rows() -> None:
    shown = text(
        render.agents_table(
            [
                agent(
                    "weather-01",
                    capabilities=["weather.query", "weather.forecast"],
                    avg_latency_ms=12.34,
                    p95_latency_ms=20.0,
                ),
                agent("notes-01", "down", last_seen_at=NOW - 125),
            ],
            now=NOW,
        )
    )
    rows = {line.split()[0]: line for line in shown.splitlines() if "agent://" in line}
    weather, notes = rows["agent://weather-01"], rows["agent://notes-01"]
    assert "weather.query, weather.forecast" in weather
    assert "healthy" in weather
    assert "3 s ago" in weather
    assert "12.3 ms" in weather
    assert "20.0 ms" in weather
    assert "down" in notes
    assert "2 min ago" in notes
    assert notes.count(" - ") == 2  # no latencies yet
    assert "2 agents" in shown


def test_no_agents() -> None:
    assert text(render.agents_table([], now=NOW)).strip() == "no agents"


LONG_TAGS = [
    "weather.query",
    "weather.forecast.hourly",
    "weather.forecast.daily",
    "weather.alerts.severe",
    "weather.radar.precipitation",
]
FLEET = [
    agent("weather-cn-01", capabilities=LONG_TAGS, avg_latency_ms=2.34, p95_latency_ms=4.0),
    agent("note-01", "suspect", capabilities=["note.create", "note.query"], last_seen_at=NOW - 125),
    agent("scheduler-01", capabilities=["schedule.plan"], avg_latency_ms=1500.2),
]


def words(shown: str) -> set[str]:
    """Every whitespace-separated word of the output, a trailing comma dropped."""
    return {word.rstrip(",") for word in shown.split()}


@pytest.mark.parametrize(
    ("width", "left_out"),
    [(120, []), (80, ["p95", "avg"]), (60, ["p95", "avg", "last seen"])],
)
def test_the_agents_table_keeps_every_tag_whole_at_any_width(
    width: int, left_out: list[str]
) -> None:
    shown = text(render.agents_table(FLEET, now=NOW, width=width), width=width)
    lines = shown.splitlines()
    assert set(LONG_TAGS) <= words(shown), shown  # each tag whole on a line: not cut, not folded
    assert "…" not in shown
    assert max(len(line.rstrip()) for line in lines) <= width
    header = next(line for line in lines if line.startswith("endpoint"))
    columns = ["status", "last seen", "avg", "p95"]
    assert [name for name in columns if name in header] == [
        name for name in columns if name not in left_out
    ]
    if left_out:  # a caption says what is missing and where to find it
        assert f"{', '.join(left_out)}: left out for room" in " ".join(shown.split())
        assert "--json" in shown
    else:
        assert "left out" not in shown
    for a in FLEET:  # each row still says its agent's status
        assert any(line.startswith(a.endpoint_id) and a.status in line for line in lines)


def test_the_agents_table_keeps_the_latencies_when_the_tags_are_short() -> None:
    shown = text(render.agents_table([agent("a", capabilities=["x.y"])], now=NOW, width=80))
    header = next(line for line in shown.splitlines() if line.startswith("endpoint"))
    assert header.split() == ["endpoint", "intents", "status", "last", "seen", "avg", "p95"]


def test_bodies_are_the_contract_shapes() -> None:
    reply = Reply(
        msg_id="m1",
        trace_id="t1",
        intent="test.echo",
        endpoint_id="agent://a",
        result={"city": "成都"},
        attempts=[Attempt("agent://a", "ok", 2.9)],
        latency_ms=3.4,
        match=MatchInfo("exact", "test.echo", 1.0),
    )
    body = render.reply_body(reply)
    assert list(body) == [
        "ok",
        "msg_id",
        "trace_id",
        "intent",
        "endpoint_id",
        "result",
        "attempts",
        "latency_ms",
        "match",
    ]
    assert body["match"] == {"method": "exact", "tag": "test.echo", "confidence": 1.0}
    assert body["ok"] is True
    assert body["attempts"] == [{"endpoint_id": "agent://a", "outcome": "ok", "latency_ms": 2.9}]
    assert '"成都"' in render.to_json(body)  # non-ASCII kept as is
    assert json.loads(render.to_json(body)) == body

    listing = render.agents_body([agent("a")])
    assert set(listing) == {"agents"}
    assert set(listing["agents"][0]) == {
        "endpoint_id",
        "capabilities",
        "endpoint_url",
        "description",
        "status",
        "last_seen_at",
        "avg_latency_ms",
        "p95_latency_ms",
    }
    assert listing["agents"][0]["avg_latency_ms"] is None

    route = render.route_body(RouteExplanation(intent="x.y", chosen=None, candidates=[]))
    assert route["ok"] is True
    assert {"intent", "chosen", "per_try_timeout_ms", "max_retries", "candidates"} <= set(route)

    trace = render.trace_body(Trace(trace_id="t1", events=[{"ts": 1.0, "kind": "received"}]))
    assert trace == {"trace_id": "t1", "events": [{"ts": 1.0, "kind": "received"}]}


def test_reply_view_shows_the_result_as_json_and_how_it_went() -> None:
    reply = Reply(
        msg_id="m1",
        trace_id="trace_abc",
        intent="test.echo",
        endpoint_id="agent://b",
        result={"city": "成都", "days": [1, 2]},
        attempts=[Attempt("agent://a", "timeout", 2000.04), Attempt("agent://b", "ok", 2.94)],
        latency_ms=2010.0,
    )
    lines = text(render.reply_view(reply), width=40, soft_wrap=True).splitlines()
    assert json.loads("\n".join(lines[:-1])) == {"city": "成都", "days": [1, 2]}
    assert lines[-1] == (
        "endpoint agent://b  attempts timeout 2000.0 ms (agent://a), ok 2.9 ms"
        "  total 2010.0 ms  trace trace_abc"
    )


def test_attempts_from_an_error_answer_are_plain_dicts() -> None:
    shown = render.attempts_text(
        [{"endpoint_id": "agent://a", "outcome": "connect_error", "latency_ms": 1.04}, {}]
    )
    assert shown.plain == "connect_error 1.0 ms (agent://a), ? - (?)"
    assert render.attempts_text([]).plain == "none"


def test_error_text_of_a_reach_error() -> None:
    exc = AllAttemptsFailed(
        "2 attempt(s) failed",
        msg_id="msg_1",
        trace_id="trace_1",
        attempts=[{"endpoint_id": "agent://a", "outcome": "server_error", "latency_ms": 5.0}],
        agent_status=500,
    )
    assert text(render.error_text(exc)).splitlines() == [
        "error all_attempts_failed: 2 attempt(s) failed",
        "trace    trace_1  (agent-reach trace trace_1)",
        "msg      msg_1",
        "attempts server_error 5.0 ms (agent://a)",
        "agent_status: 500",
    ]


def test_error_text_without_attempts_or_trace() -> None:
    shown = text(render.error_text(NoCapableAgent("no agent declares intent 'x.y'")))
    assert shown.strip() == "error no_capable_agent: no agent declares intent 'x.y'"
    down = text(render.error_text(GatewayUnavailable("cannot reach the gateway at http://h:1")))
    assert (
        down.splitlines()[0] == "error gateway_unavailable: cannot reach the gateway at http://h:1"
    )
    assert "AGENT_REACH_GATEWAY" in down


ROUTE = RouteExplanation(
    intent="weather.query",
    chosen="agent://a",
    per_try_timeout_ms=2000.0,
    max_retries=3,
    candidates=[
        Candidate("agent://a", "healthy", 1.0, True, "healthy", 3.0, 4.5, chosen=True),
        Candidate("agent://b", "suspect", 0.85, False, "suspect: no heartbeat for 25.0 s"),
    ],
)
ROW = re.compile(
    r"^(chosen)?\s+(\S+)\s+(\S+)\s+([\d.]+)\s+(-|[\d.]+ ms)\s+(-|[\d.]+ ms)\s+(yes|no)\s*(.*?)\s*$"
)


def route_rows(shown: str) -> dict[str, tuple[str, ...]]:
    """The candidates table's rows by endpoint id: (chosen, status, confidence, avg, p95,
    eligible, why)."""
    rows = {}
    for line in shown.splitlines():
        match = ROW.match(line)
        if match:
            chosen, endpoint_id, *cells = match.groups()
            rows[endpoint_id] = (chosen or "", *cells)
    return rows


def test_route_view_shows_choice_timeout_retries_and_why() -> None:
    shown = text(render.route_view(ROUTE, width=120), width=120)
    assert shown.splitlines()[0] == (
        "intent weather.query  chosen agent://a  per-try timeout 2000.0 ms  max retries 3"
    )
    assert route_rows(shown) == {
        "agent://a": ("chosen", "healthy", "1.00", "3.0 ms", "4.5 ms", "yes", "healthy"),
        "agent://b": ("", "suspect", "0.85", "-", "-", "no", "suspect: no heartbeat for 25.0 s"),
    }


def test_a_narrow_route_view_lists_the_reasons_under_the_table() -> None:
    shown = text(render.route_view(ROUTE, width=70), width=70)
    assert route_rows(shown) == {
        "agent://a": ("chosen", "healthy", "1.00", "3.0 ms", "4.5 ms", "yes", ""),
        "agent://b": ("", "suspect", "0.85", "-", "-", "no", ""),
    }
    assert shown.splitlines()[-3:] == [
        "why",
        "  agent://a: healthy",
        "  agent://b: suspect: no heartbeat for 25.0 s",
    ]


def test_route_view_with_nothing_chosen() -> None:
    route = RouteExplanation(intent="x.y", chosen=None, candidates=[])
    assert "no endpoint would be chosen" in text(render.route_view(route)).splitlines()[0]
