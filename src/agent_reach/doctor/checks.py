"""The registry and routing checks of the doctor's checklist, and :func:`diagnose`. Pure.

:func:`diagnose` runs every check in the checklist's order (see :mod:`agent_reach.doctor`):
the empty registry, unserved intents and unrouted agents here, the traffic checks in
:mod:`agent_reach.doctor.traffic`. Where the gateway answered ``/v1/diagnostics`` the evidence
states its real heartbeat interval and thresholds; otherwise it says that defaults are assumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_reach.doctor.findings import Finding, Severity, count
from agent_reach.doctor.nearmiss import near_misses
from agent_reach.doctor.snapshot import (
    HEARTBEATS,
    REGISTRATIONS,
    REQUESTS,
    UNROUTABLE,
    Snapshot,
    UnroutedIntent,
    suggestions,
)
from agent_reach.doctor.traffic import retry_storm, sporadic_timeouts

__all__ = ["diagnose"]


def diagnose(snapshot: Snapshot) -> list[Finding]:
    """The checklist's findings for ``snapshot``, in a stable order (see the module docstring)."""
    return [
        *_registry(snapshot),
        *_unserved(snapshot),
        *_agents(snapshot),
        *sporadic_timeouts(snapshot),
        *retry_storm(snapshot),
    ]


def _declared(s: Snapshot) -> dict[str, list[str]]:
    """Declared tag -> endpoint ids declaring it (sorted)."""
    out: dict[str, list[str]] = {}
    for a in sorted(s.agents, key=lambda a: str(a.get("endpoint_id"))):
        for tag in a.get("capabilities", ()):
            out.setdefault(tag, []).append(str(a.get("endpoint_id")))
    return out


def _registry(s: Snapshot) -> list[Finding]:
    registrations = s.total(REGISTRATIONS)
    hb_ok = s.total(HEARTBEATS, result="ok")
    hb_unknown = s.total(HEARTBEATS, result="unknown")
    if s.agents:
        statuses: dict[str, int] = {}
        for a in s.agents:
            statuses[str(a.get("status"))] = statuses.get(str(a.get("status")), 0) + 1
        by_status = ", ".join(f"{n} {st}" for st, n in sorted(statuses.items()))
        return [
            Finding(
                "empty_registry",
                Severity.OK,
                f"{len(s.agents)} agent(s) registered",
                (
                    f"agents by status: {by_status}",
                    f"registrations since the gateway started: {count(registrations)}",
                    f"intents explained by /v1/route: {len(s.routes)}"
                    + (f" ({s.routes_skipped} declared ones left out)" if s.routes_skipped else ""),
                ),
                "",
            )
        ]
    evidence = (
        "agents registered: 0",
        f"registrations since the gateway started: {count(registrations)}",
        f"heartbeats answered ok: {count(hb_ok)}; "
        f"answered 404 (unknown endpoint): {count(hb_unknown)}",
        f"requests refused before routing (no capable or available agent): "
        f"{count(s.total(REQUESTS, intent=UNROUTABLE))}",
    )
    steps = [
        "Agents are failing to register. Check the agents' logs for registration errors, that "
        "they use this gateway's URL (AGENT_REACH_GATEWAY, or the gateway argument of Agent) and "
        "can reach it from where they run (the gateway's --host bind address, firewalls)."
    ]
    if registrations:
        steps.append(
            f"{count(registrations)} registration(s) were made but no record is left: the agents "
            "deregistered, or their records were purged after they went down (--purge-after); "
            "check that their heartbeat loop runs."
        )
    if hb_unknown:
        steps.append(
            f"{count(hb_unknown)} heartbeat(s) named an endpoint the gateway does not know (it "
            "restarted or purged them): an agent should register again when a heartbeat answers "
            "404 endpoint_not_registered; the agent SDK does."
        )
    return [
        Finding(
            "empty_registry", Severity.ERROR, "No agent is registered", evidence, " ".join(steps)
        )
    ]


def _unserved(s: Snapshot) -> list[Finding]:
    refused = s.total(REQUESTS, intent=UNROUTABLE, outcome="no_capable_agent")
    declared = _declared(s)
    d = s.diagnostics
    threshold = (
        f"a confidence of at least {d.confidence_threshold:g}"
        if d is not None
        else "the confidence threshold"
    )
    findings: list[Finding] = []
    for intent in sorted(s.asked):
        answer = s.routes.get(intent, {})
        error = None if answer.get("ok", True) else answer.get("error")
        if error not in ("no_capable_agent", "invalid_request"):
            continue  # served (exactly or by fallback), or a matter of the agents' status
        if error == "invalid_request":
            findings.append(
                Finding(
                    "intent_unserved",
                    Severity.WARNING,
                    f"{intent!r} is not a valid intent tag",
                    (f"/v1/route?intent={intent}: invalid_request: {answer.get('detail', '')}",),
                    "Intent tags are dot-separated lower-case segments, each starting with a "
                    "letter (e.g. weather.query): fix the tag the callers send.",
                    intent,
                )
            )
            continue
        misses = near_misses(intent, declared)
        evidence = [
            f"/v1/route?intent={intent}: no_capable_agent ({answer.get('detail', '')})",
            f"requests answered no_capable_agent since the gateway started: {count(refused)}",
        ]
        tally = s.unrouted(intent)
        if tally is not None:
            evidence.append(f"refused for {intent} (GET /v1/diagnostics): {_tally(s, tally)}")
        evidence += [
            f"near miss: {', '.join(declared[tag])} declare{'s' if len(declared[tag]) == 1 else ''}"
            f" {tag!r} ({why})"
            for tag, why in misses
        ]
        # the gateway's own matcher: the no_capable_agent answer's suggestions, else those of
        # /v1/diagnostics
        nearest = suggestions(answer.get("suggestions")) or (
            tally.suggestions if tally is not None else ()
        )
        if nearest:
            evidence.append(
                "nearest known tags (the gateway's matcher, below the threshold): "
                + ", ".join(f"{tag} ({c:.2f})" for tag, c in nearest)
            )
        if misses:
            tag = misses[0][0]
            step = (
                f"Tag mismatch: callers ask {intent!r} but {', '.join(declared[tag])} "
                f"declare{'s' if len(declared[tag]) == 1 else ''} "
                f"{tag!r}. Matching is on the whole tag, case-sensitive (a fallback match needs "
                f"{threshold}): make the callers send the declared tag, or make the agent declare "
                "the one callers use."
            )
        elif nearest:
            listed = ", ".join(repr(tag) for tag, _ in nearest)
            step = (
                f"No agent declares {intent!r}; the nearest known tags are {listed}: make the "
                "callers send one of those (or an alias of the dictionary, or their words as "
                f"intent_text), or start an agent that serves {intent!r}. GET /v1/intents "
                "lists the dictionary."
            )
        else:
            step = (
                f"No agent declares {intent!r} nor anything close to it: start an agent that "
                "serves it, or check the callers' intent against GET /v1/agents."
            )
        findings.append(
            Finding(
                "intent_unserved",
                Severity.WARNING,
                f"Callers ask {intent!r}, which no agent declares",
                tuple(evidence),
                step,
                intent,
            )
        )
    if refused and not findings and d is not None:
        # the gateway names the intents it refused, and each of them is declared now
        listed = ", ".join(f"{u.intent} ({_tally(s, u)})" for u in d.unrouted_intents)
        findings.append(
            Finding(
                "intent_unserved",
                Severity.INFO,
                f"{count(refused)} request(s) were refused as no_capable_agent; their intents "
                "are declared now",
                (
                    f"requests answered no_capable_agent since the gateway started: "
                    f"{count(refused)}",
                    f"intents refused (GET /v1/diagnostics): {listed or 'none listed'}",
                ),
                "An agent that declares them (or matches them above the confidence threshold) "
                "registered after those requests, or changed its tags: nothing to do unless the "
                "count grows again.",
            )
        )
    if refused and not findings:
        findings.append(
            Finding(
                "intent_unserved",
                Severity.WARNING,
                f"{count(refused)} request(s) asked for intents that no agent declares",
                (
                    f"requests answered no_capable_agent since the gateway started: "
                    f"{count(refused)}",
                    f"intents declared: {', '.join(sorted(declared)) or 'none'}",
                    "the metrics count these under one label (_unroutable), not by intent",
                ),
                "Find the intents the callers send in the gateway's reach.failed log lines "
                "(error no_capable_agent), then run doctor again naming them (--intent TAG) to "
                "compare them with the declared tags.",
            )
        )
    if not findings:
        findings.append(
            Finding(
                "intent_unserved",
                Severity.OK,
                "Every intent asked for is declared",
                (f"requests answered no_capable_agent: {count(refused)}",),
                "",
            )
        )
    return findings


def _beating(s: Snapshot, agent: Mapping[str, Any]) -> bool:
    """Whether the agent's last heartbeat is too recent for it to be suspect by its silence
    (under the suspect threshold: the gateway's, else 2 heartbeat intervals)."""
    seen = agent.get("last_seen_at")
    if not isinstance(seen, int | float) or isinstance(seen, bool):
        return False
    d = s.diagnostics
    if d is not None:
        suspect_after = d.suspect_after_s
    elif s.interval:
        suspect_after = 2.0 * s.interval
    else:
        return False
    return max(0.0, s.now - seen) < suspect_after


def _age_line(s: Snapshot, agent: Mapping[str, Any]) -> str:
    seen = agent.get("last_seen_at")
    if not isinstance(seen, int | float):
        return "last heartbeat: unknown"
    age = max(0.0, s.now - seen)
    interval = s.interval
    if not interval:
        return f"last heartbeat {age:.1f} s ago (heartbeat interval unknown)"
    d = s.diagnostics
    if d is None:
        thresholds = (
            "by default degraded after 1 x, suspect after 2 x, down after 3 x; the gateway does "
            "not say its own"
        )
    else:
        thresholds = (
            f"this gateway: degraded after {d.degraded_after_s:g} s, suspect after "
            f"{d.suspect_after_s:g} s, down after {d.down_after_s:g} s"
        )
    return (
        f"last heartbeat {age:.1f} s ago: {age / interval:.1f} x the {interval:g} s heartbeat "
        f"interval ({thresholds})"
    )


def _tally(s: Snapshot, u: UnroutedIntent) -> str:
    ago = max(0.0, s.now - u.last_at)
    return f"{u.count} request(s), the last {ago:.1f} s ago"


def _route_lines(s: Snapshot, agent: Mapping[str, Any]) -> tuple[list[str], bool]:
    """``/v1/route`` evidence for an agent's tags, and whether one of them has no eligible agent."""
    eid = agent.get("endpoint_id")
    lines: list[str] = []
    stranded = False
    for tag in sorted(agent.get("capabilities", ())):
        answer = s.routes.get(tag)
        if answer is None:
            continue
        if not answer.get("ok", True):
            lines.append(f"/v1/route?intent={tag}: {answer.get('error')}: {answer.get('detail')}")
            stranded = stranded or answer.get("error") == "no_available_agent"
            continue
        for c in answer.get("candidates", ()):
            if c.get("endpoint_id") == eid and not c.get("eligible", True):
                lines.append(f"/v1/route?intent={tag}: not eligible: {c.get('reason')}")
    return lines, stranded


def _agents(s: Snapshot) -> list[Finding]:
    requests_by_intent = s.by_label(REQUESTS, "intent")
    total = sum(requests_by_intent.values())
    declared = _declared(s)
    unserved = [
        i for i in s.asked if s.routes.get(i, {}).get("error") == "no_capable_agent"
    ]  # callers' intents nobody declares
    findings: list[Finding] = []
    for agent in sorted(s.agents, key=lambda a: str(a.get("endpoint_id"))):
        eid = str(agent.get("endpoint_id"))
        status = str(agent.get("status"))
        tags = sorted(agent.get("capabilities", ()))
        routes, stranded = _route_lines(s, agent)
        if status in ("suspect", "down"):
            # taken out by the passive check (a connection refused or reset): said by
            # /v1/route's reasons when another candidate is eligible; when none is, the route
            # is only no_available_agent, and a heartbeat too recent for this status says it
            ejected = any("connection refused or reset" in line for line in routes) or (
                _beating(s, agent)
            )
            evidence = [f"status: {status}", _age_line(s, agent), *routes]
            if ejected:
                step = (
                    f"The gateway could not connect to {eid} at {agent.get('endpoint_url')} "
                    "(refused or reset): check that the agent listens there and that the gateway "
                    "can reach it. Its next heartbeat brings it back."
                )
            else:
                step = (
                    f"{eid} stopped heartbeating: check that its process is alive and not stopped "
                    "or blocked, its logs for agent.gateway_unavailable, and that it reaches this "
                    "gateway. A heartbeat brings it back; down records are purged after "
                    "--purge-after."
                )
            if stranded:
                step += " Meanwhile no other agent serves some of its intents (no_available_agent)."
            findings.append(
                Finding(
                    "unrouted_agent",
                    Severity.ERROR if stranded else Severity.WARNING,
                    f"{eid} is {status}: intent routing does not choose it",
                    tuple(evidence),
                    step,
                    eid,
                )
            )
        elif status == "degraded":
            reasons = _reasons(s, agent)
            if any("slow" in r for r in reasons):
                slow = (
                    f"the gateway's {s.diagnostics.slow_threshold_ms:g} ms --slow-threshold-ms"
                    if s.diagnostics is not None
                    else "--slow-threshold-ms"
                )
                step = (
                    f"{eid} is slow (mean of its last deliveries over {slow}): make it faster or "
                    "add capacity; it gets a small probe share to show it is fast again."
                )
            else:
                step = (
                    f"{eid}'s heartbeat is late and it turns suspect next: check that its "
                    "process is not stopped or blocked and its logs for agent.gateway_unavailable."
                )
            findings.append(
                Finding(
                    "unrouted_agent",
                    Severity.INFO,
                    f"{eid} is degraded: ranked after every healthy agent",
                    ("status: degraded", _age_line(s, agent), *reasons),
                    step,
                    eid,
                )
            )
        elif total and not any(requests_by_intent.get(t) for t in tags):
            misses = [(i, why) for i in unserved for _, why in near_misses(i, tags)]
            evidence = [
                f"requests on its intents ({', '.join(tags)}): 0 of {count(total)} answered",
                *(f"callers ask {i!r} instead? ({why}; no agent declares it)" for i, why in misses),
            ]
            if misses:
                step = (
                    f"Callers ask {misses[0][0]!r}: align the tag on one side "
                    "(see intent_unserved)."
                )
            elif s.diagnostics is not None:
                step = (
                    f"No caller asked for {', '.join(tags)}, and no intent the gateway refused "
                    f"(GET /v1/diagnostics) is close to them: check that the callers meant to "
                    f"use {eid} run and send to this gateway."
                )
            else:
                step = (
                    f"No caller asked for {', '.join(tags)}: check which intents the callers "
                    "send (reach.failed log lines, --intent TAG)."
                )
            findings.append(
                Finding(
                    "unrouted_agent",
                    Severity.WARNING if misses else Severity.INFO,
                    f"{eid} was never routed: no request asked for its intents",
                    tuple(evidence),
                    step,
                    eid,
                )
            )
    if not findings:
        n = len(s.agents)
        findings.append(
            Finding(
                "unrouted_agent",
                Severity.OK,
                f"All {n} agent(s) are routable" if n else "No agent to route to",
                (f"intents declared: {len(declared)}",),
                "",
            )
        )
    return findings


def _reasons(s: Snapshot, agent: Mapping[str, Any]) -> list[str]:
    eid = agent.get("endpoint_id")
    out = []
    for tag in sorted(agent.get("capabilities", ())):
        for c in s.routes.get(tag, {}).get("candidates", ()):
            if c.get("endpoint_id") == eid:
                out.append(f"/v1/route?intent={tag}: {c.get('reason')}")
                break
    return out[:3]
