"""The doctor's findings on real gateways put into each state, with real agent processes.

Each test brings a gateway into one state of the troubleshooting checklist through its HTTP API,
reads it with :func:`gather` (getters over urllib, as any client would) and checks that
:func:`diagnose` names the problem with its evidence, and that a healthy gateway gives no warning.
The doctor is told nothing the gateway can say itself (``/v1/diagnostics``: the intents it
refused, its heartbeat interval and thresholds); one test plays a gateway without that endpoint.
"""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_reach.doctor import Finding, Severity, diagnose, gather
from tests.support import Proc, gateway, http, start_agent, status_of, wait_until


def doctor(gw: Proc, *, older: bool = False, **options: Any) -> list[Finding]:
    """gather + diagnose against ``gw``, the getters answering whatever body the gateway sends.

    ``older``: as a gateway without ``/v1/diagnostics`` (the getter asks a path that ``gw`` does
    not have, so ``gw`` itself answers 404 not_found).
    """

    async def get_json(path: str) -> Any:
        if older and path == "/v1/diagnostics":
            path = "/v1/diagnostics-of-a-newer-gateway"
        return (await asyncio.to_thread(http, "GET", gw.url + path))[1]

    async def get_text(path: str) -> str:
        status, text = await asyncio.to_thread(http, "GET", gw.url + path)
        assert status == 200 and isinstance(text, str)
        return text

    async def run() -> list[Finding]:
        return diagnose(await gather(get_json, get_text, now=time.time(), **options))

    return asyncio.run(run())


def send_all(gw: Proc, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """Send ``bodies`` to ``/v1/send`` at once (each in its own thread)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: http("POST", f"{gw.url}/v1/send", b), bodies))


def problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity.rank >= Severity.WARNING.rank]


def the(findings: list[Finding], check: str, subject: str = "") -> Finding:
    found = [f for f in findings if f.check == check and (not subject or f.subject == subject)]
    assert len(found) == 1, findings
    return found[0]


def test_a_healthy_gateway_gives_no_warning() -> None:
    with gateway() as gw:
        agent = start_agent(gw.url, "agent://doc-ok-01", "ok", intents="doc.echo")
        try:
            answers = send_all(gw, [{"intent": "doc.echo", "payload": i} for i in range(12)])
            assert [status for status, _ in answers] == [200] * 12
            findings = doctor(gw, intents=["doc.echo"])
        finally:
            agent.stop()
    assert problems(findings) == []
    assert [f.check for f in findings] == [
        "empty_registry",
        "intent_unserved",
        "unrouted_agent",
        "sporadic_timeouts",
        "retry_storm",
    ]
    assert "agents by status: 1 healthy" in findings[0].evidence


def test_empty_registry() -> None:
    with gateway() as gw:
        # an agent that believes it is registered, or a gateway that restarted under it
        code, _ = http("POST", f"{gw.url}/v1/heartbeat", {"endpoint_id": "agent://doc-lost-01"})
        assert code == 404
        code, _ = http("POST", f"{gw.url}/v1/send", {"intent": "doc.anything"})
        assert code == 404
        findings = doctor(gw)
    f = the(findings, "empty_registry")
    assert f.severity is Severity.ERROR
    assert "agents registered: 0" in f.evidence
    assert "heartbeats answered ok: 0; answered 404 (unknown endpoint): 1" in f.evidence
    assert "requests refused before routing (no capable or available agent): 1" in f.evidence
    assert "registration errors" in f.next_step and "register again" in f.next_step


def test_callers_asking_a_near_miss_of_the_declared_tag() -> None:
    with gateway() as gw:
        agent = start_agent(gw.url, "agent://doc-weather-01", "ok", intents="weather.query")
        try:
            # callers that forbid matching by meaning (it would catch this typo)
            answers = send_all(gw, [{"intent": "weather.querry", "fallback": False}] * 3)
            assert [(s, b["error"]) for s, b in answers] == [(404, "no_capable_agent")] * 3
            findings = doctor(gw)  # not told the intents: the gateway names them
            again = doctor(gw)  # doctor's own dry runs (/v1/route) are not counted as asked
        finally:
            agent.stop()
    for run in (findings, again):
        f = the(run, "intent_unserved", "weather.querry")
        assert f.severity is Severity.WARNING
        assert "requests answered no_capable_agent since the gateway started: 3" in f.evidence
        refused = next(e for e in f.evidence if e.startswith("refused for weather.querry"))
        assert refused.startswith(
            "refused for weather.querry (GET /v1/diagnostics): 3 request(s), the last "
        )
    assert "near miss: agent://doc-weather-01 declares 'weather.query' (1 edit apart)" in (
        f.evidence
    )
    assert "callers ask 'weather.querry'" in f.next_step
    g = the(findings, "unrouted_agent", "agent://doc-weather-01")
    assert g.severity is Severity.WARNING
    assert "requests on its intents (weather.query): 0 of 3 answered" in g.evidence


def test_an_older_gateway_leaves_the_intents_to_the_operator() -> None:
    # an older gateway: no /v1/diagnostics (doctor(older=True)), no matching by meaning
    with gateway("--matcher", "none") as gw:
        agent = start_agent(gw.url, "agent://doc-weather-02", "ok", intents="weather.query")
        try:
            answers = send_all(gw, [{"intent": "weather.querry"}] * 2)
            assert [s for s, _ in answers] == [404] * 2
            blind = doctor(gw, older=True)
            told = doctor(gw, older=True, intents=["weather.querry"])
        finally:
            agent.stop()
    f = the(blind, "intent_unserved")
    assert f.title == "2 request(s) asked for intents that no agent declares"
    assert "reach.failed" in f.next_step and "--intent" in f.next_step
    g = the(told, "intent_unserved", "weather.querry")
    assert "callers ask 'weather.querry'" in g.next_step
    assert not any("GET /v1/diagnostics" in line for line in g.evidence)


def test_an_agent_stopped_past_suspect() -> None:
    with gateway("--heartbeat-interval", "0.3") as gw:
        agent = start_agent(gw.url, "agent://doc-stop-01", "ok", intents="doc.stop")
        try:
            agent.popen.send_signal(signal.SIGSTOP)
            wait_until(
                lambda: status_of(gw.url, "agent://doc-stop-01") in ("suspect", "down"), timeout=5
            )
            findings = doctor(gw)  # the gateway says its interval and thresholds
        finally:
            agent.popen.send_signal(signal.SIGCONT)
            agent.stop()
    f = the(findings, "unrouted_agent", "agent://doc-stop-01")
    assert f.severity is Severity.ERROR  # the only agent of its intent
    assert f.evidence[0] in ("status: suspect", "status: down")
    age_line = f.evidence[1]
    assert age_line.startswith("last heartbeat ") and "x the 0.3 s heartbeat interval" in age_line
    assert age_line.endswith(
        "(this gateway: degraded after 0.3 s, suspect after 0.6 s, down after 0.9 s)"
    )
    age = float(age_line.split()[2])
    assert age >= 0.6  # past suspect-after (2 x 0.3 s), printed to 0.1 s
    assert any(
        line.startswith("/v1/route?intent=doc.stop: no_available_agent") for line in f.evidence
    )
    assert "stopped heartbeating" in f.next_step


def test_sporadic_timeouts_of_a_slow_and_a_hanging_agent() -> None:
    with gateway() as gw:
        slow = start_agent(gw.url, "agent://doc-slow-01", "slow", intents="doc.slow", delay_ms=1100)
        hang = start_agent(gw.url, "agent://doc-hang-01", "hang", intents="doc.hang")
        try:
            answers = send_all(
                gw,
                [
                    {"intent": "doc.slow"},  # answered: its p95 becomes about 1100 ms
                    {"intent": "doc.slow", "timeout_ms": 400},
                    {"intent": "doc.slow", "timeout_ms": 400},
                    {"intent": "doc.hang", "timeout_ms": 400},
                    {"intent": "doc.hang", "timeout_ms": 400},
                ],
            )
            assert [s for s, _ in answers] == [200, 504, 504, 504, 504]
            findings = doctor(gw)
        finally:
            slow.stop()
            hang.stop()
    f = the(findings, "sporadic_timeouts", "doc.slow")
    assert f.severity is Severity.WARNING
    assert f.title == "2 of 3 attempts on 'doc.slow' timed out"
    line = next(e for e in f.evidence if e.startswith("agent://doc-slow-01: p95 "))
    p95 = float(line.split()[2])
    assert 1100 <= p95 < 2000
    assert "per-try timeout 2000 ms" in line
    assert "requests on doc.slow answered deadline_exceeded: 2" in f.evidence
    assert "Make agent://doc-slow-01 faster" in f.next_step
    h = the(findings, "sporadic_timeouts", "doc.hang")
    assert h.severity is Severity.WARNING
    assert "attempts on doc.hang: 2, timed out: 2 (100.0%; warning from 2%)" in h.evidence
    assert "agent://doc-hang-01: no answered delivery yet (p95 unknown)" in h.evidence
    assert "hang in the agent" in h.next_step
    assert the(findings, "retry_storm").severity is Severity.OK  # no time left for retries


def test_a_retry_storm_of_failing_agents() -> None:
    with gateway() as gw:
        agents = [
            start_agent(gw.url, f"agent://doc-fail-0{i}", "fail", intents="doc.pay") for i in (1, 2)
        ]
        try:
            # 3400 ms allows one retry ((3400 - 1000) / (1.2 x 2000)): a failover, no wait
            answers = send_all(gw, [{"intent": "doc.pay", "timeout_ms": 3400}] * 10)
            assert [(s, b["error"]) for s, b in answers] == [(502, "all_attempts_failed")] * 10
            findings = doctor(gw)
        finally:
            for agent in agents:
                agent.stop()
    f = the(findings, "retry_storm")
    assert f.severity is Severity.WARNING
    assert f.title == "Retry storm: 1.00 retries a request"
    assert f.evidence[0].startswith(
        "retries: 10 (10 failover, 0 same endpoint) over 10 routed requests: 1.00 a request"
    )
    assert "requests answered all_attempts_failed: 10" in f.evidence
    assert any(
        e.startswith("doc.pay: 20 of 20 attempts failed; candidates: agent://doc-fail-01")
        for e in f.evidence
    )
    assert "'doc.pay' fails most" in f.next_step
    assert the(findings, "sporadic_timeouts").severity is Severity.OK
