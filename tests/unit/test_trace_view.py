"""The trace waterfall (agent-reach trace, the demo): a trace's events in, spans and text out."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console, RenderableType

from agent_reach.cli.trace_view import Span, trace_spans, trace_view
from agent_reach.sdk.client import Trace


def text(renderable: RenderableType, width: int = 200) -> str:
    """What a console without colours (a pipe) shows."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(renderable)
    return out.getvalue()


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


def outline(spans: list[Span], depth: int = 0) -> list[str]:
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
    assert outline(trace_spans(events)) == expected


def test_trace_spans_times() -> None:
    (outer,) = trace_spans(DEMO)
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
    shown = lines_of(trace_view(Trace("trace_demo", DEMO), width=80), 80)
    assert shown == DEMO_AT_80.splitlines()


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_trace_view_fits_the_width_and_keeps_the_tree(width: int) -> None:
    shown = lines_of(trace_view(Trace("trace_demo", DEMO), width=width), width)
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
    shown = lines_of(trace_view(Trace("trace_f", events), width=100), 100)
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
    shown = lines_of(trace_view(Trace("trace_i", events), width=100), 100)
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
    shown = lines_of(trace_view(Trace("trace_w", events), width=60), 60)
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
    shown = text(trace_view(one)).splitlines()
    assert shown[0].startswith("trace trace_1  1 request, 1 event over 0.0 ms  started ")
    assert shown[2].split() == ["+0.0", "ms", "-", "░", "x.y", "not", "answered", "yet"]


def test_trace_view_without_events() -> None:
    assert text(trace_view(Trace("trace_1", []))).strip() == "trace trace_1  no events"
