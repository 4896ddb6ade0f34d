"""W3C traceparent parsing, the trace_id <-> trace-id mapping, and the OTEL_* switch."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.observability import otel
from agent_reach.observability.tracecontext import (
    SAMPLED,
    TraceParent,
    new_span_id,
    onward,
    otel_trace_id,
    parse_traceparent,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_header_is_read_field_by_field() -> None:
    tp = parse_traceparent(VALID)
    assert tp == TraceParent(TRACE, SPAN, SAMPLED)
    assert tp.sampled
    assert tp.header == VALID


def test_an_unsampled_header_keeps_its_flag() -> None:
    tp = parse_traceparent(f"00-{TRACE}-{SPAN}-00")
    assert tp is not None
    assert not tp.sampled
    assert tp.header.endswith("-00")


def test_flags_other_than_sampled_are_zeroed_when_sent_on() -> None:
    tp = parse_traceparent(f"00-{TRACE}-{SPAN}-ff")
    assert tp is not None
    assert tp.header == f"00-{TRACE}-{SPAN}-01"


@pytest.mark.parametrize(
    "value",
    [
        f"01-{TRACE}-{SPAN}-01",  # a later version, exactly the four fields
        f"cc-{TRACE}-{SPAN}-01-what-the-future-adds",  # a later version with more fields
    ],
)
def test_later_versions_are_read_by_their_first_four_fields(value: str) -> None:
    assert parse_traceparent(value) == TraceParent(TRACE, SPAN, SAMPLED)


def test_whitespace_around_the_value_is_allowed() -> None:
    assert parse_traceparent(f" {VALID}\t") == TraceParent(TRACE, SPAN, SAMPLED)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 is exactly 55 characters
        f"01-{TRACE}-{SPAN}-01extra",  # a later version: more only after a "-"
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace-id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent-id
        f"00-{TRACE[:-1]}-{SPAN}-01",  # trace-id too short
        f"00-{TRACE}0-{SPAN}-01",  # trace-id too long
        f"00-{TRACE}-{SPAN[:-1]}-01",  # parent-id too short
        f"00-{TRACE}-{SPAN}0-01",  # parent-id too long
        f"00-{TRACE}-{SPAN}-1",  # flags too short
        f"0-{TRACE}-{SPAN}-01",  # version too short
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case
        f"00-{TRACE}-{SPAN.upper()}-01",
        f"0A-{TRACE}-{SPAN}-01",
        f"00_{TRACE}_{SPAN}_01",  # wrong separators
        f"00-{TRACE[:-1]}g-{SPAN}-01",  # not hex
        f"00-{TRACE}-{SPAN}-0g",
        f"xx-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-01,00-{TRACE}-{SPAN}-01",  # two headers folded into one
    ],
)
def test_invalid_headers_are_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


@given(st.text(max_size=80))
def test_parsing_never_raises(value: str) -> None:
    tp = parse_traceparent(value)
    if tp is not None:  # whatever is accepted is sent on in the version-00 form, valid again
        assert parse_traceparent(tp.header) == tp


@given(
    st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
    st.from_regex(r"[0-9a-f]{16}", fullmatch=True),
    st.integers(0, 255),
)
def test_every_well_formed_header_round_trips(trace: str, span: str, flags: int) -> None:
    value = f"00-{trace}-{span}-{flags:02x}"
    tp = parse_traceparent(value)
    if trace == "0" * 32 or span == "0" * 16:
        assert tp is None
    else:
        assert tp == TraceParent(trace, span, flags & SAMPLED)


# --- the contract's trace_id and the W3C trace-id --------------------------------------------


@pytest.mark.parametrize(
    ("trace_id", "expected"),
    [
        (TRACE, TRACE),  # a bare trace-id: itself (what a traceparent-derived trace_id is)
        (f"trace_{TRACE}", TRACE),  # the gateway's own ids: their hex part
    ],
)
def test_hex_trace_ids_map_to_themselves(trace_id: str, expected: str) -> None:
    assert otel_trace_id(trace_id) == expected


@pytest.mark.parametrize(
    "trace_id",
    [
        "trace_20250101_001",  # the contract's example
        "trace_5f0c1a2b3c4d5e6f",  # the client SDK's ids: 16 hex digits
        TRACE.upper(),
        "0" * 32,
        f"trace_{'0' * 32}",
        f"span_{TRACE}",
        "成都",
    ],
)
def test_other_trace_ids_map_to_their_sha256(trace_id: str) -> None:
    expected = hashlib.sha256(trace_id.encode()).hexdigest()[:32]
    assert otel_trace_id(trace_id) == expected
    assert otel_trace_id(trace_id) == otel_trace_id(trace_id)  # deterministic


@given(st.text(min_size=1, max_size=128))
def test_every_trace_id_maps_to_a_valid_trace_id(trace_id: str) -> None:
    mapped = otel_trace_id(trace_id)
    assert parse_traceparent(f"00-{mapped}-{SPAN}-01") is not None


def test_a_hop_that_records_nothing_passes_the_received_header_on() -> None:
    received = TraceParent(TRACE, SPAN, 0)
    assert onward("trace_other", received) == f"00-{TRACE}-{SPAN}-00"


def test_without_a_header_the_trace_id_decides_the_trace() -> None:
    first = parse_traceparent(onward("trace_20250101_001", None))
    second = parse_traceparent(onward("trace_20250101_001", None))
    assert first is not None and second is not None
    assert first.trace_id == second.trace_id == otel_trace_id("trace_20250101_001")
    assert first.parent_id != second.parent_id  # a fresh parent-id each time
    assert first.sampled


def test_span_ids_are_16_hex_and_never_zero() -> None:
    ids = {new_span_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 16 and int(i, 16) != 0 for i in ids)


# --- the OTEL_* switch -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # naming a service exports nothing
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": " None , "}, False),
        ({"OTEL_TRACES_EXPORTER": "none,otlp"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        # an explicit "none" wins over an endpoint (the endpoint may serve metrics only)
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_the_environment_switches_export_on(environ: dict[str, str], on: bool) -> None:
    assert otel.requested(environ) is on


def test_off_gives_no_tracer() -> None:
    assert otel.gateway_tracer({}) is None
    assert otel.agent_tracer("agent://a", {"OTEL_TRACES_EXPORTER": "none"}) is None
