"""The gateway's Prometheus metrics after known traffic: a real gateway process, real agents."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support import Proc, gateway, http, start_agent, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"
OK_SENDS = 7
UNROUTED_SENDS = 3


@pytest.fixture(scope="module")
def traffic() -> Iterator[tuple[Proc, dict[str, list[Sample]]]]:
    """A gateway that answered known traffic, and its metrics afterwards (samples by name)."""
    with gateway() as gw:
        ok = start_agent(gw.url, "agent://metrics-ok", intents="metrics.echo")
        failing = start_agent(gw.url, "agent://metrics-fail", "fail", intents="metrics.fail")
        try:
            for i in range(OK_SENDS):
                status, body = http(
                    "POST", f"{gw.url}/v1/send", {"intent": "metrics.echo", "payload": {"i": i}}
                )
                assert status == 200, body
            for _ in range(UNROUTED_SENDS):
                status, body = http("POST", f"{gw.url}/v1/send", {"intent": "nobody.serves"})
                assert (status, body["error"]) == (404, "no_capable_agent")
            # 3400 ms allows one retry of a 2000 ms try: two attempts, both answered 500
            status, body = http(
                "POST", f"{gw.url}/v1/send", {"intent": "metrics.fail", "timeout_ms": 3400}
            )
            assert (status, body["error"], len(body["attempts"])) == (
                502,
                "all_attempts_failed",
                2,
            )
            status, text = http("GET", f"{gw.url}/metrics")
            assert status == 200
        finally:
            ok.stop()
            failing.stop()
        samples: dict[str, list[Sample]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append(sample)
        yield gw, samples


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if s.labels == labels]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_requests_by_intent_and_outcome(traffic: tuple[Proc, dict[str, list[Sample]]]) -> None:
    _, m = traffic
    total = "agent_reach_requests_total"
    assert value(m, total, intent="metrics.echo", outcome="ok") == OK_SENDS
    # refused before any endpoint was chosen: one label, whatever the callers asked
    assert value(m, total, intent="_unroutable", outcome="no_capable_agent") == UNROUTED_SENDS
    assert value(m, total, intent="metrics.fail", outcome="all_attempts_failed") == 1
    hist = "agent_reach_request_duration_seconds"
    assert value(m, f"{hist}_count", intent="metrics.echo") == OK_SENDS
    assert value(m, f"{hist}_bucket", intent="metrics.echo", le="+Inf") == OK_SENDS
    assert 0 < value(m, f"{hist}_sum", intent="metrics.echo") < OK_SENDS * 2.0
    assert value(m, f"{hist}_count", intent="_unroutable") == UNROUTED_SENDS


def test_attempts_retries_and_the_budget(traffic: tuple[Proc, dict[str, list[Sample]]]) -> None:
    _, m = traffic
    total = "agent_reach_attempts_total"
    assert value(m, total, intent="metrics.echo", outcome="ok") == OK_SENDS
    assert value(m, total, intent="metrics.fail", outcome="server_error") == 2
    assert value(m, "agent_reach_attempt_duration_seconds_count") == OK_SENDS + 2
    assert value(m, "agent_reach_attempt_duration_seconds_bucket", le="+Inf") == OK_SENDS + 2
    assert value(m, "agent_reach_retries_total", kind="same_endpoint") == 1
    assert value(m, "agent_reach_retry_budget_exhausted_total") == 0


def test_registry_heartbeats_and_trace_store(
    traffic: tuple[Proc, dict[str, list[Sample]]],
) -> None:
    _, m = traffic
    assert value(m, "agent_reach_registrations_total") == 2
    assert value(m, "agent_reach_endpoints", status="healthy") == 2
    assert value(m, "agent_reach_endpoints", status="down") == 0
    assert value(m, "agent_reach_registry_available", backend="memory") == 1
    # heartbeat lag: both endpoints' last heartbeats are younger than the 10 s interval
    assert value(m, "agent_reach_heartbeat_interval_seconds") == 10
    age = "agent_reach_heartbeat_age_seconds_bucket"
    assert value(m, age, le="10.0") == 2
    assert value(m, age, le="+Inf") == 2
    assert value(m, "agent_reach_heartbeat_age_seconds_gcount") == 2
    # one trace per request, each with its own trace id
    assert value(m, "agent_reach_trace_store_traces") == OK_SENDS + UNROUTED_SENDS + 1
    assert value(m, "agent_reach_event_loop_lag_seconds") >= 0


def test_names_follow_the_prometheus_conventions(
    traffic: tuple[Proc, dict[str, list[Sample]]],
) -> None:
    gw, _ = traffic
    status, text = http("GET", f"{gw.url}/metrics")
    assert status == 200
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("agent_")]
    assert families
    for family in families:
        assert family.name.startswith("agent_reach_"), family.name
        assert family.documentation, family.name
        assert not any(unit in family.name for unit in ("_ms", "milli", "_minutes")), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if family.type == "histogram":  # durations and ages, in seconds
            assert family.name.endswith("_seconds"), family.name


def test_heartbeat_ages_grow_when_heartbeats_stop() -> None:
    with gateway("--heartbeat-interval", "0.5") as gw:
        # registered once, never heartbeating
        status, _ = http(
            "POST",
            f"{gw.url}/v1/register",
            {
                "endpoint_id": "agent://metrics-quiet",
                "capabilities": ["metrics.echo"],
                "endpoint_url": "http://127.0.0.1:9/reach",
            },
        )
        assert status == 200

        def buckets() -> dict[str, float]:
            _, text = http("GET", f"{gw.url}/metrics")
            for family in text_string_to_metric_families(text):
                if family.name == "agent_reach_heartbeat_age_seconds":
                    return {s.labels["le"]: s.value for s in family.samples if "le" in s.labels}
            raise AssertionError("no agent_reach_heartbeat_age_seconds")

        assert buckets()["0.5"] == 1  # just registered: within one interval
        # then older than 3 intervals (1.5 s): counted past that bound
        wait_until(lambda: buckets()["1.5"] == 0 and buckets()["+Inf"] == 1, timeout=10)


def test_every_metric_is_documented_and_the_dashboard_uses_served_ones(
    traffic: tuple[Proc, dict[str, list[Sample]]],
) -> None:
    gw, _ = traffic
    _, text = http("GET", f"{gw.url}/metrics")
    served = set()
    for family in text_string_to_metric_families(text):
        name = family.name
        if not name.startswith("agent_reach_") or name.endswith("_created"):
            continue  # the client library's creation timestamps
        name = name.removesuffix("_gcount").removesuffix("_gsum")  # of the gauge histogram
        served.add(f"{name}_total" if family.type == "counter" else name)
    table = (DOCS / "operations.md").read_text()
    documented = set(re.findall(r"\| `(agent_reach_[a-z_]+)` \|", table))
    assert served <= documented, served - documented
    # shared registries only (the gateway above runs the in-memory one), and --nats only
    # (tests/integration/test_nats_gateway.py reads those)
    assert documented - served == {
        "agent_reach_registry_sync_age_seconds",
        "agent_reach_nats_connected",
        "agent_reach_nats_reconnects_total",
        "agent_reach_nats_slow_consumer_drops_total",
        "agent_reach_nats_unreadable_messages_total",
    }

    dashboard = json.loads((DOCS / "grafana" / "agent-reach.json").read_text())
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    used = set()
    ids = set()
    for panel in dashboard["panels"]:
        ids.add(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            for name in re.findall(r"agent_reach_[a-z_]+", target["expr"]):
                used.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert len(ids) == len(dashboard["panels"])  # unique panel ids
    assert used <= documented, used - documented
    assert {
        "agent_reach_requests_total",
        "agent_reach_request_duration_seconds",
        "agent_reach_attempts_total",
        "agent_reach_retries_total",
        "agent_reach_retry_budget_exhausted_total",
        "agent_reach_endpoints",
        "agent_reach_event_loop_lag_seconds",
        "agent_reach_registry_available",
        "agent_reach_heartbeat_age_seconds",
    } <= used


def test_bounds_that_callers_reach_are_counted_when_hit() -> None:
    """Past the 100 unrouted intents kept and the 256 events kept of one trace, what the
    gateway drops is counted in ``agent_reach_bound_hits_total{bound}`` (a caller chooses both
    the intents and the trace id)."""
    with gateway("--matcher", "lexical") as gw:
        for n in range(200):
            body = {"intent": f"nobody.serves-{n}", "trace_id": "trace_bounds"}
            status, answer = http("POST", f"{gw.url}/v1/send", body)
            assert (status, answer["error"]) == (404, "no_capable_agent"), answer
        _, text = http("GET", f"{gw.url}/metrics")
        _, kept = http("GET", f"{gw.url}/v1/traces/trace_bounds")
    hits = {
        s.labels["bound"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "agent_reach_bound_hits"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert hits["unrouted_intents"] == 100  # the first 100 made room for the last 100
    events = len(kept["events"])
    assert events == 256
    assert hits["trace_events"] > 0
    assert hits["trace_store"] == hits["matcher_waiting"] == hits["delivery_pool"] == 0
