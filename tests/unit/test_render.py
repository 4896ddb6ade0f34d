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
    ]
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


# --- trace: the waterfall ----------------------------------------------------------------------

T0 = 1_764_507_527.678  # 2025-11-30 12:58:47.678 UTC
S, W, N, X = "agent://scheduler-01", "agent://weather-cn-01", "agent://note-01", "agent://wx-02"


def ev(at_ms: float, kind: str, **fields: Any) -> dict[str, Any]:
    """One trace event as the gateway writes it, ``at_ms`` after T0."""
    return {"ts": round(T0 + at_ms / 1000, 6), "kind": kind, **fields}


def received(at_ms: float, intent: str, sender: str | None = None, **fields: Any) -> dict[str, Any]:
    return ev(
        at_ms, "received", msg_id=fields.pop("msg_id", f"msg_{intent}"), intent=intent,
        sender=sender, recipient_hint=fields.pop("recipient_hint", None),
        priority=fields.pop("priority", "normal"), timeout_ms=8000, **fields,
    )  # fmt: skip


def route(at_ms: float, chosen: str, *candidates: str, **fields: Any) -> dict[str, Any]:
    healthy = [chosen, *candidates]
    return ev(
        at_ms, "route", chosen=chosen, per_try_timeout_ms=2000.0, max_retries=2,
        healthy=len(healthy), degraded=0, unavailable=fields.pop("unavailable", 0),
        candidates={"healthy": healthy, "degraded": []}, **fields,
    )  # fmt: skip


def attempt(
    end_ms: float, endpoint: str, took_ms: float, n: int = 1, outcome: str = "ok", **fields: Any
) -> dict[str, Any]:
    """An attempt as written when it ended: ``took_ms`` after it started."""
    return ev(
        end_ms, "attempt", attempt=n, endpoint_id=endpoint, outcome=outcome,
        status=fields.pop("status", 200 if outcome == "ok" else None), latency_ms=took_ms,
        detail=fields.pop("detail", ""), **fields,
    )  # fmt: skip


def hop(at_ms: float, endpoint: str, handle_ms: float, n: int = 1, **fields: Any) -> dict[str, Any]:
    answered_from = fields.pop("answered_from", "handler")
    return ev(
        at_ms, "agent", attempt=n, endpoint_id=endpoint, handle_ms=handle_ms,
        answered_from=answered_from, **fields,
    )  # fmt: skip


def ok(at_ms: float, endpoint: str, took_ms: float) -> dict[str, Any]:
    return ev(at_ms, "answer", ok=True, endpoint_id=endpoint, latency_ms=took_ms)


def refused(at_ms: float, code: str, detail: str, took_ms: float = 0.1) -> dict[str, Any]:
    return ev(at_ms, "answer", ok=False, error=code, detail=detail, latency_ms=took_ms)


def outline(spans: list[render.Span], depth: int = 0) -> list[str]:
    """The waterfall's tree, one line a span: its kind and what it is about, indented."""
    lines = []
    for span in spans:
        if span.kind == "request":  # its intent, and how it ended unless ok
            name, answer = span.event("received").get("intent"), span.event("answer")
            name += "" if answer.get("ok") else f" {answer.get('error', 'unanswered')}"
        elif span.kind == "attempt":  # its endpoint, outcome and latency
            tried = span.event("attempt")
            name = f"{tried.get('endpoint_id')} {tried.get('outcome', 'in flight')}"
            name += f" {tried['latency_ms']}" if "latency_ms" in tried else ""
        elif span.kind == "route":
            name = span.event("route").get("chosen")
        else:
            name = ""
        lines.append(f"{'  ' * depth}{span.kind} {name}".rstrip())
        lines.extend(outline(span.children, depth + 1))
    return lines


# the demo's scenario 4: the scheduler reaches the weather agent, then the note agent
DEMO = [
    received(0.0, "schedule.plan"),
    route(0.1, S),
    received(4.3, "weather.query", S),
    route(4.4, W, unavailable=1),
    attempt(7.0, W, 2.4),
    hop(7.0, W, 1.1),
    ok(7.0, W, 2.7),
    received(8.8, "note.create", S),
    route(8.9, N),
    attempt(11.3, N, 2.3),
    hop(11.3, N, 0.9),
    ok(11.3, N, 2.5),
    attempt(15.1, S, 14.8),
    hop(15.1, S, 13.9),
    ok(15.2, S, 15.2),
]
DEMO_OUTLINE = [
    "request schedule.plan",
    f"  route {S}",
    f"  attempt {S} ok 14.8",
    "    request weather.query",
    f"      route {W}",
    f"      attempt {W} ok 2.4",
    "    request note.create",
    f"      route {N}",
    f"      attempt {N} ok 2.3",
]

WATERFALLS = {
    "one request": (
        [
            received(0, "x.y"),
            route(0.1, W),
            attempt(2.0, W, 1.8),
            hop(2.0, W, 1.0),
            ok(2.1, W, 2.1),
        ],
        ["request x.y", f"  route {W}", f"  attempt {W} ok 1.8"],
    ),
    "onward reaches one after the other": (DEMO, DEMO_OUTLINE),
    # both onward reaches in flight at once (asyncio.gather in the handler): their events
    # interleave, and each goes to the request its route chose
    "onward reaches side by side": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            received(1.0, "weather.query", S),
            route(1.1, W),
            received(1.2, "note.create", S),
            route(1.3, N),
            # started closer to the note's route than to its own (a busy loop): its endpoint
            # says whose it is
            attempt(3.0, W, 1.65),
            ok(3.0, W, 2.0),
            attempt(4.0, N, 2.6),
            ok(4.0, N, 2.8),
            attempt(6.0, S, 5.8),
            ok(6.0, S, 6.0),
        ],
        [
            "request schedule.plan",
            f"  route {S}",
            f"  attempt {S} ok 5.8",
            "    request weather.query",
            f"      route {W}",
            f"      attempt {W} ok 1.65",
            "    request note.create",
            f"      route {N}",
            f"      attempt {N} ok 2.6",
        ],
    ),
    # two side by side to the same agent: an attempt belongs to the request whose route came
    # right before it started, not simply to the latest one
    "side by side to one agent": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            received(1.0, "weather.query", S, msg_id="m1"),
            route(1.1, W),
            received(3.0, "weather.forecast", S, msg_id="m2"),
            route(3.1, W),
            attempt(4.0, W, 2.8),
            ok(4.0, W, 3.0),
            attempt(9.0, W, 5.8),
            ok(9.0, W, 6.0),
            attempt(10.0, S, 9.8),
            ok(10.0, S, 10.0),
        ],
        [
            "request schedule.plan",
            f"  route {S}",
            f"  attempt {S} ok 9.8",
            "    request weather.query",
            f"      route {W}",
            f"      attempt {W} ok 2.8",
            "    request weather.forecast",
            f"      route {W}",
            f"      attempt {W} ok 5.8",
        ],
    ),
    # an agent reaching itself: the inner request nests under the outer attempt
    "an agent reaching itself": (
        [
            received(0, "relay.async"),
            route(0.1, S),
            received(1.0, "relay.sync", S),
            route(1.1, S),
            attempt(3.0, S, 1.8),
            ok(3.0, S, 2.0),
            attempt(4.0, S, 3.8),
            ok(4.0, S, 4.0),
        ],
        [
            "request relay.async",
            f"  route {S}",
            f"  attempt {S} ok 3.8",
            "    request relay.sync",
            f"      route {S}",
            f"      attempt {S} ok 1.8",
        ],
    ),
    # and twice deep: the innermost open attempt to the sender is the one
    "an agent reaching itself twice deep": (
        [
            received(0, "relay.async"),
            route(0.1, S),
            received(1.0, "relay.sync", S),
            route(1.1, S),
            received(2.0, "relay.again", S),
            route(2.1, S),
            attempt(3.0, S, 0.8),
            ok(3.0, S, 1.0),
            attempt(4.0, S, 2.8),
            ok(4.0, S, 3.0),
            attempt(5.0, S, 4.8),
            ok(5.0, S, 5.0),
        ],
        [
            "request relay.async",
            f"  route {S}",
            f"  attempt {S} ok 4.8",
            "    request relay.sync",
            f"      route {S}",
            f"      attempt {S} ok 2.8",
            "        request relay.again",
            f"          route {S}",
            f"          attempt {S} ok 0.8",
        ],
    ),
    # a failover: the onward reach was made by the agent of the second attempt
    "an onward reach after a failover": (
        [
            received(0, "schedule.plan"),
            route(0.1, X, S),
            attempt(2000.3, X, 2000.1, outcome="timeout"),
            received(2001.0, "weather.query", S),
            route(2001.1, W),
            attempt(2003.0, W, 1.8),
            ok(2003.0, W, 2.0),
            attempt(2004.0, S, 3.6, n=2),
            ok(2004.1, S, 2004.1),
        ],
        [
            "request schedule.plan",
            f"  route {X}",
            f"  attempt {X} timeout 2000.1",
            f"  attempt {S} ok 3.6",
            "    request weather.query",
            f"      route {W}",
            f"      attempt {W} ok 1.8",
        ],
    ),
    # an agent still reaching on after its attempt timed out: not inside any attempt
    "an onward reach after its attempt ended": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            attempt(2000.3, S, 2000.1, outcome="timeout"),
            refused(2000.4, "all_attempts_failed", "1 attempt(s) failed", 2000.4),
            received(2500.0, "weather.query", S),
            route(2500.1, W),
            attempt(2502.0, W, 1.8),
            ok(2502.0, W, 2.0),
        ],
        [
            "request schedule.plan all_attempts_failed",
            f"  route {S}",
            f"  attempt {S} timeout 2000.1",
            "request weather.query",
            f"  route {W}",
            f"  attempt {W} ok 1.8",
        ],
    ),
    # a request sent as the agent before any attempt reached it (its own, same trace id)
    "a request from the sender before its attempt began": (
        [
            received(0, "schedule.plan"),
            route(0.1, X, S),
            attempt(2000.3, X, 2000.1, outcome="timeout"),
            received(2100.0, "weather.query", S),
            route(2100.1, W),
            attempt(2102.0, W, 1.8),
            ok(2102.0, W, 2.0),
            attempt(2310.0, S, 10.0, n=2),
            ok(2310.0, S, 2310.0),
        ],
        [
            "request schedule.plan",
            f"  route {X}",
            f"  attempt {X} timeout 2000.1",
            f"  attempt {S} ok 10.0",
            "request weather.query",
            f"  route {W}",
            f"  attempt {W} ok 1.8",
        ],
    ),
    # an onward reach whose retry waited past its deadline while its siblings went on: each
    # answer is its own request's
    "a deadline after a retry's wait": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            received(1.0, "weather.query", S),
            route(1.1, W),
            attempt(2001.2, W, 2000.0, outcome="timeout"),
            # refused at once while the weather query waits for its retry
            received(2001.3, "nobody.here", S),
            refused(2001.4, "no_capable_agent", "no agent declares intent 'nobody.here'"),
            received(2001.5, "note.create", S),
            route(2001.6, N),
            refused(2002.0, "deadline_exceeded", "deadline of 2000 ms ran out", 2001.0),
            attempt(2003.0, N, 1.3),
            ok(2003.0, N, 1.5),
            attempt(2004.0, S, 2003.8),
            ok(2004.0, S, 2004.0),
        ],
        [
            "request schedule.plan",
            f"  route {S}",
            f"  attempt {S} ok 2003.8",
            "    request weather.query deadline_exceeded",
            f"      route {W}",
            f"      attempt {W} timeout 2000.0",
            "    request nobody.here no_capable_agent",
            "    request note.create",
            f"      route {N}",
            f"      attempt {N} ok 1.3",
        ],
    ),
    # read while the scheduler is still working: its attempt has no event yet
    "a trace read while in flight": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            received(4.3, "weather.query", S),
            route(4.4, W),
            attempt(7.0, W, 2.4),
            ok(7.0, W, 2.7),
        ],
        [
            "request schedule.plan unanswered",
            f"  route {S}",
            f"  attempt {S} in flight",
            "    request weather.query",
            f"      route {W}",
            f"      attempt {W} ok 2.4",
        ],
    ),
    # refused before routing (no route, no attempt), inside the scheduler's attempt
    "an onward reach refused": (
        [
            received(0, "schedule.plan"),
            route(0.1, S),
            received(1.0, "nobody.here", S),
            refused(1.1, "no_capable_agent", "no agent declares intent 'nobody.here'"),
            attempt(3.0, S, 2.8, outcome="agent_error", status=424),
            refused(3.1, "agent_error", "x"),
        ],
        [
            "request schedule.plan agent_error",
            f"  route {S}",
            f"  attempt {S} agent_error 2.8",
            "    request nobody.here no_capable_agent",
        ],
    ),
    # the same trace id used again later by another caller: two trees
    "a trace id used twice": (
        [
            received(0, "x.y"),
            route(0.1, W),
            attempt(2.0, W, 1.8),
            ok(2.0, W, 2.0),
            received(50.0, "x.y", msg_id="m2"),
            route(50.1, W),
            attempt(52.0, W, 1.8),
            ok(52.0, W, 2.0),
        ],
        [
            "request x.y",
            f"  route {W}",
            f"  attempt {W} ok 1.8",
            "request x.y",
            f"  route {W}",
            f"  attempt {W} ok 1.8",
        ],
    ),
    # events that name their request (msg_id) go to it, whatever the order suggests
    "events that carry their msg_id": (
        [
            received(0, "a.one", msg_id="m1"),
            received(0.05, "b.two", msg_id="m2"),
            route(0.1, W, msg_id="m1"),
            route(0.2, N, msg_id="m2"),
            attempt(2.0, N, 1.7, msg_id="m2"),
            attempt(2.1, W, 1.9, msg_id="m1"),
            ok(2.2, W, 2.2) | {"msg_id": "m1"},
            ok(2.3, N, 2.3) | {"msg_id": "m2"},
        ],
        [
            "request a.one",
            f"  route {W}",
            f"  attempt {W} ok 1.9",
            "request b.two",
            f"  route {N}",
            f"  attempt {N} ok 1.7",
        ],
    ),
    # a kind this CLI does not know, and events without a stamp, are kept, not fatal
    "unknown kinds and missing stamps": (
        [
            received(0, "x.y"),
            {"kind": "route", "chosen": W},
            ev(1.0, "queued", depth=3),
            attempt(2.0, W, 1.0),
            ok(2.1, W, 2.1),
            ev(5.0, "audit", who="ops"),
        ],
        ["request x.y", f"  route {W}", "  queued", f"  attempt {W} ok 1.0", "audit"],
    ),
}


@pytest.mark.parametrize(("events", "expected"), WATERFALLS.values(), ids=WATERFALLS.keys())
def test_trace_spans_nest_onward_reaches_under_the_attempt_that_made_them(
    events: list[dict[str, Any]], expected: list[str]
) -> None:
    assert outline(render.trace_spans(events)) == expected


def test_trace_spans_times() -> None:
    (outer,) = render.trace_spans(DEMO)
    assert (outer.start, outer.end) == (DEMO[0]["ts"], DEMO[-1]["ts"])
    _, scheduler = outer.children
    # an attempt starts its latency before its event
    assert scheduler.start == pytest.approx(DEMO[-3]["ts"] - 0.0148)
    assert scheduler.end == DEMO[-3]["ts"]
    assert scheduler.event("agent")["handle_ms"] == 13.9
    weather, note = scheduler.children
    assert scheduler.start < weather.start < weather.end < note.start < note.end < scheduler.end


# what `agent-reach trace` shows of the demo's trace in an 80-column terminal
DEMO_AT_80 = """\
trace trace_demo  3 requests, 15 events over 15.2 ms
started 2025-11-30 12:58:47.678 UTC
     at     took  0     15.2 ms  hop
+0.0 ms  15.2 ms  █████████████  schedule.plan  ok
+0.1 ms           ·              ├ route  1 healthy
+0.3 ms  14.8 ms  █████████████  └ agent://scheduler-01  ok  handler 13.9 ms
+4.3 ms   2.7 ms     ███           ├ weather.query  ok
+4.4 ms              ·             │ ├ route  1 healthy, 1 unavailable
+4.6 ms   2.4 ms     ███           │ └ agent://weather-cn-01  ok  handler 1.1 ms
+8.8 ms   2.5 ms         ███       └ note.create  ok
+8.9 ms                  ·           ├ route  1 healthy
+9.0 ms   2.3 ms         ███         └ agent://note-01  ok  handler 0.9 ms
"""


def lines_of(renderable: RenderableType, width: int) -> list[str]:
    return [line.rstrip() for line in text(renderable, width=width).splitlines()]


def test_trace_view_of_the_demo_at_80_columns() -> None:
    shown = lines_of(render.trace_view(Trace("trace_demo", DEMO), width=80), 80)
    assert shown == DEMO_AT_80.splitlines()


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_trace_view_fits_the_width_and_keeps_the_tree(width: int) -> None:
    shown = lines_of(render.trace_view(Trace("trace_demo", DEMO), width=width), width)
    assert max(map(len, shown)) <= width
    hops = " ".join(shown)
    for name in ("schedule.plan", "weather.query", "note.create", S, W, N):
        assert name in hops
    # nesting: each onward request is indented deeper than the attempt that made it
    column = {
        name: next(line.index(name) for line in shown if name in line)
        for name in ("schedule.plan", f"{S}  ok", "weather.query", f"{W}  ok")
    }
    assert (
        column["schedule.plan"] < column[f"{S}  ok"] < column["weather.query"] < column[f"{W}  ok"]
    )
    bars = [line for line in shown if "█" in line]
    assert (len(bars) == 6) is (width >= 80)  # no bars when too narrow for them


def test_trace_view_shows_failures_their_detail_and_retries() -> None:
    events = [
        received(0, "schedule.plan", "agent://cli"),
        route(0.1, X, S),
        attempt(2000.3, X, 2000.1, outcome="timeout", detail="no answer within 2000 ms"),
        attempt(2004.0, S, 3.6, n=2),
        hop(2004.0, S, 0.4, n=2, answered_from="cached"),
        ok(2004.1, S, 2004.1),
        received(3000.0, "nobody.here"),
        refused(3000.1, "no_capable_agent", "no agent declares intent 'nobody.here'"),
    ]
    shown = lines_of(render.trace_view(Trace("trace_f", events), width=100), 100)
    assert shown[0].startswith("trace trace_f  2 requests, 8 events over 3000.1 ms  started ")
    assert shown[2].endswith("schedule.plan  ok  from agent://cli")  # who sent it
    timeout = next(line for line in shown if f"{X}  timeout" in line)
    assert timeout.split()[:4] == ["+0.2", "ms", "2000.1", "ms"]
    assert timeout.endswith("try 1")
    assert next(line for line in shown if f"{S}  ok" in line).endswith(
        "try 2  answered from memory"
    )
    detail = shown.index(timeout) + 1
    assert shown[detail].endswith("│   no answer within 2000 ms")
    assert shown[-2].endswith("nobody.here  no_capable_agent")
    assert shown[-1].strip() == "no agent declares intent 'nobody.here'"


def test_trace_view_of_a_request_in_flight() -> None:
    events = [received(0, "schedule.plan"), route(0.1, S), received(4.3, "weather.query", S)]
    shown = lines_of(render.trace_view(Trace("trace_i", events), width=100), 100)
    assert shown[2].endswith("schedule.plan  not answered yet")
    assert shown[2].split()[2] == "-"  # no duration yet
    assert shown[4].endswith(f"└ {S}  in flight")
    assert "░" in shown[4]
    assert shown[5].endswith("└ weather.query  not answered yet")


def test_trace_view_wraps_long_labels_under_their_row() -> None:
    events = [
        received(0, "schedule.plan", "agent://a-caller-with-a-rather-long-name-01"),
        refused(0.1, "no_capable_agent", "no agent declares intent 'schedule.plan' " * 3),
    ]
    shown = lines_of(render.trace_view(Trace("trace_w", events), width=60), 60)
    assert max(map(len, shown)) <= 60
    row = next(i for i, line in enumerate(shown) if line.startswith("+0.0 ms"))
    assert shown[row].endswith("  schedule.plan  no_capable_agent")  # broken between parts
    hop = shown[row].index("schedule.plan")
    assert all(line[:hop].strip() == "" for line in shown[row + 1 :])  # the rest under it
    assert "".join(line.strip() for line in shown[row + 1 : row + 4]) == (
        "fromagent://a-caller-with-a-rather-long-name-01"
    )
    assert (
        " ".join(shown[row + 4 :]).split()
        == ("no agent declares intent 'schedule.plan' " * 3).split()
    )


def test_trace_view_of_one_event() -> None:
    one = Trace("trace_1", [{"ts": 5.0, "kind": "received", "intent": "x.y"}])
    shown = text(render.trace_view(one)).splitlines()
    assert shown[0].startswith("trace trace_1  1 request, 1 event over 0.0 ms  started ")
    assert shown[2].split() == ["+0.0", "ms", "-", "░", "x.y", "not", "answered", "yet"]


def test_trace_view_without_events() -> None:
    assert text(render.trace_view(Trace("trace_1", []))).strip() == "trace trace_1  no events"
