"""JSON log lines, one event each, with the request's trace id bound through contextvars.

Libraries only call :func:`log`; the entry point calls :func:`configure` once.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Any

import msgspec

__all__ = ["TRACE_ID", "configure", "log", "logger"]

TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)
logger = logging.getLogger("agent_reach")
_encode = msgspec.json.Encoder().encode


def log(level: int, event: str, *, exc_info: bool = False, **data: Any) -> None:
    """Log ``event`` with ``data`` as keys; the bound trace id is added when there is one."""
    if logger.isEnabledFor(level):
        logger.log(level, event, exc_info=exc_info, extra={"data": data})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, event, trace_id (when bound) and the event's data.

    ``ts`` is the record's own unix time: no time conversion is configured anywhere, so the
    formatters of other libraries in the process keep theirs."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        trace_id = TRACE_ID.get()
        if trace_id is not None:
            line["trace_id"] = trace_id
        data = getattr(record, "data", None)
        if data:
            line.update(data)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _encode(line).decode()


def configure(level: str = "INFO", stream: Any = None) -> None:
    """Send every ``agent_reach`` and aiohttp log line to ``stream`` (stderr) as JSON."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
