"""JSON log lines, one event each, with the request's trace id bound through contextvars.

Libraries only call :func:`log`; the entry point calls :func:`configure` once.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["TRACE_ID", "Throttle", "configure", "log", "logger"]

TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("trace_id", default=None)
logger = logging.getLogger("agent_reach")
_encode = msgspec.json.Encoder().encode
_LINE_ENDS = (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085"))


def log(level: int, event: str, *, exc_info: bool | BaseException = False, **data: Any) -> None:
    """Log ``event`` with ``data`` as keys; the bound trace id is added when there is one.
    ``exc_info``: True for the exception being handled, or an exception."""
    if logger.isEnabledFor(level):
        logger.log(level, event, exc_info=exc_info, extra={"data": data})


class Throttle:
    """At most one log line per ``every_s`` for each key (an event name); counts what it
    holds back, for the next line's ``suppressed``. A cheap guard against a flood of lines
    that any client can cause (malformed HTTP, refused sessions, a full connection table).
    At most ``max_keys`` keys are held (a library's message may be formatted per request): past
    it, those whose second is over are dropped, and all of them if none is."""

    max_keys = 1024

    def __init__(
        self, every_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s, self.monotonic = every_s, monotonic
        self.next_at: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def take(self, key: str) -> int | None:
        """The count held back for ``key`` since its last line when a line may go now, else
        None (and one more is counted)."""
        now = self.monotonic()
        next_at = self.next_at
        if now < next_at.get(key, 0.0):
            self.held[key] = self.held.get(key, 0) + 1
            return None
        if key not in next_at and len(next_at) >= self.max_keys:
            self._make_room(now)
        next_at[key] = now + self.every_s
        return self.held.pop(key, 0)

    def _make_room(self, now: float) -> None:
        # the keys whose second is over, and the oldest others up to a sixteenth of the bound
        # (so that the next pass is that many new keys away, not one)
        over = [k for k, at in self.next_at.items() if at <= now]
        if len(over) < self.max_keys // 16:
            gone = set(over)
            over += [k for k in self.next_at if k not in gone][: self.max_keys // 16 - len(over)]
        for k in over:
            del self.next_at[k]
            self.held.pop(k, None)

    def log(
        self, level: int, event: str, *, exc_info: bool | BaseException = False, **data: Any
    ) -> None:
        """:func:`log` ``event`` with ``suppressed`` when a line may go now."""
        held = self.take(event)
        if held is not None:
            log(level, event, exc_info=exc_info, suppressed=held, **data)


class _LibraryThrottle(logging.Filter):
    """Lets through at most one line a second of each message of the libraries named (their
    loggers' records, by logger and message template): the ``mcp`` SDK logs a line for every
    session a client opens, ends or is refused, which any client can repeat at will."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.throttle = Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        return self.throttle.take(f"{record.name}:{record.msg}") is not None


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
        text = _encode(line).decode()
        if not text.isascii():
            # what msgspec leaves unescaped but str.splitlines() and other line readers take
            # for line ends (a caller's words, logged as given, would split the line)
            for char, escaped in _LINE_ENDS:
                text = text.replace(char, escaped)
        return text


def configure(level: str = "INFO", stream: Any = None) -> None:
    """Send every ``agent_reach`` and aiohttp log line to ``stream`` (stderr) as JSON.

    The ``mcp`` SDK's lines are kept to WARNING and above unless ``level`` is DEBUG (its INFO
    lines are one per session opened or ended), and each of its messages to one a second."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_LibraryThrottle("mcp"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        logging.getLogger("mcp").setLevel(logging.WARNING)
