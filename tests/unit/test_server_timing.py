"""The agent's hop report: the ``Server-Timing`` header the agent SDK sends, as the gateway
reads it (and the SDK's side of it)."""

from __future__ import annotations

import pytest

from agent_reach.sdk._delivery import Answer
from agent_reach.transport.base import server_timing


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, (None, "")),
        ("", (None, "")),
        ("handle;dur=12.5", (12.5, "")),
        ('handle;dur=3;desc="cached"', (3.0, "cached")),
        ('db;dur=1, handle;dur=7.25;desc="joined"', (7.25, "joined")),
        ("db;dur=1", (None, "")),  # other metrics only
        ("handle", (None, "")),  # no duration
        ("handle;dur=abc", (None, "")),
        ("handle;dur=nan", (None, "")),
        ("handle;dur=-1", (None, "")),
        ("handle;dur=1e12", (None, "")),
        ('handle;dur=1;desc="' + "x" * 100 + '"', (1.0, "x" * 32)),  # bounded
    ],
)
def test_the_gateway_reads_the_handle_metric_only(
    header: str | None, expected: tuple[float | None, str]
) -> None:
    assert server_timing(header) == expected


def test_the_sdk_writes_what_the_gateway_reads() -> None:
    assert Answer(200, b"{}").server_timing() is None  # not a handler's answer
    for answer in (Answer(200, b"{}", 4.5), Answer(200, b"{}", 4.5, "cached")):
        header = answer.server_timing()
        assert server_timing(header) == (4.5, answer.reused)
