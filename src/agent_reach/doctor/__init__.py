"""``agent-reach doctor``: the troubleshooting checklist, run against what a live gateway shows.

Split the house way. :func:`gather` (:mod:`~agent_reach.doctor.reading`) reads a gateway through
two injected async callables (the only I/O here, so the command line can pass the client SDK's
methods) into a :class:`Snapshot` (:mod:`~agent_reach.doctor.snapshot`); :func:`diagnose`
(:mod:`~agent_reach.doctor.checks`, :mod:`~agent_reach.doctor.traffic`) is pure (no I/O, no
clock: the snapshot carries ``now``) and turns a snapshot into :class:`Finding` s, each with its
evidence in numbers and the next step. Near misses of intent tags are
:mod:`~agent_reach.doctor.nearmiss`.

A gateway that answers ``GET /v1/diagnostics`` (an extension beyond contract v1) tells the doctor
its heartbeat interval, thresholds and overhead reserve, and the intents callers asked that no
agent declares; with an older gateway the doctor assumes the defaults and knows only the intents
the operator names.

The checks, in this order (each one that finds nothing says so with one ``ok`` finding):

1. ``empty_registry``: no agent is registered, so agents fail to register.
2. ``intent_unserved``: callers ask for intents that no agent declares (``no_capable_agent``);
   for each intent the caller uses that the snapshot explains, the declared tags that nearly
   match it (a typo, a dotted prefix, the same segments in another order, the same last segment)
   and the nearest known tags by the gateway's own matcher, with their confidences (the
   ``suggestions`` of its ``no_capable_agent`` answer, or of ``/v1/diagnostics``).
3. ``unrouted_agent``: an agent that intent routing does not choose now (suspect or down, with its
   heartbeat age against the interval and ``/v1/route``'s reason), routes after others (degraded),
   or was never asked for (no request on any of its tags while the gateway answered others).
4. ``sporadic_timeouts``: per intent, attempts that timed out, and candidates whose p95 latency is
   close to their per-try timeout.
5. ``retry_storm``: retries per routed request, retries refused by the retry budget, and the
   intents whose attempts fail most.

Invariants:
- :func:`diagnose` is deterministic: the same snapshot gives the same findings in the same order
  (checks in the order above; within a check, by intent or endpoint id).
- Counters are the gateway's since it started: ratios are over its whole life, not a window.
- Every threshold is a module constant; the evidence of a ratio states its threshold.
"""

from __future__ import annotations

from agent_reach.doctor.checks import diagnose
from agent_reach.doctor.findings import Finding, Severity, worst
from agent_reach.doctor.nearmiss import NEAR_MISS_LIMIT, NEAR_MISS_MAX_EDITS, near_misses
from agent_reach.doctor.reading import ROUTE_LIMIT, GetJson, GetText, gather
from agent_reach.doctor.snapshot import (
    Diagnostics,
    Sample,
    Snapshot,
    UnroutedIntent,
    parse_metrics,
)
from agent_reach.doctor.traffic import (
    NEAR_TIMEOUT_RATIO,
    RETRY_MIN_REQUESTS,
    RETRY_RATIO_WARN,
    TIMEOUT_SHARE_WARN,
)

__all__ = [
    "NEAR_MISS_LIMIT",
    "NEAR_MISS_MAX_EDITS",
    "NEAR_TIMEOUT_RATIO",
    "RETRY_MIN_REQUESTS",
    "RETRY_RATIO_WARN",
    "ROUTE_LIMIT",
    "TIMEOUT_SHARE_WARN",
    "Diagnostics",
    "Finding",
    "GetJson",
    "GetText",
    "Sample",
    "Severity",
    "Snapshot",
    "UnroutedIntent",
    "diagnose",
    "gather",
    "near_misses",
    "parse_metrics",
    "worst",
]
