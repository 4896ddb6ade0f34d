"""The trace waterfall of ``agent-reach trace`` and of the demo: a trace's events
(``GET /v1/traces/ID``) put together into spans (:func:`trace_spans`), then drawn as rows
(:func:`trace_view`), one per request, route and attempt, each with its offset from the first
event, how long it took, a bar on the trace's time line and its place in the tree.

Invariants:

- pure: nothing here does I/O, reads the clock or the environment; a view is a function of the
  trace and the console's ``width``, and labels too long for that width are wrapped under their
  row (keeping the tree's guides), never cut;
- each event belongs to one span: its request's (by ``msg_id``, else as :func:`_owner` says),
  else a top-level span of its own;
- an onward request nests under the open attempt to its sender when it was received (the
  innermost one): an agent's onward reaches sit under the hop that reached it;
- the requests of one level are in time order, and what had not ended when the trace was read
  (an unanswered request, an attempt in flight) is drawn open, never as ended.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from agent_reach.cli.values import field_value, ms, outcome_text
from agent_reach.sdk.client import Trace

__all__ = ["Span", "trace_spans", "trace_view"]

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
        f"{key}={field_value(value)}"
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
            label.append_text(Text("  ").append_text(outcome_text(str(outcome))))
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
