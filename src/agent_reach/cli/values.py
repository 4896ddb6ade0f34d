"""How one value reads in the client commands' output: a latency, an age, an endpoint status,
an attempt's outcome, an event's field. Shared by the tables (:mod:`agent_reach.cli.render`) and
the trace waterfall (:mod:`agent_reach.cli.trace_view`), so that a value looks the same in both.

Invariants: pure functions of their arguments (no I/O, no clock, no environment); a missing
latency reads ``-``, never ``0``; statuses and outcomes get the same colour wherever shown.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

__all__ = [
    "STATUSES",
    "STATUS_STYLES",
    "age",
    "field_value",
    "ms",
    "outcome_text",
    "status_text",
]

STATUS_STYLES = {"healthy": "green", "degraded": "yellow", "suspect": "magenta", "down": "red"}
STATUSES = tuple(STATUS_STYLES)


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


def outcome_text(outcome: str) -> Text:
    """An attempt's outcome: ``ok`` in green, any other (``timeout``, ``error``...) in red."""
    return Text(outcome, style="green" if outcome == "ok" else "red")


def field_value(value: Any) -> str:
    """A field value in a line of text: strings as they are, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
