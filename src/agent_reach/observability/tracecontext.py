"""W3C Trace Context (the ``traceparent`` header) and how it maps to the contract's ``trace_id``.

Pure and cheap: no I/O, no clock, no OpenTelemetry import; the gateway and the agent SDK use it
whether OpenTelemetry export is on or not (docs/observing.md, "Tracing").

Rules:

- :func:`parse_traceparent` reads ``VERSION-TRACEID-PARENTID-FLAGS`` (2, 32, 16 and 2 lower-case
  hex digits). Version ``00`` is exactly 55 characters; a later version is read by those four
  fields when what follows them starts with ``-``; version ``ff``, upper case, all-zero ids and
  wrong lengths are invalid. An invalid header is ignored (None), never an error.
- A request's contract ``trace_id`` is the body's when given, else the traceparent's trace-id
  (the 32 hex digits as they are), else a new ``trace_<32 hex>``.
- :func:`otel_trace_id` is the W3C trace-id of a contract ``trace_id``: its 32 hex digits when it
  is ``<32 hex>`` or ``trace_<32 hex>`` (so the gateway's own ids read the same in a tracing
  backend), else the first 32 hex digits of its SHA-256: deterministic, so every hop that carries
  the same ``trace_id`` lands in the same trace even where no ``traceparent`` travelled.
"""

from __future__ import annotations

import contextvars
import hashlib
import random
import re
from typing import NamedTuple

__all__ = [
    "SAMPLED",
    "TRACEPARENT",
    "TraceParent",
    "new_span_id",
    "onward",
    "otel_trace_id",
    "parse_traceparent",
]

SAMPLED = 0x01  # the only trace-flag of Trace Context level 1; others are zeroed when sent on
# version, trace-id, parent-id, flags; then the end, or (a later version) "-" and more
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:\Z|-)")
_HEX32 = re.compile(r"(?:trace_)?([0-9a-f]{32})\Z")
_ODD = frozenset("13579bdf")  # a flags byte whose last hex digit is odd has the sampled bit
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16

# The traceparent to put on reaches made now: set by the agent SDK while a handler runs (and
# around ctx.reach), read by ReachClient.send when it is not given one.
TRACEPARENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "traceparent", default=None
)


class TraceParent(NamedTuple):
    """A valid ``traceparent``: trace-id (32 hex), parent-id (16 hex) and trace-flags."""

    trace_id: str
    parent_id: str
    flags: int = SAMPLED

    @property
    def sampled(self) -> bool:
        """Whether the caller may have recorded its span (the ``sampled`` flag)."""
        return bool(self.flags & SAMPLED)

    @property
    def header(self) -> str:
        """The header value, in version ``00``."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags:02x}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The :class:`TraceParent` of a header value, or None when absent or invalid."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip(" \t"))  # optional whitespace around a value
    if match is None:
        return None
    version, trace_id, parent_id, flags = match.groups()
    if version == "ff" or (version == "00" and match.end() != 55):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id, parent_id, SAMPLED if flags[1] in _ODD else 0)


def otel_trace_id(trace_id: str) -> str:
    """The W3C trace-id (32 hex) of a contract ``trace_id`` (see the module docstring)."""
    match = _HEX32.match(trace_id)
    if match is not None and match.group(1) != _ZERO_TRACE:
        return match.group(1)
    return hashlib.sha256(trace_id.encode()).hexdigest()[:32]


def new_span_id() -> str:
    """A random, non-zero span id (16 hex), as OpenTelemetry's own id generator makes them."""
    return "%016x" % (random.getrandbits(64) or 1)  # faster than an f-string here


def onward(trace_id: str, received: TraceParent | None) -> str:
    """The traceparent header that a hop recording no span of its own sends on.

    The one it received (W3C: a hop that does not take part passes it through); without one,
    the trace-id of ``trace_id`` under a new parent-id, sampled, so that a traced agent
    downstream still records its spans.
    """
    if received is not None:
        return received.header
    return f"00-{otel_trace_id(trace_id)}-{new_span_id()}-01"
