"""Unit tests of agent_reach.doctor: each finding from a snapshot built by hand, at its thresholds.

Metrics are made by the gateway's own :class:`GatewayMetrics` and rendered, so that the doctor
reads the names and labels the gateway really exports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from agent_reach.doctor import (
    NEAR_MISS_LIMIT,
    NEAR_MISS_MAX_EDITS,
    NEAR_TIMEOUT_RATIO,
    RETRY_MIN_REQUESTS,
    RETRY_RATIO_WARN,
    TIMEOUT_SHARE_WARN,
    Diagnostics,
    Finding,
    Severity,
    Snapshot,
    UnroutedIntent,
    diagnose,
    gather,
    near_misses,
    parse_metrics,
    worst,
)
from agent_reach.errors import GatewayUnavailable, NoCapableAgent, NotFound, Unauthorized
from agent_reach.gateway.metrics import GatewayMetrics

NOW = 1_700_000_000.0
CHECKS = ["empty_registry", "intent_unserved", "unrouted_agent", "sporadic_timeouts", "retry_storm"]


# --- builders ------------------------------------------------------------------------------------


def agent(
    name: str,
    caps: list[str],
    status: str = "healthy",
    *,
    seen_ago: float = 0.1,
    p95: float | None = None,
) -> dict[str, Any]:
    return {
        "endpoint_id": f"agent://{name}",
        "capabilities": caps,
        "endpoint_url": f"http://127.0.0.1:9/{name}",
        "description": "",
        "status": status,
        "last_seen_at": NOW - seen_ago,
        "avg_latency_ms": p95,
        "p95_latency_ms": p95,
    }


def cand(
    name: str,
    status: str = "healthy",
    *,
    p95: float | None = None,
    eligible: bool = True,
    reason: str = "healthy",
) -> dict[str, Any]:
    return {
        "endpoint_id": f"agent://{name}",
        "status": status,
        "confidence": 1.0,
        "avg_latency_ms": p95,
        "p95_latency_ms": p95,
        "eligible": eligible,
        "reason": reason,
    }


def route(intent: str, *cands: dict[str, Any], per_try: float = 2000.0) -> dict[str, Any]:
    chosen = next((c["endpoint_id"] for c in cands if c["eligible"]), None)
    return {
        "ok": True,
        "intent": intent,
        "chosen": chosen,
        "per_try_timeout_ms": per_try,
        "max_retries": 2,
        "candidates": list(cands),
    }


def error(code: str, detail: str = "") -> dict[str, Any]:
    return {"ok": False, "error": code, "detail": detail or code}


def metrics(
    *,
    requests: Mapping[tuple[str, str], int] = {},
    attempts: Mapping[tuple[str, str], int] = {},
    retries: Mapping[str, int] = {},
    budget: int = 0,
    heartbeats: Mapping[str, int] = {},
    registrations: int = 0,
) -> str:
    """The Prometheus text of a gateway whose counters have these values."""
    m = GatewayMetrics(lambda: {})
    for (intent, outcome), n in requests.items():
        for _ in range(n):
            m.request_done(intent, outcome, 0.01)
    for (intent, outcome), n in attempts.items():
        for _ in range(n):
            m.attempt_done(intent, outcome, 0.01)
    for kind, n in retries.items():
        m.retries.labels(kind).inc(n)
    m.retry_budget_exhausted.inc(budget)
    for result, n in heartbeats.items():
        m.heartbeats.labels(result).inc(n)
    m.registrations.inc(registrations)
    return m.render().decode()


def snap(
    agents: Sequence[dict[str, Any]] = (),
    routes: Mapping[str, Mapping[str, Any]] = {},
    text: str = "",
    *,
    asked: tuple[str, ...] = (),
    interval: float | None = None,
    diagnostics: Diagnostics | None = None,
) -> Snapshot:
    return Snapshot(
        tuple(agents),
        dict(routes),
        parse_metrics(text or metrics()),
        NOW,
        interval,
        asked,
        diagnostics=diagnostics,
    )


def diag(*unrouted: tuple[str, int, float], **settings: float) -> Diagnostics:
    """A gateway's /v1/diagnostics: ``unrouted`` as (intent, count, seconds ago)."""
    values = {
        "heartbeat_interval_s": 10.0,
        "degraded_after_s": 10.0,
        "suspect_after_s": 20.0,
        "down_after_s": 30.0,
        "slow_threshold_ms": 2000.0,
        "overhead_reserve_ms": 1000.0,
        "confidence_threshold": 0.8,
    } | settings
    return Diagnostics(
        **values, unrouted_intents=tuple(UnroutedIntent(i, n, NOW - ago) for i, n, ago in unrouted)
    )


def diag_answer(*unrouted: tuple[str, int, float], **settings: float) -> dict[str, Any]:
    """The JSON answer of /v1/diagnostics for :func:`diag`'s arguments."""
    d = diag(*unrouted, **settings)
    return {
        "ok": True,
        "heartbeat_interval_s": d.heartbeat_interval_s,
        "degraded_after_s": d.degraded_after_s,
        "suspect_after_s": d.suspect_after_s,
        "down_after_s": d.down_after_s,
        "slow_threshold_ms": d.slow_threshold_ms,
        "overhead_reserve_ms": d.overhead_reserve_ms,
        "confidence_threshold": d.confidence_threshold,
        "unrouted_intents": [
            {"intent": u.intent, "count": u.count, "last_at": u.last_at} for u in d.unrouted_intents
        ],
    }


def of(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def only(findings: list[Finding], check: str) -> Finding:
    found = of(findings, check)
    assert len(found) == 1, found
    return found[0]


def healthy() -> Snapshot:
    return snap(
        [agent("w1", ["weather.query"], p95=40.0), agent("n1", ["note.create"], p95=12.0)],
        {
            "weather.query": route("weather.query", cand("w1", p95=40.0)),
            "note.create": route("note.create", cand("n1", p95=12.0)),
        },
        metrics(
            requests={("weather.query", "ok"): 30, ("note.create", "ok"): 20},
            attempts={("weather.query", "ok"): 31, ("note.create", "ok"): 20},
            retries={"failover": 1},
            heartbeats={"ok": 40},
            registrations=2,
        ),
    )


# --- a healthy gateway ---------------------------------------------------------------------------


def test_a_healthy_gateway_passes_every_check_in_order() -> None:
    findings = diagnose(healthy())
    assert [f.check for f in findings] == CHECKS
    assert {f.severity for f in findings} == {Severity.OK}
    assert worst(findings) is Severity.OK
    assert diagnose(healthy()) == findings  # deterministic
    assert "agents by status: 2 healthy" in findings[0].evidence


def test_worst_ranks_severities() -> None:
    def f(sev: Severity) -> Finding:
        return Finding("x", sev, "t", (), "")

    assert worst([]) is Severity.OK
    assert worst([f(Severity.INFO), f(Severity.ERROR), f(Severity.WARNING)]) is Severity.ERROR
    assert worst([f(Severity.OK), f(Severity.INFO)]) is Severity.INFO
    assert [s.rank for s in Severity] == [0, 1, 2, 3]


# --- 1. empty registry ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("registrations", "unknown", "steps_mention", "steps_omit"),
    [
        (0, 0, ["AGENT_REACH_GATEWAY"], ["registration(s) were made", "heartbeat(s) named"]),
        (3, 0, ["3 registration(s) were made", "--purge-after"], ["heartbeat(s) named"]),
        (0, 2, ["2 heartbeat(s) named an endpoint", "register again"], ["registration(s) were"]),
    ],
)
def test_empty_registry_says_agents_fail_to_register(
    registrations: int, unknown: int, steps_mention: list[str], steps_omit: list[str]
) -> None:
    s = snap(
        text=metrics(
            registrations=registrations,
            heartbeats={"unknown": unknown},
            requests={("_unroutable", "no_capable_agent"): 4},
        )
    )
    f = only(diagnose(s), "empty_registry")
    assert f.severity is Severity.ERROR
    assert f.evidence == (
        "agents registered: 0",
        f"registrations since the gateway started: {registrations}",
        f"heartbeats answered ok: 0; answered 404 (unknown endpoint): {unknown}",
        "requests refused before routing (no capable or available agent): 4",
    )
    assert "registration errors" in f.next_step
    for text in steps_mention:
        assert text in f.next_step
    for text in steps_omit:
        assert text not in f.next_step


def test_one_agent_is_not_an_empty_registry() -> None:
    f = only(diagnose(snap([agent("a", ["x.y"], "down", seen_ago=99)])), "empty_registry")
    assert f.severity is Severity.OK
    assert f.title == "1 agent(s) registered"


# --- 2a. intents nobody declares: near misses ----------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "declared", "expected"),
    [
        ("weather.querry", ["weather.query", "note.create"], [("weather.query", "1 edit apart")]),
        ("weather.qeury", ["weather.query"], [("weather.query", "1 edit apart")]),  # a swap
        ("weather.que", ["weather.query"], [("weather.query", "2 edits apart")]),
        ("weather.qu", ["weather.query"], []),  # 3 edits: over NEAR_MISS_MAX_EDITS
        ("abc", ["abd"], [("abd", "1 edit apart")]),
        ("ab", ["ac"], []),  # one edit of a 2-letter tag is half of it: not a near miss
        ("weather", ["weather.query"], [("weather.query", "one is a dotted prefix of the other")]),
        (
            "weather.query.today",
            ["weather.query"],
            [("weather.query", "one is a dotted prefix of the other")],
        ),
        (
            "query.weather",
            ["weather.query"],
            [("weather.query", "the same segments in another order")],
        ),
        ("meteo.query", ["weather.query"], [("weather.query", "the same last segment 'query'")]),
        # the weak kind is offered only when nothing closer is
        ("meteo.query", ["weather.query", "meteo.querx"], [("meteo.querx", "1 edit apart")]),
        ("note.create", ["weather.query"], []),
        ("weather.query", ["weather.query"], []),  # an exact match is no miss
    ],
)
def test_near_misses(asked: str, declared: list[str], expected: list[tuple[str, str]]) -> None:
    assert near_misses(asked, declared) == expected


def test_near_misses_are_ranked_and_capped() -> None:
    declared = ["a.bcdef", "a.bcdex", "a.bcdxx", "a.bcdefg", "a.bcde", "a"]
    got = near_misses("a.bcdey", declared)
    assert len(got) == NEAR_MISS_LIMIT == 3
    # three at 1 edit (ties by tag) before the 2-edit ones and the dotted prefix "a"
    assert got == [(t, "1 edit apart") for t in ("a.bcde", "a.bcdef", "a.bcdex")]
    assert near_misses("a.bcdey", ["a.bcdxx", "a"]) == [
        ("a.bcdxx", "2 edits apart"),
        ("a", "one is a dotted prefix of the other"),
    ]
    assert NEAR_MISS_MAX_EDITS == 2


def test_callers_asking_a_near_miss_tag_get_a_tag_mismatch_finding() -> None:
    s = snap(
        [agent("weather-01", ["weather.query"])],
        {
            "weather.querry": error(
                "no_capable_agent", "no agent declares intent 'weather.querry'"
            ),
            "weather.query": route("weather.query", cand("weather-01")),
        },
        metrics(requests={("_unroutable", "no_capable_agent"): 7}),
        asked=("weather.querry",),
    )
    findings = diagnose(s)
    f = only(findings, "intent_unserved")
    assert f.severity is Severity.WARNING
    assert f.subject == "weather.querry"
    assert "requests answered no_capable_agent since the gateway started: 7" in f.evidence
    assert "near miss: agent://weather-01 declares 'weather.query' (1 edit apart)" in f.evidence
    assert "callers ask 'weather.querry' but agent://weather-01 declares 'weather.query'" in (
        f.next_step
    )
    # and the agent itself: never routed, probably for that reason
    g = only(findings, "unrouted_agent")
    assert g.severity is Severity.WARNING
    assert g.title == "agent://weather-01 was never routed: no request asked for its intents"
    assert "requests on its intents (weather.query): 0 of 7 answered" in g.evidence
    assert "callers ask 'weather.querry' instead? (1 edit apart; no agent declares it)" in (
        g.evidence
    )


def test_an_unserved_intent_with_nothing_close() -> None:
    s = snap(
        [agent("w", ["weather.query"])],
        {"billing.charge": error("no_capable_agent")},
        metrics(requests={("_unroutable", "no_capable_agent"): 1}),
        asked=("billing.charge",),
    )
    f = only(diagnose(s), "intent_unserved")
    assert f.severity is Severity.WARNING
    assert not any(line.startswith("near miss") for line in f.evidence)
    assert "No agent declares 'billing.charge' nor anything close" in f.next_step


def test_refused_requests_without_asked_intents_point_to_the_logs() -> None:
    s = snap(
        [agent("w", ["weather.query"])],
        text=metrics(requests={("_unroutable", "no_capable_agent"): 1}),
    )
    f = only(diagnose(s), "intent_unserved")
    assert f.severity is Severity.WARNING
    assert f.title == "1 request(s) asked for intents that no agent declares"
    assert "intents declared: weather.query" in f.evidence
    assert "reach.failed" in f.next_step and "--intent" in f.next_step


@pytest.mark.parametrize(
    ("answer", "refused", "severity"),
    [
        (route("weather.query", cand("w")), 0, Severity.OK),  # served: nothing to say
        (error("no_available_agent"), 0, Severity.OK),  # declared: the agents' check says why
        (error("invalid_request", "intent: bad tag"), 0, Severity.WARNING),
        (error("no_capable_agent"), 0, Severity.WARNING),  # the route says so even with 0 counted
    ],
)
def test_asked_intents_by_route_answer(
    answer: dict[str, Any], refused: int, severity: Severity
) -> None:
    s = snap(
        [agent("w", ["weather.query"])],
        {"Weather.Query": answer},
        metrics(requests={("weather.query", "ok"): 1}),
        asked=("Weather.Query",),
    )
    assert only(diagnose(s), "intent_unserved").severity is severity


# --- 2b. agents that routing does not choose -----------------------------------------------------


def test_a_suspect_agent_with_a_peer_is_a_warning_with_its_heartbeat_age() -> None:
    reason = "suspect: no heartbeat for 1.5 s (reachable only through recipient_hint)"
    s = snap(
        [agent("a1", ["x.y"], "suspect", seen_ago=1.5), agent("a2", ["x.y"])],
        {"x.y": route("x.y", cand("a1", "suspect", eligible=False, reason=reason), cand("a2"))},
        metrics(requests={("x.y", "ok"): 3}),
        interval=0.3,
    )
    f = only(diagnose(s), "unrouted_agent")
    assert (f.severity, f.subject) == (Severity.WARNING, "agent://a1")
    assert f.title == "agent://a1 is suspect: intent routing does not choose it"
    assert f.evidence[0] == "status: suspect"
    assert f.evidence[1].startswith("last heartbeat 1.5 s ago: 5.0 x the 0.3 s heartbeat interval")
    assert f.evidence[2] == f"/v1/route?intent=x.y: not eligible: {reason}"
    assert "stopped heartbeating" in f.next_step
    assert "no_available_agent" not in f.next_step


def test_a_down_agent_alone_on_its_intent_is_an_error() -> None:
    s = snap(
        [agent("a1", ["x.y"], "down", seen_ago=12.0)],
        {"x.y": error("no_available_agent", "1 agent(s) declare 'x.y' but none is healthy")},
    )
    f = only(diagnose(s), "unrouted_agent")
    assert f.severity is Severity.ERROR
    assert "last heartbeat 12.0 s ago (heartbeat interval unknown)" in f.evidence
    assert (
        "/v1/route?intent=x.y: no_available_agent: 1 agent(s) declare 'x.y' but none is healthy"
        in f.evidence
    )
    assert "no other agent serves" in f.next_step


def test_an_ejected_agent_points_at_its_endpoint_url() -> None:
    reason = "suspect: connection refused or reset: out of intent routing until its next heartbeat"
    s = snap(
        [agent("a1", ["x.y"], "suspect"), agent("a2", ["x.y"])],
        {"x.y": route("x.y", cand("a1", "suspect", eligible=False, reason=reason), cand("a2"))},
    )
    f = only(diagnose(s), "unrouted_agent")
    assert "could not connect to agent://a1 at http://127.0.0.1:9/a1" in f.next_step


def test_an_ejected_agent_alone_on_its_intent_points_at_its_endpoint_url() -> None:
    """A review: with no other candidate, /v1/route is only no_available_agent (no reasons),
    and the doctor told the operator the agent had stopped heartbeating, though its heartbeat
    was 0.7 s old: the gateway could not connect to it. A heartbeat too recent for the status
    now says so."""
    unreachable = {"x.y": error("no_available_agent", "1 agent(s) declare 'x.y' but none is")}
    s = snap([agent("a1", ["x.y"], "suspect", seen_ago=0.7)], unreachable, interval=10.0)
    f = only(diagnose(s), "unrouted_agent")
    assert f.severity is Severity.ERROR
    assert "could not connect to agent://a1" in f.next_step
    assert "no other agent serves" in f.next_step
    silent = snap([agent("a1", ["x.y"], "suspect", seen_ago=25.0)], unreachable, interval=10.0)
    assert "stopped heartbeating" in only(diagnose(silent), "unrouted_agent").next_step
    known = snap(
        [agent("a1", ["x.y"], "suspect", seen_ago=15.0)], unreachable, diagnostics=diag()
    )  # the gateway's own threshold (20 s) says 15 s is too recent
    assert "could not connect" in only(diagnose(known), "unrouted_agent").next_step


@pytest.mark.parametrize(
    ("reason", "step"),
    [
        ("slow: mean 2500 ms over its last deliveries (threshold 2000 ms)", "is slow"),
        ("heartbeat late (0.4 s old)", "heartbeat is late"),
    ],
)
def test_a_degraded_agent_is_information(reason: str, step: str) -> None:
    s = snap(
        [agent("a1", ["x.y"], "degraded")],
        {"x.y": route("x.y", cand("a1", "degraded", reason=reason))},
        metrics(requests={("x.y", "ok"): 3}),
    )
    f = only(diagnose(s), "unrouted_agent")
    assert f.severity is Severity.INFO
    assert f"/v1/route?intent=x.y: {reason}" in f.evidence
    assert step in f.next_step


@pytest.mark.parametrize(
    ("requests", "severity"),
    [
        ({}, Severity.OK),  # no traffic at all: nobody was routed, nothing to say
        ({("x.y", "ok"): 1}, Severity.OK),  # asked for once: routed
        ({("other.tag", "ok"): 5}, Severity.INFO),  # traffic, none for it
        ({("_unroutable", "no_capable_agent"): 1}, Severity.INFO),  # no asked intent to compare
    ],
)
def test_an_agent_never_asked_for(requests: dict[tuple[str, str], int], severity: Severity) -> None:
    s = snap([agent("a1", ["x.y"])], {"x.y": route("x.y", cand("a1"))}, metrics(requests=requests))
    assert only(diagnose(s), "unrouted_agent").severity is severity


# --- 3. sporadic timeouts ------------------------------------------------------------------------


def timeouts_snap(timeouts: int, attempts: int, p95: float | None, late: int = 0) -> Snapshot:
    return snap(
        [agent("s1", ["x.y"], p95=p95)],
        {"x.y": route("x.y", cand("s1", p95=p95))},
        metrics(
            requests={("x.y", "ok"): attempts - timeouts, ("x.y", "deadline_exceeded"): late},
            attempts={("x.y", "timeout"): timeouts, ("x.y", "ok"): attempts - timeouts},
        ),
    )


@pytest.mark.parametrize(
    ("timeouts", "attempts", "p95", "severity"),
    [
        (0, 100, 100.0, Severity.OK),
        (2, 100, 100.0, Severity.WARNING),  # exactly TIMEOUT_SHARE_WARN
        (1, 100, 100.0, Severity.INFO),  # below the share, p95 far from the per-try timeout
        (199, 10_000, 100.0, Severity.INFO),  # 1.99 %
        (1, 1000, 1000.0, Severity.WARNING),  # p95 = 0.5 x 2000 ms: close, and timeouts seen
        (1, 1000, 999.0, Severity.INFO),  # p95 just under: not close
        (0, 100, 1000.0, Severity.INFO),  # close but no timeout yet
        (0, 100, 999.0, Severity.OK),
        (3, 3, None, Severity.WARNING),  # never answers: p95 unknown
    ],
)
def test_timeout_thresholds(
    timeouts: int, attempts: int, p95: float | None, severity: Severity
) -> None:
    assert TIMEOUT_SHARE_WARN == 0.02 and NEAR_TIMEOUT_RATIO == 0.5
    f = only(diagnose(timeouts_snap(timeouts, attempts, p95)), "sporadic_timeouts")
    assert f.severity is severity
    assert f.subject == ("" if severity is Severity.OK else "x.y")


def test_a_slow_agent_near_its_per_try_timeout() -> None:
    f = only(diagnose(timeouts_snap(2, 3, 1200.0, late=2)), "sporadic_timeouts")
    assert f.title == "2 of 3 attempts on 'x.y' timed out"
    assert f.evidence == (
        "attempts on x.y: 3, timed out: 2 (66.7%; warning from 2%)",
        "agent://s1: p95 1200 ms, per-try timeout 2000 ms (p95 = 0.60 x per-try; close from 0.5)",
        "requests on x.y answered deadline_exceeded: 2",
        "/v1/route?intent=x.y: chosen agent://s1, per-try timeout 2000 ms, max retries 2 "
        "for a default (8000) ms deadline",
    )
    assert f.next_step.startswith("Make agent://s1 faster or add capacity")
    assert "at least 3400 ms" in f.next_step  # 1000 ms reserve + 1.2 x 2000 ms


def test_a_hanging_agent_has_no_p95() -> None:
    f = only(diagnose(timeouts_snap(3, 3, None)), "sporadic_timeouts")
    assert "agent://s1: no answered delivery yet (p95 unknown)" in f.evidence
    assert "hang in the agent" in f.next_step


def test_a_long_p95_raises_the_per_try_timeout_in_the_advice() -> None:
    f = only(diagnose(timeouts_snap(1, 10, 3000.0)), "sporadic_timeouts")
    assert "per-try timeout 4500 ms (p95 = 0.67 x per-try" in f.evidence[1]
    assert "at least 6400 ms" in f.next_step  # 1000 + 1.2 x 4500


def test_attempts_of_a_gateway_without_the_intent_label() -> None:
    text = (
        'agent_reach_attempts_total{outcome="timeout"} 5\n'
        'agent_reach_attempts_total{outcome="ok"} 5\n'
    )
    f = only(diagnose(snap([agent("a", ["x.y"])], text=text)), "sporadic_timeouts")
    assert f.severity is Severity.WARNING
    assert f.subject == "(all intents)"


# --- 4. retry storms -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("routed", "unroutable", "retries", "budget", "severity"),
    [
        (10, 0, 2, 0, Severity.OK),  # 0.2: not above
        (10, 0, 3, 0, Severity.WARNING),  # 0.3
        (9, 0, 9, 0, Severity.OK),  # under RETRY_MIN_REQUESTS: not judged
        (10, 100, 3, 0, Severity.WARNING),  # unroutable requests are not in the ratio
        (1, 0, 0, 1, Severity.WARNING),  # the budget refused a retry
        (0, 0, 0, 0, Severity.OK),
    ],
)
def test_retry_storm_thresholds(
    routed: int, unroutable: int, retries: int, budget: int, severity: Severity
) -> None:
    assert (RETRY_RATIO_WARN, RETRY_MIN_REQUESTS) == (0.2, 10)
    s = snap(
        [agent("f1", ["x.y"])],
        {"x.y": route("x.y", cand("f1"))},
        metrics(
            requests={("x.y", "ok"): routed, ("_unroutable", "no_capable_agent"): unroutable},
            attempts={("x.y", "ok"): routed},
            retries={"same_endpoint": retries},
            budget=budget,
        ),
    )
    assert only(diagnose(s), "retry_storm").severity is severity


def test_a_retry_storm_names_the_failing_intent_and_its_agents() -> None:
    s = snap(
        [agent("f1", ["pay.charge"]), agent("f2", ["pay.charge"]), agent("ok", ["x.y"])],
        {
            "pay.charge": route("pay.charge", cand("f1"), cand("f2")),
            "x.y": route("x.y", cand("ok")),
        },
        metrics(
            requests={("pay.charge", "all_attempts_failed"): 10, ("x.y", "ok"): 10},
            attempts={
                ("pay.charge", "server_error"): 20,
                ("x.y", "ok"): 9,
                ("x.y", "timeout"): 1,
            },
            retries={"failover": 10, "same_endpoint": 1},
            budget=2,
        ),
    )
    f = only(diagnose(s), "retry_storm")
    assert f.severity is Severity.WARNING
    assert f.title == "Retry storm: 0.55 retries a request"
    assert f.evidence == (
        "retries: 11 (10 failover, 1 same endpoint) over 20 routed requests: 0.55 a request "
        "(storm above 0.2, judged from 10 requests)",
        "retries refused by the retry budget: 2",
        "attempts by outcome: ok 9, server_error 20, timeout 1",
        "requests answered all_attempts_failed: 10",
        "pay.charge: 20 of 20 attempts failed; "
        "candidates: agent://f1 (healthy), agent://f2 (healthy)",
        "x.y: 1 of 10 attempts failed; candidates: agent://ok (healthy)",
    )
    assert "'pay.charge' fails most; look at agent://f1, agent://f2 (" in f.next_step
    assert "0.5 x per-try" in f.next_step
    assert "The budget refused 2 retries" in f.next_step


# --- what /v1/diagnostics adds to the checks ----------------------------------------------------


def test_a_tag_mismatch_counts_the_refusals_of_the_intent_and_states_the_threshold() -> None:
    s = snap(
        [agent("weather-01", ["weather.query"])],
        {
            "weather.querry": error("no_capable_agent", "no agent declares 'weather.querry'"),
            "weather.query": route("weather.query", cand("weather-01")),
        },
        metrics(requests={("_unroutable", "no_capable_agent"): 7}),
        asked=("weather.querry",),
        diagnostics=diag(("weather.querry", 7, 12.0), confidence_threshold=0.6),
    )
    f = only(diagnose(s), "intent_unserved")
    assert f.evidence[:3] == (
        "/v1/route?intent=weather.querry: no_capable_agent (no agent declares 'weather.querry')",
        "requests answered no_capable_agent since the gateway started: 7",
        "refused for weather.querry (GET /v1/diagnostics): 7 request(s), the last 12.0 s ago",
    )
    assert "(a fallback match needs a confidence of at least 0.6)" in f.next_step


def test_without_diagnostics_the_threshold_is_not_named() -> None:
    s = snap(
        [agent("weather-01", ["weather.query"])],
        {"weather.querry": error("no_capable_agent")},
        asked=("weather.querry",),
    )
    f = only(diagnose(s), "intent_unserved")
    assert "(a fallback match needs the confidence threshold)" in f.next_step
    assert not any("GET /v1/diagnostics" in line for line in f.evidence)


def test_intents_refused_earlier_and_declared_now_are_information() -> None:
    s = snap(
        [agent("w", ["weather.query"])],
        {"weather.query": route("weather.query", cand("w"))},
        metrics(requests={("_unroutable", "no_capable_agent"): 3, ("weather.query", "ok"): 1}),
        asked=("weather.query",),
        diagnostics=diag(("weather.query", 3, 5.0)),
    )
    f = only(diagnose(s), "intent_unserved")
    assert f.severity is Severity.INFO
    assert f.title == (
        "3 request(s) were refused as no_capable_agent; their intents are declared now"
    )
    assert f.evidence == (
        "requests answered no_capable_agent since the gateway started: 3",
        "intents refused (GET /v1/diagnostics): weather.query (3 request(s), the last 5.0 s ago)",
    )


@pytest.mark.parametrize(
    ("diagnostics", "interval", "expected"),
    [
        (
            diag(
                heartbeat_interval_s=0.5,
                degraded_after_s=0.5,
                suspect_after_s=1.5,
                down_after_s=2.0,
            ),
            0.3,  # the operator's guess: the gateway's own interval wins
            "last heartbeat 1.5 s ago: 3.0 x the 0.5 s heartbeat interval (this gateway: "
            "degraded after 0.5 s, suspect after 1.5 s, down after 2 s)",
        ),
        (
            None,
            0.3,
            "last heartbeat 1.5 s ago: 5.0 x the 0.3 s heartbeat interval (by default degraded "
            "after 1 x, suspect after 2 x, down after 3 x; the gateway does not say its own)",
        ),
        (None, None, "last heartbeat 1.5 s ago (heartbeat interval unknown)"),
    ],
)
def test_the_heartbeat_age_against_the_gateways_own_thresholds(
    diagnostics: Diagnostics | None, interval: float | None, expected: str
) -> None:
    s = snap(
        [agent("a1", ["x.y"], "suspect", seen_ago=1.5), agent("a2", ["x.y"])],
        {"x.y": route("x.y", cand("a1", "suspect", eligible=False), cand("a2"))},
        interval=interval,
        diagnostics=diagnostics,
    )
    assert only(diagnose(s), "unrouted_agent").evidence[1] == expected


@pytest.mark.parametrize(
    ("diagnostics", "advice"),
    [
        (None, "at least 3400 ms (overhead reserve, 1000 ms by default, + 1.2 x the 2000 ms"),
        (
            diag(overhead_reserve_ms=250.0),
            "at least 2650 ms (overhead reserve, 250 ms on this gateway, + 1.2 x the 2000 ms",
        ),
    ],
)
def test_deadline_advice_uses_the_gateways_overhead_reserve(
    diagnostics: Diagnostics | None, advice: str
) -> None:
    s = snap(
        [agent("s1", ["x.y"], p95=1200.0)],
        {"x.y": route("x.y", cand("s1", p95=1200.0))},
        metrics(attempts={("x.y", "timeout"): 2, ("x.y", "ok"): 1}),
        diagnostics=diagnostics,
    )
    assert advice in only(diagnose(s), "sporadic_timeouts").next_step


def test_a_slow_agent_is_judged_against_the_gateways_slow_threshold() -> None:
    reason = "slow: mean 950 ms over its last deliveries (threshold 900 ms)"
    s = snap(
        [agent("a1", ["x.y"], "degraded")],
        {"x.y": route("x.y", cand("a1", "degraded", reason=reason))},
        metrics(requests={("x.y", "ok"): 3}),
        diagnostics=diag(slow_threshold_ms=900.0),
    )
    step = only(diagnose(s), "unrouted_agent").next_step
    assert "over the gateway's 900 ms --slow-threshold-ms" in step


def test_an_agent_never_asked_for_when_the_gateway_lists_what_it_refused() -> None:
    s = snap(
        [agent("a1", ["x.y"])],
        {"x.y": route("x.y", cand("a1")), "billing.charge": error("no_capable_agent")},
        metrics(requests={("_unroutable", "no_capable_agent"): 2}),
        asked=("billing.charge",),
        diagnostics=diag(("billing.charge", 2, 1.0)),
    )
    f = only(diagnose(s), "unrouted_agent")
    assert f.severity is Severity.INFO
    assert "no intent the gateway refused (GET /v1/diagnostics) is close to them" in f.next_step
    assert "--intent" not in f.next_step


# --- gather --------------------------------------------------------------------------------------


class FakeGateway:
    """The two injected getters, answering from dictionaries (the HTTP edge is not ours here).

    ``diagnostics`` is what ``/v1/diagnostics`` answers: a body, or an exception to raise; None
    is a gateway older than that endpoint (its 404, as the client SDK raises it).
    """

    def __init__(
        self,
        agents: list[dict[str, Any]],
        text: str,
        diagnostics: Any = None,
    ) -> None:
        self.agents = agents
        self.text = text
        self.diagnostics = diagnostics
        self.paths: list[str] = []

    async def get_json(self, path: str) -> Any:
        self.paths.append(path)
        if path == "/v1/agents":
            return {"agents": self.agents}
        if path == "/v1/diagnostics":
            if self.diagnostics is None:
                raise NotFound("no such path: /v1/diagnostics")
            if isinstance(self.diagnostics, BaseException):
                raise self.diagnostics
            return self.diagnostics
        intent = path.split("intent=")[1].split("&")[0]
        if intent.startswith("typo."):
            raise NoCapableAgent(f"no agent declares intent {intent!r}")
        return route(intent, cand("a"))

    async def get_text(self, path: str) -> str:
        self.paths.append(path)
        return self.text


async def test_gather_reads_agents_metrics_and_explains_asked_busy_then_other_intents() -> None:
    fake = FakeGateway(
        [agent("a", ["c.idle", "b.busy"]), agent("b", ["a.idle"])],
        metrics(requests={("b.busy", "ok"): 1}),
    )
    s = await gather(
        fake.get_json,
        fake.get_text,
        now=NOW,
        heartbeat_interval=0.3,
        intents=["typo.tag"],
        timeout_ms=3000,
        route_limit=3,
    )
    assert fake.paths == [
        "/v1/agents",
        "/v1/diagnostics",  # 404: an older gateway
        "/metrics",
        "/v1/route?intent=typo.tag&timeout_ms=3000",
        "/v1/route?intent=b.busy&timeout_ms=3000",
        "/v1/route?intent=a.idle&timeout_ms=3000",
    ]
    assert s.routes["typo.tag"]["error"] == "no_capable_agent"  # the typed error, as its body
    assert s.routes["b.busy"]["ok"] is True
    assert s.routes_skipped == 1  # c.idle, over the limit
    assert (s.now, s.heartbeat_interval, s.asked, s.timeout_ms) == (NOW, 0.3, ("typo.tag",), 3000)
    assert s.diagnostics is None and s.interval == 0.3 and s.overhead_reserve_ms == 1000.0
    assert s.total("agent_reach_requests_total", intent="b.busy") == 1
    assert not any(x.name.endswith(("_created", "_bucket")) for x in s.metrics)


async def test_gather_asks_the_intents_the_gateway_refused_and_takes_its_settings() -> None:
    answer = diag_answer(
        ("typo.recent", 2, 1.0),
        ("typo.mine", 1, 5.0),
        ("typo.old", 4, 60.0),
        heartbeat_interval_s=0.5,
        overhead_reserve_ms=250.0,
    )
    answer["a_later_field"] = {"ignored": True}  # a newer gateway may add fields
    fake = FakeGateway([agent("a", ["x.y"])], metrics(), answer)
    s = await gather(
        fake.get_json, fake.get_text, now=NOW, heartbeat_interval=0.3, intents=["typo.mine"]
    )
    # the operator's intents first, then the gateway's, most recently refused first
    assert s.asked == ("typo.mine", "typo.recent", "typo.old")
    # refused and declared by nobody: explained as exact tags (the callers may have forbidden
    # matching); the declared one as a send would be
    assert fake.paths[3:] == [
        "/v1/route?intent=typo.mine&fallback=false",
        "/v1/route?intent=typo.recent&fallback=false",
        "/v1/route?intent=typo.old&fallback=false",
        "/v1/route?intent=x.y",
    ]
    assert s.diagnostics == diag(
        ("typo.recent", 2, 1.0),
        ("typo.mine", 1, 5.0),
        ("typo.old", 4, 60.0),
        heartbeat_interval_s=0.5,
        overhead_reserve_ms=250.0,
    )
    assert (s.heartbeat_interval, s.interval, s.overhead_reserve_ms) == (0.5, 0.5, 250.0)
    assert s.unrouted("typo.old") == UnroutedIntent("typo.old", 4, NOW - 60.0)
    assert s.unrouted("x.y") is None
    assert {f.subject for f in diagnose(s) if f.check == "intent_unserved"} == set(s.asked)


@pytest.mark.parametrize(
    "older",
    [
        NotFound("no such path: /v1/diagnostics"),  # as the client SDK raises it
        {"ok": False, "error": "not_found", "detail": "no such path: /v1/diagnostics"},  # a body
        GatewayUnavailable("HTTP 404 without a contract error body", http_status=404),  # a proxy
    ],
)
async def test_gather_falls_back_on_a_gateway_without_diagnostics(older: Any) -> None:
    fake = FakeGateway([agent("a", ["x.y"])], metrics(), older)
    s = await gather(
        fake.get_json, fake.get_text, now=NOW, heartbeat_interval=0.3, intents=["typo.x"]
    )
    assert s.diagnostics is None
    assert (s.asked, s.heartbeat_interval, s.overhead_reserve_ms) == (("typo.x",), 0.3, 1000.0)
    assert "/v1/route?intent=typo.x" in fake.paths


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (GatewayUnavailable("connection refused"), "connection refused"),
        (Unauthorized("no credentials"), "no credentials"),
        ({"ok": False, "error": "unauthorized", "detail": "no"}, "answered unauthorized"),
        (["not", "an", "object"], "not an object"),
        ({**diag_answer(), "down_after_s": "30"}, "down_after_s is not a number"),
        ({**diag_answer(), "slow_threshold_ms": True}, "slow_threshold_ms is not a number"),
        ({**diag_answer(), "unrouted_intents": None}, "unrouted_intents is not a list"),
        ({**diag_answer(), "unrouted_intents": [{"count": 1}]}, "without an intent"),
        (
            {**diag_answer(), "unrouted_intents": [{"intent": "a.b", "count": 1.5, "last_at": 1}]},
            "count is not a whole number",
        ),
        (
            {**diag_answer(), "unrouted_intents": [{"intent": "a.b", "count": 1}]},
            "last_at is not a number",
        ),
    ],
)
async def test_gather_refuses_diagnostics_that_are_not_the_gateways(answer: Any, why: str) -> None:
    fake = FakeGateway([agent("a", ["x.y"])], metrics(), answer)
    with pytest.raises((GatewayUnavailable, Unauthorized), match=why):
        await gather(fake.get_json, fake.get_text, now=NOW)


async def test_gather_refuses_an_answer_that_is_not_the_contracts() -> None:
    async def get_json(path: str) -> Any:
        return ["not", "an", "object"]

    async def get_text(path: str) -> str:
        return ""

    with pytest.raises(GatewayUnavailable):
        await gather(get_json, get_text, now=NOW)
