"""What the client commands print, but for the trace waterfall: pure functions from the client
SDK's typed results to rich renderables (for people) and to the contract's JSON (for scripts).
It draws the agents table, a send's reply and an error, the route dry run and the doctor's
findings, and makes every command's ``--json`` body.

Invariants: nothing here does I/O, reads the clock or the environment: the time a table is
drawn at comes in as ``now`` and the console's width as ``width``, so every renderer is a plain
function of its arguments and is tested as one. The ``--json`` bodies have the contract's
shapes, keys in its order.

The trace waterfall is :mod:`agent_reach.cli.trace_view`, and how one value reads (latency,
age, status) is :mod:`agent_reach.cli.values`; their names the commands use are imported here
too, so that a command reaches all of its output through this one module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from rich import box
from rich.console import Group, RenderableType
from rich.json import JSON
from rich.table import Table
from rich.text import Text

from agent_reach.cli.trace_view import trace_view
from agent_reach.cli.values import (
    STATUS_STYLES,
    STATUSES,
    age,
    field_value,
    ms,
    outcome_text,
    status_text,
)
from agent_reach.doctor import Finding, Severity, worst
from agent_reach.errors import AgentReachError, GatewayUnavailable, ReachError
from agent_reach.sdk.client import AgentInfo, Attempt, Reply, RouteExplanation, Trace
from agent_reach.wire.answers import MatchInfo

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

# error fields shown on lines of their own (the rest are listed generically)
_REACH_FIELDS = ("msg_id", "trace_id", "attempts")


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
        out.append_text(outcome_text(outcome))
        out.append(f" {ms(latency)}")
        if target != endpoint_id:
            out.append(f" ({target})")
    return out


def reply_view(reply: Reply) -> RenderableType:
    """A successful send: the result as indented JSON, then one line saying how it went."""
    line = Text()
    line.append("endpoint ", style="dim")
    line.append(reply.endpoint_id, style="bold")
    if reply.match is not None and reply.match.method != "exact":
        line.append("  match ", style="dim")
        line.append(match_label(reply.match))
    line.append("  attempts ", style="dim")
    line.append_text(attempts_text(reply.attempts, reply.endpoint_id))
    line.append("  total ", style="dim")
    line.append(ms(reply.latency_ms))
    line.append("  trace ", style="dim")
    line.append(reply.trace_id)
    return Group(JSON.from_data(reply.result, indent=2), line)


def match_label(match: MatchInfo) -> str:
    """``semantic weather.query 0.93``: how a request's tag was found."""
    return f"{match.method} {match.tag} {match.confidence:.2f}"


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
        if key == "suggestions" and isinstance(value, list) and value:
            near = ", ".join(
                f"{item.get('tag')} {item.get('confidence', 0):.2f}"
                for item in value
                if isinstance(item, dict)
            )
            out.append("nearest  ", style="dim")
            out.append(f"{near}\n")
            continue
        out.append(f"{key}: ", style="dim")
        out.append(f"{field_value(value)}\n")
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
    if route.match is not None and route.match.method != "exact":
        summary.append("  match ", style="dim")
        summary.append(match_label(route.match))
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
