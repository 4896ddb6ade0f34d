"""JSON log lines: the trace id comes from the context, and configuring touches nothing else."""

from __future__ import annotations

import io
import json
import logging
import time

from agent_reach.observability.logs import TRACE_ID, Throttle, configure, log


def test_configure_leaves_other_formatters_time_alone() -> None:
    before = logging.Formatter.converter
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("INFO", io.StringIO())
        assert logging.Formatter.converter is before is time.localtime
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_every_line_of_a_request_has_its_bound_trace_id() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("INFO", out)
        token = TRACE_ID.set("trace_abc")
        try:
            log(logging.INFO, "reach.completed", msg_id="m1")
        finally:
            TRACE_ID.reset(token)
        log(logging.INFO, "gateway.listening")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["event"], first["trace_id"], first["msg_id"]) == (
        "reach.completed",
        "trace_abc",
        "m1",
    )
    assert "trace_id" not in second
    assert abs(first["ts"] - time.time()) < 60


def test_the_throttle_holds_a_bounded_number_of_keys() -> None:
    # a library's message may be formatted per request: one key each must not grow forever
    now = [0.0]
    throttle = Throttle(monotonic=lambda: now[0])
    bound, batch = Throttle.max_keys, Throttle.max_keys // 16
    for n in range(bound):
        assert throttle.take(f"k{n}") == 0
    assert throttle.take("k0") is None  # within its second: held back, counted
    now[0] = 0.5
    assert throttle.take("new-1") == 0  # no key's second is over: the oldest sixteenth goes
    assert len(throttle.next_at) == bound - batch + 1
    assert "k0" not in throttle.next_at and not throttle.held  # k0 with them, its count too
    assert f"k{batch}" in throttle.next_at
    for n in range(batch - 1):  # the next pass is a sixteenth of the bound away
        throttle.take(f"j{n}")
    assert len(throttle.next_at) == bound
    now[0] = 2.0  # every key's second is over: all go for the next new one
    assert throttle.take("new-2") == 0
    assert set(throttle.next_at) == {"new-2"}
    assert throttle.take("new-2") is None  # and the throttle still throttles


def test_a_logged_value_cannot_split_its_line() -> None:
    """A caller's words logged as given, holding U+2028, U+2029 or U+0085 (msgspec leaves them
    unescaped, valid JSON), were line ends to ``str.splitlines()`` and other line readers: one
    line read as two broken ones (a token fuzz broke every later read of a test's log)."""
    out = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("INFO", out)
        log(logging.INFO, "audit.denied", who="a\u2028b\u2029c\x85d 城市")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    (line,) = out.getvalue().splitlines()
    assert json.loads(line)["who"] == "a\u2028b\u2029c\x85d 城市"
