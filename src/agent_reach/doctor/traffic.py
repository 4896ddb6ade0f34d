"""The traffic checks of the doctor's checklist: sporadic timeouts and retry storms. Pure.

Both read the gateway's counters (since it started) and ``/v1/route``'s candidates; the advice on
deadlines uses the gateway's overhead reserve when ``/v1/diagnostics`` gives it (else the default).
"""

from __future__ import annotations

from agent_reach.core.retry import per_try_timeout_ms
from agent_reach.doctor.findings import Finding, Severity, count
from agent_reach.doctor.snapshot import ATTEMPTS, BUDGET, REQUESTS, RETRIES, UNROUTABLE, Snapshot

__all__ = [
    "NEAR_TIMEOUT_RATIO",
    "RETRY_MIN_REQUESTS",
    "RETRY_RATIO_WARN",
    "TIMEOUT_SHARE_WARN",
    "retry_storm",
    "sporadic_timeouts",
]

TIMEOUT_SHARE_WARN = 0.02
"""Timed-out attempts at or above this share of an intent's attempts: a warning (below: info)."""

NEAR_TIMEOUT_RATIO = 0.5
"""A candidate whose p95 latency is at least this share of its per-try timeout is close to timing
out. The per-try timeout is ``max(1.5 x p95, 2000 ms)``, so this means p95 >= 1000 ms."""

RETRY_RATIO_WARN = 0.2
"""Retries per routed request above this (the retry budget's own ratio): a retry storm."""

RETRY_MIN_REQUESTS = 10
"""Routed requests below which the retry ratio is not judged (too few to mean anything)."""


def sporadic_timeouts(s: Snapshot) -> list[Finding]:
    """Check 4: per intent, timed-out attempts and candidates close to their per-try timeout."""
    attempts = s.by_label(ATTEMPTS, "intent")
    timeouts = s.by_label(ATTEMPTS, "intent", outcome="timeout")
    findings: list[Finding] = []
    for intent in sorted(attempts):
        n, t = attempts[intent], timeouts.get(intent, 0.0)
        cands = s.candidates(intent)
        lines, close, worst_try = [], [], 0.0
        for c in cands:
            p95 = c.get("p95_latency_ms")
            if p95 is None:
                lines.append(f"{c.get('endpoint_id')}: no answered delivery yet (p95 unknown)")
                continue
            per_try = per_try_timeout_ms(p95)
            ratio = p95 / per_try
            lines.append(
                f"{c.get('endpoint_id')}: p95 {p95:.0f} ms, per-try timeout {per_try:.0f} ms "
                f"(p95 = {ratio:.2f} x per-try; close from {NEAR_TIMEOUT_RATIO:g})"
            )
            if ratio >= NEAR_TIMEOUT_RATIO:
                close.append(str(c.get("endpoint_id")))
                worst_try = max(worst_try, per_try)
        if not t and not close:
            continue
        share = t / n if n else 0.0
        if t and (share >= TIMEOUT_SHARE_WARN or close):
            severity = Severity.WARNING
        else:
            severity = Severity.INFO
        late = s.total(REQUESTS, intent=intent, outcome="deadline_exceeded")
        evidence = [
            f"attempts on {intent}: {count(n)}, timed out: {count(t)} ({share:.1%}; "
            f"warning from {TIMEOUT_SHARE_WARN:.0%})",
            *lines,
            f"requests on {intent} answered deadline_exceeded: {count(late)}",
        ]
        answer = s.routes.get(intent, {})
        if answer.get("ok") and answer.get("per_try_timeout_ms") is not None:
            evidence.append(
                f"/v1/route?intent={intent}: chosen {answer.get('chosen')}, per-try timeout "
                f"{answer['per_try_timeout_ms']:.0f} ms, max retries {answer.get('max_retries')} "
                f"for a {s.timeout_ms or 'default (8000)'} ms deadline"
            )
        per_try = worst_try or max(
            (per_try_timeout_ms(c.get("p95_latency_ms")) for c in cands), default=2000.0
        )
        reserve = s.overhead_reserve_ms
        need = reserve + 1.2 * per_try
        if close:
            step = (
                f"Make {', '.join(close)} faster or add capacity: a p95 this close to the per-try "
                "timeout (max(1.5 x p95, 2000 ms)) means its slowest answers time out and are "
                "retried. "
            )
        else:
            step = (
                "Some requests never answer within the per-try timeout although the answered "
                "ones are fast: look for requests that hang in the agent (its log lines by trace "
                "id; GET /v1/traces/TRACE_ID). "
            )
        where = "on this gateway" if s.diagnostics is not None else "by default"
        step += (
            f"Give the callers' timeout_ms room for a retry: at least {need:.0f} ms (overhead "
            f"reserve, {reserve:g} ms {where}, + 1.2 x the {per_try:.0f} ms per-try timeout); a "
            "shorter deadline cuts the first attempt and allows no retry."
        )
        title = (
            f"{count(t)} of {count(n)} attempts on {intent!r} timed out"
            if t
            else f"{intent!r} answers close to its per-try timeout"
        )
        findings.append(
            Finding("sporadic_timeouts", severity, title, tuple(evidence), step, intent)
        )
    if not findings:
        findings.append(
            Finding(
                "sporadic_timeouts",
                Severity.OK,
                "No attempt timed out",
                (f"attempts: {count(sum(attempts.values()))}, timed out: 0",),
                "",
            )
        )
    return findings


def retry_storm(s: Snapshot) -> list[Finding]:
    """Check 5: retries per routed request, budget refusals, the intents that fail most."""
    requests = s.by_label(REQUESTS, "intent")
    routed = sum(v for k, v in requests.items() if k != UNROUTABLE)
    failover = s.total(RETRIES, kind="failover")
    same = s.total(RETRIES, kind="same_endpoint")
    retries = s.total(RETRIES)
    refused = s.total(BUDGET)
    ratio = retries / routed if routed else 0.0
    evidence = [
        f"retries: {count(retries)} ({count(failover)} failover, {count(same)} same endpoint) "
        f"over {count(routed)} routed requests: {ratio:.2f} a request "
        f"(storm above {RETRY_RATIO_WARN:g}, judged from {RETRY_MIN_REQUESTS} requests)",
        f"retries refused by the retry budget: {count(refused)}",
    ]
    storm = (routed >= RETRY_MIN_REQUESTS and ratio > RETRY_RATIO_WARN) or refused > 0
    if not storm:
        return [Finding("retry_storm", Severity.OK, "No retry storm", tuple(evidence), "")]
    attempts = s.by_label(ATTEMPTS, "intent")
    ok = s.by_label(ATTEMPTS, "intent", outcome="ok")
    failed = sorted(
        (
            (n - ok.get(intent, 0.0), intent)
            for intent, n in attempts.items()
            if n > ok.get(intent, 0.0)
        ),
        key=lambda x: (-x[0], x[1]),
    )
    outcomes = s.by_label(ATTEMPTS, "outcome")
    evidence.append(
        "attempts by outcome: "
        + ", ".join(f"{o} {count(v)}" for o, v in sorted(outcomes.items()) if v)
    )
    gave_up = s.total(REQUESTS, outcome="all_attempts_failed")
    evidence.append(f"requests answered all_attempts_failed: {count(gave_up)}")
    for n_failed, intent in failed[:3]:
        names = ", ".join(
            f"{c.get('endpoint_id')} ({c.get('status')})" for c in s.candidates(intent)
        )
        evidence.append(
            f"{intent}: {count(n_failed)} of {count(attempts[intent])} attempts failed"
            + (f"; candidates: {names}" if names else "")
        )
    if failed:
        top = failed[0][1]
        agents = ", ".join(str(c.get("endpoint_id")) for c in s.candidates(top))
        where = f"{top!r} fails most; look at {agents or 'the agents that declare it'}"
    else:
        where = "look at the agents"
    step = (
        f"Find the failing agent: {where} (their logs, e.g. agent.handler_failed, and a trace: "
        "GET /v1/traces/TRACE_ID), then fix it or take it out (deregister). Retries multiply the "
        "load on a failing agent: a failover goes at once to another candidate; a retry of the "
        "same endpoint waits 0.5 x per-try before the first and 1 x per-try before later ones "
        "(jittered, 50-100 %); the gateway-wide retry budget caps retries at 10 % of recent "
        "requests, or 10 a second where that is more."
    )
    if refused:
        step += (
            f" The budget refused {count(refused)} retries: those callers got all_attempts_failed."
        )
    return [
        Finding(
            "retry_storm",
            Severity.WARNING,
            f"Retry storm: {ratio:.2f} retries a request" if routed else "Retry budget exhausted",
            tuple(evidence),
            step,
        )
    ]
