"""JSON log lines: the trace id comes from the context, and configuring touches nothing else."""

from __future__ import annotations

import io
import json
import logging
import time

from agent_reach.observability.logs import TRACE_ID, configure, log


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
