"""What the client commands print: pure functions from the client SDK's typed results to rich
renderables (for people) and to the contract's JSON (for scripts).

Nothing here does I/O, reads the clock or the environment: the time a table is drawn at comes
in as ``now``, so every renderer is a plain function of its arguments and is tested as one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from rich import box
from rich.console import Group, RenderableType
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from agent_reach.doctor import Finding, Severity, worst
from agent_reach.errors import AgentReachError, GatewayUnavailable, ReachError
from agent_reach.sdk.client import AgentInfo, Attempt, Reply, RouteExplanation, Trace

__all__ = [
    "STATUSES",
    "STATUS_STYLES",
    "age",
    "agents_body",
    "agents_table",
    "attempts_text",
    "error_text",
    "filter_agents",
    "findings_body",
    "findings_view",
    "ms",
    "reply_body",
    "reply_view",
    "route_body",
    "route_view",
    "status_text",
    "to_json",
    "trace_body",
    "trace_view",
]

STATUS_STYLES = {"healthy": "green", "degraded": "yellow", "suspect": "magenta", "down": "red"}
STATUSES = tuple(STATUS_STYLES)
# error fields shown on lines of their own (the rest are listed generically)
_REACH_FIELDS = ("msg_id", "trace_id", "attempts")


# --- small values ------------------------------------------------------------------------------


def ms(value: float | None) -> str:
    """A latency for people: ``12.3 ms``, or ``-`` when there is none yet."""
    return "-" if value is None else f"{value:.1f} ms"


def age(seconds: float) -> str:
    """How long ago, for people: ``3 s ago``, ``5 min ago``, ``2 h ago``, ``4 d ago``.

    Negative ages (a gateway clock slightly ahead of ours) read as ``0 s ago``.
    """
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    if s < 86400:
        return f"{s // 3600} h ago"
    return f"{s // 86400} d ago"


def status_text(status: str) -> Text:
    """An endpoint status in its colour (healthy green ... down red; unknown ones plain)."""
    return Text(status, style=STATUS_STYLES.get(status, ""))


def _outcome_text(outcome: str) -> Text:
    return Text(outcome, style="green" if outcome == "ok" else "red")


def _value(value: Any) -> str:
    """A field value in a line of text: strings as they are, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# --- machine output ----------------------------------------------------------------------------


def to_json(body: Any) -> str:
    """The text ``--json`` prints: indented JSON, non-ASCII kept as is."""
    return json.dumps(body, ensure_ascii=False, indent=2)


def agents_body(agents: Iterable[AgentInfo]) -> dict[str, Any]:
    """``GET /v1/agents``'s answer for these agents."""
    return {"agents": [msgspec.to_builtins(agent) for agent in agents]}


def reply_body(reply: Reply) -> dict[str, Any]:
    """``POST /v1/send``'s success answer."""
    body: dict[str, Any] = msgspec.to_builtins(reply)
    return {"ok": True, **body}


def route_body(route: RouteExplanation) -> dict[str, Any]:
    """``GET /v1/route``'s answer."""
    body: dict[str, Any] = msgspec.to_builtins(route)
    return {"ok": True, **body}


def trace_body(trace: Trace) -> dict[str, Any]:
    """``GET /v1/traces/TRACE_ID``'s answer."""
    body: dict[str, Any] = msgspec.to_builtins(trace)
    return body


# --- agents ------------------------------------------------------------------------------------


def filter_agents(
    agents: Iterable[AgentInfo], *, intent: str | None = None, statuses: Sequence[str] = ()
) -> list[AgentInfo]:
    """The agents that declare ``intent`` exactly (when given) and have one of ``statuses``
    (when any are given), in the gateway's order."""
    return [
        agent
        for agent in agents
        if (intent is None or intent in agent.capabilities)
        and (not statuses or agent.status in statuses)
    ]


# the columns ``agents`` leaves out, in this order, when the intents need the room
_OPTIONAL_AGENT_COLUMNS = ("p95", "avg", "last seen")


def agents_table(agents: Sequence[AgentInfo], *, now: float, width: int = 120) -> RenderableType:
    """The endpoints as a table: id, intents, status in colour, last seen, avg and p95 latency.

    ``now`` is unix seconds, the time "last seen" is counted back from. ``width`` is the
    console's: the intents wrap between tags, never inside one; when even the longest tag would
    not fit whole, p95, then avg, then "last seen" are left out (a caption says so).
    """
    if not agents:
        return Text("no agents")
    columns: dict[str, list[Text]] = {
        "endpoint": [Text(agent.endpoint_id) for agent in agents],
        "status": [status_text(agent.status) for agent in agents],
        "last seen": [Text(age(now - agent.last_seen_at)) for agent in agents],
        "avg": [Text(ms(agent.avg_latency_ms)) for agent in agents],
        "p95": [Text(ms(agent.p95_latency_ms)) for agent in agents],
    }
    # the narrowest intents column that keeps every tag whole (its comma included)
    tag_width = max(
        [len("intents"), *(len(tag) + 1 for agent in agents for tag in agent.capabilities)]
    )

    def room(names: Sequence[str]) -> int:  # what is left for the intents besides these columns
        # each column: its widest cell and a space of padding, then a space between columns
        cells = sum(max([len(name), *(cell.cell_len for cell in columns[name])]) for name in names)
        return width - cells - 2 * len(names) - 1

    shown = list(columns)
    dropped: list[str] = []
    for name in _OPTIONAL_AGENT_COLUMNS:
        if room(shown) >= tag_width:
            break
        shown.remove(name)
        dropped.append(name)
    n = len(agents)
    table = Table(
        title=f"{n} agent{'s' if n != 1 else ''}",
        caption=f"{', '.join(dropped)}: left out for room (a wider terminal or --json shows them)"
        if dropped
        else None,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    for name in ("endpoint", "intents", *shown[1:]):
        if name == "intents":
            # fold, never an ellipsis: a tag is only ever split when not even one fits
            table.add_column(name, min_width=max(8, min(tag_width, room(shown))), overflow="fold")
        else:
            right = name in ("last seen", "avg", "p95")
            table.add_column(name, justify="right" if right else "left", no_wrap=True)
    for i, agent in enumerate(agents):
        cells = [columns[name][i] for name in shown]
        table.add_row(cells[0], Text(", ".join(agent.capabilities)), *cells[1:])
    return table


# --- send --------------------------------------------------------------------------------------


def _attempt_fields(attempt: Attempt | Mapping[str, Any]) -> tuple[str, str, float | None]:
    if isinstance(attempt, Attempt):
        return attempt.endpoint_id, attempt.outcome, attempt.latency_ms
    latency = attempt.get("latency_ms")
    return (
        str(attempt.get("endpoint_id", "?")),
        str(attempt.get("outcome", "?")),
        float(latency) if isinstance(latency, int | float) else None,
    )


def attempts_text(
    attempts: Sequence[Attempt | Mapping[str, Any]], endpoint_id: str | None = None
) -> Text:
    """The attempts on one line: ``timeout 2000.1 ms (agent://a), ok 2.9 ms``.

    An attempt's endpoint is named when it is not ``endpoint_id`` (the one that answered).
    """
    if not attempts:
        return Text("none")
    out = Text()
    for i, attempt in enumerate(attempts):
        target, outcome, latency = _attempt_fields(attempt)
        if i:
            out.append(", ")
        out.append_text(_outcome_text(outcome))
        out.append(f" {ms(latency)}")
        if target != endpoint_id:
            out.append(f" ({target})")
    return out


def reply_view(reply: Reply) -> RenderableType:
    """A successful send: the result as indented JSON, then one line saying how it went."""
    line = Text()
    line.append("endpoint ", style="dim")
    line.append(reply.endpoint_id, style="bold")
    line.append("  attempts ", style="dim")
    line.append_text(attempts_text(reply.attempts, reply.endpoint_id))
    line.append("  total ", style="dim")
    line.append(ms(reply.latency_ms))
    line.append("  trace ", style="dim")
    line.append(reply.trace_id)
    return Group(JSON.from_data(reply.result, indent=2), line)


def error_text(exc: AgentReachError) -> Text:
    """An error for people (stderr): code and detail, trace id and attempts, other fields."""
    out = Text()
    out.append("error ", style="bold red")
    out.append(exc.code, style="bold red")
    out.append(f": {exc.detail}\n")
    # a send's answer carries its ids whatever the error (a 403 of token mode too)
    trace_id, msg_id = exc.fields.get("trace_id"), exc.fields.get("msg_id")
    attempts = exc.fields.get("attempts")
    if isinstance(trace_id, str) and trace_id:
        out.append("trace    ", style="dim")
        out.append(trace_id)
        out.append(f"  (agent-reach trace {trace_id})\n", style="dim")
    if isinstance(msg_id, str) and msg_id:
        out.append("msg      ", style="dim")
        out.append(f"{msg_id}\n")
    if isinstance(attempts, list) and (attempts or isinstance(exc, ReachError)):
        out.append("attempts ", style="dim")
        out.append_text(attempts_text(attempts))
        out.append("\n")
    for key, value in exc.fields.items():
        if key in _REACH_FIELDS:
            continue
        out.append(f"{key}: ", style="dim")
        out.append(f"{_value(value)}\n")
    if isinstance(exc, GatewayUnavailable):
        out.append("is the gateway running there? (--gateway URL or AGENT_REACH_GATEWAY)\n")
    out.rstrip()
    return out


# --- route -------------------------------------------------------------------------------------


# the narrowest "why" column worth having; below it the reasons go under the table
_MIN_WHY_WIDTH = 32


def route_view(route: RouteExplanation, *, width: int = 120) -> RenderableType:
    """The dry run: a summary line (chosen, per-try timeout, retries) and the candidates table
    (status, confidence, latencies, eligible or not and why).

    ``width`` is the console's: when the table leaves too little room for the reasons, they are
    listed under it, one line per candidate, instead of in a squeezed column.
    """
    summary = Text()
    summary.append("intent ", style="dim")
    summary.append(route.intent, style="bold")
    if route.chosen is None:
        summary.append("  no endpoint would be chosen", style="red")
    else:
        summary.append("  chosen ", style="dim")
        summary.append(route.chosen, style="bold green")
        summary.append("  per-try timeout ", style="dim")
        summary.append(ms(route.per_try_timeout_ms))
        summary.append("  max retries ", style="dim")
        summary.append(str(route.max_retries))
    headers = ("", "candidate", "status", "confidence", "avg", "p95", "eligible")
    rows = [
        (
            Text("chosen", style="bold green")
            if c.chosen or c.endpoint_id == route.chosen
            else Text(""),
            Text(c.endpoint_id),
            status_text(c.status),
            Text(f"{c.confidence:.2f}"),
            Text(ms(c.avg_latency_ms)),
            Text(ms(c.p95_latency_ms)),
            Text("yes", style="green") if c.eligible else Text("no", style="red"),
        )
        for c in route.candidates
    ]
    used = sum(
        max([len(header), *(row[i].cell_len for row in rows)]) + 1
        for i, header in enumerate(headers)
    )
    inline = width - used >= _MIN_WHY_WIDTH
    # no vertical rules: the reasons are prose and get the room
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    for header in headers:
        numeric = header in ("confidence", "avg", "p95")
        table.add_column(header, justify="right" if numeric else "left", no_wrap=True)
    if inline:
        table.add_column("why", overflow="fold")
    for row, c in zip(rows, route.candidates, strict=True):
        table.add_row(*row, *((c.reason,) if inline else ()))
    if inline or not route.candidates:
        return Group(summary, table)
    reasons = [Text("why", style="bold")]
    for c in route.candidates:
        line = Text("  ")
        line.append(c.endpoint_id)
        line.append(f": {c.reason}")
        reasons.append(line)
    return Group(summary, table, *reasons)


# --- trace -------------------------------------------------------------------------------------


# clock slack when an onward request is fitted into the time of an attempt (wall-clock stamps,
# latencies measured on the monotonic clock, both rounded to the microsecond)
_SLACK_S = 0.001
# the narrowest hop column worth drawing bars next to
_MIN_HOP_WIDTH = 32


@dataclass(eq=False)
class Span:
    """One bar of a trace's waterfall (:func:`trace_spans`).

    ``kind`` is ``request`` (one send the gateway handled: its ``received`` and ``answer``
    events), ``route`` (an instant), ``attempt`` (one delivery; its ``agent`` event too) or the
    kind of an event not known here (an instant). ``start`` and ``end`` are unix seconds;
    ``end`` is None for an instant and for what had not ended when the trace was read (an
    attempt still open has a made-up ``attempt`` event without outcome). ``children``: a
    request's route and attempts, an attempt's onward requests (those its agent made while it
    was open), in time order.
    """

    kind: str
    start: float
    end: float | None = None
    events: list[Mapping[str, Any]] = field(default_factory=list)
    children: list[Span] = field(default_factory=list)

    def event(self, kind: str) -> Mapping[str, Any]:
        """Its first event of ``kind`` (empty when it has none)."""
        return next((e for e in self.events if e.get("kind") == kind), {})


@dataclass(eq=False)
class _Request:
    """A request being put together from the events, in the order the gateway wrote them."""

    span: Span
    index: int  # where its received event is
    touched: int  # where its latest event is
    ready: float  # when its latest route or attempt event was written
    route: Mapping[str, Any] | None = None
    attempts: list[Span] = field(default_factory=list)
    answered: bool = False

    def last_attempt(self) -> Mapping[str, Any]:
        return self.attempts[-1].event("attempt") if self.attempts else {}

    def take(self, kind: str, event: Mapping[str, Any], ts: float, index: int) -> None:
        self.touched = index
        if kind == "route":
            self.route, self.ready = event, ts
            self.span.children.append(Span("route", ts, events=[event]))
        elif kind == "attempt":
            latency = event.get("latency_ms")
            took = float(latency) / 1000.0 if isinstance(latency, int | float) else 0.0
            attempt = Span("attempt", ts - took, ts, [event])
            self.attempts.append(attempt)
            self.span.children.append(attempt)
            self.ready = ts
        elif kind == "agent" and self.attempts:
            self.attempts[-1].events.append(event)
        elif kind == "answer":
            self.span.events.append(event)
            self.span.end, self.answered = ts, True
        else:
            self.span.children.append(Span(kind, ts, events=[event]))


def _owner(
    kind: str, event: Mapping[str, Any], ts: float, index: int, open_: list[_Request]
) -> _Request | None:
    """The open request an event (other than ``received``) belongs to.

    The events carry no request id but the trace's, so this goes by what the gateway writes
    without awaiting in between: a route right after its received event, an agent event right
    after its attempt, an answer right after its last attempt (or after its received event when
    refused while planning; a deadline that ran out during a retry's wait is the one answer
    written later). An attempt's start (its stamp less its latency) comes right after its
    request's route or previous attempt, and a first attempt goes to the chosen endpoint.
    """
    endpoint = event.get("endpoint_id")
    if kind == "route":
        found = [r for r in open_ if r.route is None and not r.attempts]
        return max(found, key=lambda r: r.index, default=None)
    if kind == "attempt":
        n = event.get("attempt")
        routed = [r for r in open_ if r.route is not None]
        found = [r for r in routed if not isinstance(n, int) or len(r.attempts) == n - 1]
        latency = event.get("latency_ms")
        start = ts - (float(latency) / 1000.0 if isinstance(latency, int | float) else 0.0)

        def fit(r: _Request) -> tuple[bool, float, int]:
            # a first attempt goes to the chosen endpoint; a retry's target is not recorded
            aimed = bool(r.attempts) or r.route is None or r.route.get("chosen") == endpoint
            return (not aimed, abs(start - r.ready), -r.index)

        return min(found or routed, key=fit, default=None)
    if kind == "agent":
        found = [
            r
            for r in open_
            if r.attempts
            and not r.attempts[-1].event("agent")
            and r.last_attempt().get("attempt") == event.get("attempt")
            and r.last_attempt().get("endpoint_id") == endpoint
        ]
    elif kind == "answer" and event.get("ok") is True:
        found = [
            r
            for r in open_
            if r.last_attempt().get("outcome") == "ok"
            and (endpoint is None or r.last_attempt().get("endpoint_id") == endpoint)
        ]
    elif kind == "answer":
        found = [r for r in open_ if r.last_attempt().get("outcome") != "ok"]
    else:
        found = []

    def rank(r: _Request) -> tuple[bool, bool, int]:
        # a request refused while planning, answered right after its received event; else one
        # whose attempt failed (the event before, or the answer of a retry's wait that ran past
        # the deadline); else the one written to last
        return (r.touched == index - 1 and r.route is None, bool(r.attempts), r.touched)

    return max(found or open_, key=rank, default=None)


def trace_spans(events: Sequence[Mapping[str, Any]]) -> list[Span]:
    """The waterfall of a trace's events (``GET /v1/traces/ID``): its top-level spans.

    Each ``received`` event opens a request; its route, attempts and answer are found as
    :func:`_owner` says (by ``msg_id`` when an event carries one). A request whose ``sender``
    is endpoint X and that was received while an attempt to X was open (or not yet ended) nests
    under that attempt, the innermost such one: the onward reach of an agent's handler. The
    others (and events no request owns) are top-level, in time order. Events without a stamp
    take the one before theirs.
    """
    requests: list[_Request] = []
    by_msg: dict[str, _Request] = {}
    top: list[Span] = []
    ts = 0.0
    for index, event in enumerate(events):
        stamp = _ts(event)
        ts = ts if stamp is None else stamp
        kind = str(event.get("kind", "?"))
        msg_id = event.get("msg_id")
        if kind == "received":
            request = _Request(Span("request", ts, events=[event]), index, index, ts)
            requests.append(request)
            if isinstance(msg_id, str):
                by_msg.setdefault(msg_id, request)
            continue
        open_ = [r for r in requests if not r.answered]
        owner = by_msg.get(msg_id) if isinstance(msg_id, str) else None
        owner = owner or _owner(kind, event, ts, index, open_)
        if owner is None:
            top.append(Span(kind, ts, events=[event]))
        else:
            owner.take(kind, event, ts, index)

    # the attempts an onward request can nest under, with their endpoint; an attempt not yet
    # written (its request routed, unanswered) is open to its target, or to any candidate after
    # a failed attempt, and is shown only if a request nests under it
    windows: list[tuple[_Request, Span, set[str]]] = []
    for request in requests:
        for attempt in request.attempts:
            endpoint = attempt.event("attempt").get("endpoint_id")
            windows.append((request, attempt, {endpoint} if isinstance(endpoint, str) else set()))
        if request.route is not None and not request.answered:
            route = request.route
            targets = {route.get("chosen")}
            if request.attempts:
                tiers = route.get("candidates")
                if isinstance(tiers, Mapping):
                    targets |= {e for ids in tiers.values() if isinstance(ids, list) for e in ids}
                targets |= {a.event("attempt").get("endpoint_id") for a in request.attempts}
            shown = route.get("chosen") if not request.attempts else None
            made_up = {
                "kind": "attempt",
                "attempt": len(request.attempts) + 1,
                "endpoint_id": shown,
            }
            pending = Span("attempt", request.ready, None, [made_up])
            windows.append((request, pending, {t for t in targets if isinstance(t, str)}))
    for request in requests:
        sender, at = request.span.event("received").get("sender"), request.span.start
        fits = [
            (attempt.start, outer.index, outer, attempt)
            for outer, attempt, endpoints in windows
            if outer.index < request.index
            and sender in endpoints
            and attempt.start - _SLACK_S <= at
            and (attempt.end is None or at <= attempt.end + _SLACK_S)
        ]
        if not fits:
            top.append(request.span)
            continue
        *_, outer, attempt = max(fits, key=lambda fit: fit[:2])
        if attempt.end is None and attempt not in outer.span.children:
            outer.span.children.append(attempt)
        attempt.children.append(request.span)
    for request in requests:
        request.span.children.sort(key=lambda span: span.start)
    return sorted(top, key=lambda span: span.start)


def _ts(event: Mapping[str, Any]) -> float | None:
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) else None


def _fields_text(event: Mapping[str, Any]) -> str:
    return " ".join(
        f"{key}={_value(value)}"
        for key, value in event.items()
        if key not in ("ts", "kind") and value is not None and value != ""
    )


def _span_label(span: Span, *, nested: bool, tries: int) -> tuple[Text, list[str]]:
    """What a span's row says, and the lines of detail under it."""
    label, notes = Text(), []
    if span.kind == "request":
        received, answer = span.event("received"), span.event("answer")
        label.append(str(received.get("intent", "?")), style="bold")
        if not answer:
            label.append("  not answered yet", style="yellow")
        elif answer.get("ok"):
            label.append("  ok", style="green")
        else:
            label.append(f"  {answer.get('error', 'error')}", style="red")
            if answer.get("detail"):
                notes.append(str(answer["detail"]))
        sender, hint = received.get("sender"), received.get("recipient_hint")
        if sender and not nested:
            label.append(f"  from {sender}", style="dim")
        if hint:
            label.append(f"  to {hint}", style="dim")
        if received.get("priority") not in (None, "normal"):
            label.append(f"  priority {received['priority']}", style="dim")
    elif span.kind == "route":
        route = span.events[0]
        tiers = [
            f"{route[tier]} {tier}"
            for tier in ("healthy", "degraded", "unavailable")
            if isinstance(route.get(tier), int) and route[tier]
        ]
        label.append("route", style="cyan")
        if tiers:
            label.append("  " + ", ".join(tiers))
        elif route.get("recipient_hint"):
            label.append(f"  recipient hint {route['recipient_hint']}")
    elif span.kind == "attempt":
        attempt, agent = span.event("attempt"), span.event("agent")
        label.append(str(attempt.get("endpoint_id") or "?"))
        outcome, status = attempt.get("outcome"), attempt.get("status")
        if span.end is None:
            label.append("  in flight", style="yellow")
        else:
            label.append_text(Text("  ").append_text(_outcome_text(str(outcome))))
            if isinstance(status, int) and status != 200:
                label.append(f" {status}", style="red")
            if outcome != "ok" and attempt.get("detail"):
                notes.append(str(attempt["detail"]))
        n = attempt.get("attempt")
        if tries > 1 or (isinstance(n, int) and n > 1):
            label.append(f"  try {n}", style="dim")
        answered_from, handle_ms = agent.get("answered_from"), agent.get("handle_ms")
        if answered_from == "cached":
            label.append("  answered from memory", style="dim")
        elif isinstance(handle_ms, int | float):
            label.append(f"  handler {ms(handle_ms)}", style="dim")
    else:
        label.append(span.kind, style="cyan")
        fields = _fields_text(span.events[0]) if span.events else ""
        if fields:
            label.append(f"  {fields}")
    return label, notes


def _walk(
    spans: Sequence[Span], guide: str = "", *, nested: bool = False
) -> Iterator[tuple[Span, str, Text, str, list[str]]]:
    """Each span in tree order: the span, the tree guide of its row, its label, the guide of
    the lines under its row (detail, wrapped label), and its lines of detail."""
    tries = sum(1 for span in spans if span.kind == "attempt")
    for i, span in enumerate(spans):
        last = i == len(spans) - 1
        head = guide + ("" if not nested else "└ " if last else "├ ")
        below = guide + ("" if not nested else "  " if last else "│ ")
        label, notes = _span_label(span, nested=nested or span.kind != "request", tries=tries)
        yield span, head, label, below + ("│ " if span.children else "  "), notes
        yield from _walk(span.children, below, nested=True)


def _wrap(text: Text, first: int, rest: int) -> list[Text]:
    """``text`` in lines of at most ``first`` cells, then ``rest``: broken between its parts
    (two spaces) where they fit, else at a space (a word longer than its line is folded)."""
    plain, start = text.plain, 0
    lines: list[Text] = []
    while len(plain) - start > (width := max(8, rest if lines else first)):
        cut = plain.rfind("  ", start, start + width + 1)
        if cut <= start:
            cut = plain.rfind(" ", start, start + width + 1)
        if cut <= start:
            cut = start + width
        line = text[start:cut]
        line.rstrip()
        lines.append(line)
        start = cut
        while start < len(plain) and plain[start] == " ":
            start += 1
    if start < len(plain) or not lines:
        lines.append(text[start:])
    return lines


def _bar(span: Span, first: float, total: float, width: int) -> Text:
    """The span's place in the trace's time, ``width`` characters for ``total`` seconds."""
    scale = width / total if total > 0 else 0.0
    left = min(width - 1, int((span.start - first) * scale))
    if span.kind not in ("request", "attempt"):
        return Text(" " * left + "·" + " " * (width - left - 1), style="cyan")
    end = first + total if span.end is None else span.end
    right = max(left + 1, min(width, math.ceil((end - first) * scale - 1e-9)))
    if span.end is None:
        style, mark = "yellow", "░"
    elif span.kind == "request":
        style, mark = ("green" if span.event("answer").get("ok") else "red"), "█"
    else:
        style, mark = ("green" if span.event("attempt").get("outcome") == "ok" else "red"), "█"
    out = Text(" " * left)
    out.append(mark * (right - left), style=style)
    out.append(" " * (width - right))
    return out


def _took(span: Span) -> str:
    if span.kind == "request":
        latency = span.event("answer").get("latency_ms")
        if isinstance(latency, int | float):
            return ms(latency)
    elif span.kind == "attempt":
        latency = span.event("attempt").get("latency_ms")
        if isinstance(latency, int | float):
            return ms(latency)
    else:
        return ""
    return "-" if span.end is None else ms((span.end - span.start) * 1000)


def trace_view(trace: Trace, *, width: int = 120) -> RenderableType:
    """The hops of a request as a waterfall: one row per request, route and attempt, onward
    requests nested under the attempt whose agent made them (:func:`trace_spans`), each with
    its offset from the first event, how long it took and a bar on the trace's time line.

    ``width`` is the console's: the bars take what the labels leave, 12 to 48 columns (none in
    a terminal too narrow for them); labels too long for their line are wrapped under it.
    """
    stamps = [ts for ts in map(_ts, trace.events) if ts is not None]
    header = Text()
    header.append("trace ", style="dim")
    header.append(trace.trace_id, style="bold")
    if not stamps:
        header.append("  no events", style="dim")
        return header
    spans = trace_spans(trace.events)
    rows = list(_walk(spans))
    first = min(stamps)
    last = max([*stamps, *(span.end for span, *_ in rows if span.end is not None)])
    total = last - first
    requests = sum(1 for span, *_ in rows if span.kind == "request")
    n = len(trace.events)
    started = datetime.fromtimestamp(first, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    header.append(
        f"  {requests} request{'s' if requests != 1 else ''}, {n} event{'s' if n != 1 else ''}"
        f" over {ms(total * 1000)}"
    )
    header.append(f"  started {started} UTC", style="dim")
    at = [f"+{(span.start - first) * 1000:.1f} ms" for span, *_ in rows]
    took = [_took(span) for span, *_ in rows]
    # the columns before the hops' and their gaps (of 2), with the bars' and without
    fixed = max(map(len, at)) + 2 + max(len("took"), *map(len, took)) + 2
    longest = max(len(head) + label.cell_len for _, head, label, _, _ in rows)
    # the bars take what the labels leave (12 to 48 columns); none when the labels would
    # have too little room next to the narrowest
    bar_width = max(12, min(48, width - fixed - 2 - longest))
    room = width - fixed - 2 - bar_width
    if room < _MIN_HOP_WIDTH:
        bar_width, room = 0, width - fixed
    at_width, took_width = max(map(len, at)), max(len("took"), *map(len, took))

    def line(offset: str, duration: str, bar: Text | str, hop: Text) -> Text:
        # plain lines rather than a table: nothing padded after the text, no wrapping of ours
        out = Text(f"{offset:>{at_width}}  {duration:>{took_width}}  ")
        if bar_width:
            out.append_text(Text(bar) if isinstance(bar, str) else bar).append("  ")
        out.append_text(hop)
        out.rstrip()
        return out

    blank = " " * bar_width
    scale = "0" + ms(total * 1000).rjust(bar_width - 1) if bar_width else ""
    lines = [line("at", "took", Text(scale, style="dim"), Text("hop", style="dim"))]
    lines[0].stylize("dim")
    for (span, head, label, guide, notes), offset, duration in zip(rows, at, took, strict=True):
        # labels too long are wrapped here, so that each of their lines keeps the tree's guides
        first_line, *more = _wrap(label, room - len(head), room - len(guide) - 2)
        bar = _bar(span, first, total, bar_width) if bar_width else ""
        lines.append(line(offset, duration, bar, Text(head).append_text(first_line)))
        for part in more:
            lines.append(line("", "", blank, Text(guide + "  ").append_text(part)))
        for note in notes:
            for part in _wrap(Text(note, style="dim"), room - len(guide), room - len(guide)):
                lines.append(line("", "", blank, Text(guide).append_text(part)))
    return Group(*_wrap(header, width, width), *lines)


# --- doctor ------------------------------------------------------------------------------------

_SEVERITY_STYLES = {
    Severity.OK: ("ok", "green"),
    Severity.INFO: ("info", "cyan"),
    Severity.WARNING: ("warn", "yellow"),
    Severity.ERROR: ("FAIL", "bold red"),
}


def findings_body(findings: Sequence[Finding]) -> dict[str, Any]:
    """``doctor --json``: ``ok`` is false when any finding is a warning or an error."""
    bad = worst(findings).rank >= Severity.WARNING.rank
    return {
        "ok": not bad,
        "worst": worst(findings).value,
        "findings": [
            {
                "check": f.check,
                "severity": f.severity.value,
                "subject": f.subject,
                "title": f.title,
                "evidence": list(f.evidence),
                "next_step": f.next_step,
            }
            for f in findings
        ],
    }


def findings_view(findings: Sequence[Finding], *, verbose: bool = False) -> RenderableType:
    """Each finding: a severity mark and title, its evidence and next step (ok ones: one line,
    unless ``verbose``); then a summary line."""
    parts: list[RenderableType] = []
    for f in findings:
        label, style = _SEVERITY_STYLES[f.severity]
        head = Text.assemble((f"[{label:>4}] ", style), (f.check, "bold"), " ", f.title)
        parts.append(head)
        if f.severity is Severity.OK and not verbose:
            continue
        for line in f.evidence:
            parts.append(Text(f"         - {line}"))
        if f.next_step:
            parts.append(Text.assemble("         next: ", (f.next_step, "italic")))
    counts = {sev: sum(1 for f in findings if f.severity is sev) for sev in Severity}
    summary = ", ".join(f"{n} {sev.value}" for sev, n in counts.items() if n)
    parts.append(Text(""))
    parts.append(
        Text(f"doctor: {summary or 'nothing to check'}", style=_SEVERITY_STYLES[worst(findings)][1])
    )
    return Group(*parts)
