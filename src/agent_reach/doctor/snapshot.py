"""What the doctor read of a gateway, as plain values: metric samples, diagnostics, a snapshot.

Pure: parsing and look-ups only, no I/O and no clock (the snapshot carries ``now``). Reading a
live gateway is :func:`agent_reach.doctor.reading.gather`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ALL_INTENTS",
    "ATTEMPTS",
    "BUDGET",
    "DEFAULT_OVERHEAD_RESERVE_MS",
    "HEARTBEATS",
    "REGISTRATIONS",
    "REQUESTS",
    "RETRIES",
    "UNROUTABLE",
    "Diagnostics",
    "Sample",
    "Snapshot",
    "UnroutedIntent",
    "parse_metrics",
    "suggestions",
]

# --- what the gateway exports (docs/operations.md) ------------------------------------------

REQUESTS = "agent_reach_requests_total"
ATTEMPTS = "agent_reach_attempts_total"
RETRIES = "agent_reach_retries_total"
BUDGET = "agent_reach_retry_budget_exhausted_total"
HEARTBEATS = "agent_reach_heartbeats_total"
REGISTRATIONS = "agent_reach_registrations_total"
UNROUTABLE = "_unroutable"  # the requests label of requests refused before any endpoint
ALL_INTENTS = "(all intents)"  # attempts of a gateway that does not label them by intent
DEFAULT_OVERHEAD_RESERVE_MS = 1000.0  # --overhead-reserve-ms default, for gateways that do not say


class Sample(NamedTuple):
    """One sample of ``/metrics``: full sample name (``..._total``), labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> tuple[Sample, ...]:
    """The gateway's samples of a Prometheus text exposition; ValueError when it does not parse.

    Only ``agent_reach_*`` samples are kept, without histogram buckets and ``_created`` stamps.
    """
    return tuple(
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("agent_reach_") and not s.name.endswith(("_bucket", "_created"))
    )


# --- GET /v1/diagnostics (an extension beyond contract v1, docs/api.md) ----------------------


@dataclass(frozen=True, slots=True)
class UnroutedIntent:
    """An intent callers asked that no agent declared, as the gateway counted its refusals."""

    intent: str
    count: int  # requests refused with no_capable_agent (since the gateway started)
    last_at: float  # unix seconds of the latest one
    # the nearest known tags by the gateway's matcher, best first: (tag, confidence)
    suggestions: tuple[tuple[str, float], ...] = ()


def _number(answer: Mapping[str, Any], key: str) -> float:
    value = answer.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is not a number: {value!r}")
    return float(value)


def _unrouted(item: Any) -> UnroutedIntent:
    if not isinstance(item, dict) or not isinstance(item.get("intent"), str):
        raise ValueError(f"unrouted_intents has an entry without an intent: {item!r}")
    count = item.get("count")
    if isinstance(count, bool) or not isinstance(count, int):
        raise ValueError(f"unrouted_intents: count is not a whole number: {count!r}")
    return UnroutedIntent(
        item["intent"], count, _number(item, "last_at"), suggestions(item.get("suggestions"))
    )


def suggestions(items: Any) -> tuple[tuple[str, float], ...]:
    """``[{"tag", "confidence"}, ...]`` (of ``/v1/diagnostics`` or a ``no_capable_agent``
    answer) as pairs, best first; what is not of that shape is left out (a gateway without a
    dictionary or matcher sends none)."""
    if not isinstance(items, list):
        return ()
    return tuple(
        (i["tag"], float(i["confidence"]))
        for i in items
        if isinstance(i, dict)
        and isinstance(i.get("tag"), str)
        and isinstance(i.get("confidence"), int | float)
        and not isinstance(i.get("confidence"), bool)
    )


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """The answer of ``GET /v1/diagnostics``: the settings that decide health and retries, and
    the intents callers asked that no agent declares (most recently refused first)."""

    heartbeat_interval_s: float
    degraded_after_s: float
    suspect_after_s: float
    down_after_s: float
    slow_threshold_ms: float
    overhead_reserve_ms: float
    confidence_threshold: float
    unrouted_intents: tuple[UnroutedIntent, ...] = ()

    @classmethod
    def from_answer(cls, answer: Any) -> Diagnostics:
        """Parse the endpoint's JSON answer; ValueError naming the field that is wrong.

        Fields this version does not know are ignored (a newer gateway may add some).
        """
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            raise ValueError("not an object with ok: true")
        items = answer.get("unrouted_intents")
        if not isinstance(items, list):
            raise ValueError(f"unrouted_intents is not a list: {items!r}")
        return cls(
            _number(answer, "heartbeat_interval_s"),
            _number(answer, "degraded_after_s"),
            _number(answer, "suspect_after_s"),
            _number(answer, "down_after_s"),
            _number(answer, "slow_threshold_ms"),
            _number(answer, "overhead_reserve_ms"),
            _number(answer, "confidence_threshold"),
            tuple(_unrouted(item) for item in items),
        )


# --- the snapshot ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What was read from a live gateway, at about the same time.

    ``agents`` are the contract's AGENT objects of ``/v1/agents``; ``routes`` maps an intent to
    the answer of ``/v1/route?intent=...`` (the explanation, or the error body); ``asked`` are the
    intents callers use: those the operator named, then those the gateway refused as
    ``no_capable_agent`` (``diagnostics``); ``now`` is unix seconds, comparable to
    ``last_seen_at``. ``diagnostics`` is None for a gateway without ``/v1/diagnostics``: the
    checks then assume the default thresholds and overhead reserve, and say so.
    """

    agents: tuple[Mapping[str, Any], ...]
    routes: Mapping[str, Mapping[str, Any]]
    metrics: tuple[Sample, ...]
    now: float
    heartbeat_interval: float | None = None  # seconds, when the gateway or the operator says
    asked: tuple[str, ...] = ()
    timeout_ms: int | None = None  # the deadline the routes were explained for (None: default)
    routes_skipped: int = 0  # declared intents not explained (over the route limit)
    diagnostics: Diagnostics | None = None  # the answer of /v1/diagnostics, when the gateway has it

    @property
    def interval(self) -> float | None:
        """The heartbeat interval in seconds: the gateway's when it says, else the operator's."""
        d = self.diagnostics
        return d.heartbeat_interval_s if d is not None else self.heartbeat_interval

    @property
    def overhead_reserve_ms(self) -> float:
        """The gateway's overhead reserve (the default when the gateway does not say)."""
        d = self.diagnostics
        return d.overhead_reserve_ms if d is not None else DEFAULT_OVERHEAD_RESERVE_MS

    def unrouted(self, intent: str) -> UnroutedIntent | None:
        """The gateway's count of refusals of ``intent`` (None when it did not report one)."""
        if self.diagnostics is None:
            return None
        return next((u for u in self.diagnostics.unrouted_intents if u.intent == intent), None)

    def candidates(self, intent: str) -> Sequence[Mapping[str, Any]]:
        """The candidates ``/v1/route`` listed for ``intent`` (none for an error answer)."""
        answer = self.routes.get(intent, {})
        return answer.get("candidates", ()) if answer.get("ok", False) else ()

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels``."""
        return sum(
            s.value
            for s in self.metrics
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """Sums of the samples called ``name`` (matching ``labels``) per value of ``label``.

        Samples without ``label`` count under ``(all intents)``.
        """
        out: dict[str, float] = {}
        for s in self.metrics:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                key = s.labels.get(label, ALL_INTENTS)
                out[key] = out.get(key, 0.0) + s.value
        return out
