"""What the client commands print: pure functions from the client SDK's typed results to rich
renderables (for people) and to the contract's JSON (for scripts).

Nothing here does I/O, reads the clock or the environment: the time a table is drawn at comes
in as ``now``, so every renderer is a plain function of its arguments and is tested as one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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


def agents_table(agents: Sequence[AgentInfo], *, now: float) -> RenderableType:
    """The endpoints as a table: id, intents, status in colour, last seen, avg and p95 latency.

    ``now`` is unix seconds, the time "last seen" is counted back from.
    """
    if not agents:
        return Text("no agents")
    table = Table(title=f"{len(agents)} agent{'s' if len(agents) != 1 else ''}")
    table.add_column("endpoint", no_wrap=True)
    table.add_column("intents")
    table.add_column("status", no_wrap=True)
    table.add_column("last seen", justify="right", no_wrap=True)
    table.add_column("avg", justify="right", no_wrap=True)
    table.add_column("p95", justify="right", no_wrap=True)
    for agent in agents:
        table.add_row(
            agent.endpoint_id,
            ", ".join(agent.capabilities),
            status_text(agent.status),
            age(now - agent.last_seen_at),
            ms(agent.avg_latency_ms),
            ms(agent.p95_latency_ms),
        )
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


def _ts(event: Mapping[str, Any]) -> float | None:
    ts = event.get("ts")
    return float(ts) if isinstance(ts, int | float) else None


def _kind_text(event: Mapping[str, Any]) -> Text:
    kind = str(event.get("kind", "?"))
    if kind == "attempt":
        return Text(kind, style="green" if event.get("outcome") == "ok" else "red")
    if kind == "answer":
        return Text(kind, style="bold green" if event.get("ok") else "bold red")
    return Text(kind, style="cyan")


def trace_view(trace: Trace) -> RenderableType:
    """The hops of a request as a timeline: offset from the first event, kind, its fields."""
    stamps = [ts for ts in map(_ts, trace.events) if ts is not None]
    header = Text()
    header.append("trace ", style="dim")
    header.append(trace.trace_id, style="bold")
    if not stamps:
        header.append("  no events", style="dim")
        return header
    first = min(stamps)
    started = datetime.fromtimestamp(first, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    n = len(trace.events)
    header.append(f"  {n} event{'s' if n != 1 else ''} over {ms((max(stamps) - first) * 1000)}")
    header.append(f"  started {started} UTC", style="dim")
    rows = []
    for event in trace.events:
        ts = _ts(event)
        offset = "?" if ts is None else f"+{(ts - first) * 1000:.1f} ms"
        fields = " ".join(
            f"{key}={_value(value)}"
            for key, value in event.items()
            if key not in ("ts", "kind") and value is not None and value != ""
        )
        rows.append((offset, _kind_text(event), fields))
    # plain lines, not a table: no padding and no wrapping, so that a line can be copied or grepped
    offset_width = max(len(offset) for offset, _, _ in rows)
    kind_width = max(len(kind) for _, kind, _ in rows)
    lines = [header]
    for offset, kind, fields in rows:
        line = Text(offset.rjust(offset_width) + "  ")
        line.append_text(kind)
        line.append(" " * (kind_width - len(kind)) + "  " + fields)
        lines.append(line)
    return Group(*lines)


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
