"""Prometheus metrics of one gateway, on a registry of its own (no process globals).

Named by the Prometheus conventions: ``agent_reach_`` prefix, base units (seconds), counters
ending in ``_total``, durations as ``_seconds`` histograms. Every metric is listed in
docs/operations.md. What is derived from state (endpoints by status, heartbeat ages, the trace
store's size) is computed at scrape time, so that it costs the request paths nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent_reach.core.model import EndpointRecord
from agent_reach.registry.base import RegistryState

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class _StatusCollector(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "agent_reach_endpoints", "Registered endpoints by derived status", labels=["status"]
        )
        for status, n in self._counts().items():
            family.add_metric([status], n)
        yield family


class _RegistryCollector(Collector):
    def __init__(self, state: Callable[[], RegistryState]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        available = GaugeMetricFamily(
            "agent_reach_registry_available",
            "1 while the registry's shared store is reachable (0: routing on the last view)",
            labels=["backend"],
        )
        available.add_metric([state.backend], 1.0 if state.available else 0.0)
        yield available
        if state.last_sync_age_s is not None:
            yield GaugeMetricFamily(
                "agent_reach_registry_sync_age_seconds",
                "Age of the local view's last successful sync with the shared registry",
                value=state.last_sync_age_s,
            )


# heartbeat-age buckets, as multiples of the heartbeat interval: SDK agents beat every 0.6-0.8 x
_AGE_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class _StateCollector(Collector):
    """Heartbeat ages and the trace store's size, read at scrape time."""

    def __init__(
        self,
        records: Callable[[], Iterable[EndpointRecord]],
        now: Callable[[], float],
        interval_s: float,
        trace_count: Callable[[], int],
    ) -> None:
        self._records = records
        self._now = now
        self._interval = interval_s
        self._bounds = [interval_s * m for m in _AGE_BUCKETS]
        self._trace_count = trace_count

    def collect(self) -> Iterator[Metric]:
        now = self._now()
        bounds = self._bounds
        counts = [0] * (len(bounds) + 1)
        total = 0.0
        for record in self._records():
            age = max(0.0, now - record.last_seen)
            total += age
            for i, bound in enumerate(bounds):
                if age <= bound:
                    counts[i] += 1
                    break
            else:
                counts[-1] += 1
        cumulative = 0
        buckets = []
        for bound, n in zip([*map(floatToGoString, bounds), "+Inf"], counts, strict=True):
            cumulative += n
            buckets.append((bound, float(cumulative)))
        yield GaugeHistogramMetricFamily(
            "agent_reach_heartbeat_age_seconds",
            "Time since each registered endpoint's last heartbeat, at scrape time (heartbeat lag)",
            buckets=buckets,
            gsum_value=total,
        )
        yield GaugeMetricFamily(
            "agent_reach_heartbeat_interval_seconds",
            "The heartbeat interval agents are told to keep",
            value=self._interval,
        )
        yield GaugeMetricFamily(
            "agent_reach_trace_store_traces",
            "Trace ids held by the trace store (GET /v1/traces/ID)",
            value=self._trace_count(),
        )


class GatewayMetrics:
    """Counters and histograms of requests, attempts, retries and heartbeats."""

    def __init__(
        self,
        status_counts: Callable[[], dict[str, int]],
        registry_state: Callable[[], RegistryState] | None = None,
    ) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "agent_reach_requests",
            "Reach requests answered, by intent and outcome",
            ["intent", "outcome"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "agent_reach_request_duration_seconds",
            "Time to answer a reach request",
            ["intent"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.attempts = Counter(
            "agent_reach_attempts",
            "Delivery attempts, by intent and outcome",
            ["intent", "outcome"],
            registry=r,
        )
        self.attempt_seconds = Histogram(
            "agent_reach_attempt_duration_seconds",
            "Duration of one delivery attempt",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "agent_reach_retries",
            "Retries, by kind (failover or same endpoint)",
            ["kind"],
            registry=r,
        )
        self.retry_budget_exhausted = Counter(
            "agent_reach_retry_budget_exhausted", "Retries refused by the retry budget", registry=r
        )
        self.heartbeats = Counter(
            "agent_reach_heartbeats", "Heartbeats received, by result", ["result"], registry=r
        )
        self.registrations = Counter(
            "agent_reach_registrations", "Registrations (new or replacing)", registry=r
        )
        self.denied = Counter(
            "agent_reach_denied",
            "Requests refused by access control (401, 403, 429), by action and status",
            ["action", "status"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "agent_reach_event_loop_lag_seconds", "Last measured event-loop lag", registry=r
        )
        self.stall_credit = Gauge(
            "agent_reach_stall_credit_seconds",
            "Total gateway stall time credited to every endpoint's lease",
            registry=r,
        )
        r.register(_StatusCollector(status_counts))
        if registry_state is not None:
            r.register(_RegistryCollector(registry_state))
        self.heartbeats_ok = self.heartbeats.labels("ok")
        self.heartbeats_unknown = self.heartbeats.labels("unknown")
        self._requests: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._attempts: dict[tuple[str, str], Counter] = {}

    def watch(
        self,
        *,
        records: Callable[[], Iterable[EndpointRecord]],
        now: Callable[[], float],
        heartbeat_interval_s: float,
        trace_count: Callable[[], int],
    ) -> None:
        """Export the heartbeat ages of ``records`` (``last_seen`` against ``now``, the liveness
        clock) and the trace store's size; read at each scrape. Call once."""
        self.registry.register(_StateCollector(records, now, heartbeat_interval_s, trace_count))

    def request_done(self, intent: str, outcome: str, seconds: float) -> None:
        """Count one answered request (label children cached: this is on the hot path)."""
        key = (intent, outcome)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = (
                self.requests.labels(intent, outcome),
                self.request_seconds.labels(intent),
            )
        child[0].inc()
        child[1].observe(seconds)

    def attempt_done(self, intent: str, outcome: str, seconds: float) -> None:
        """Count one delivery attempt (``intent``: the registered tag, as for requests)."""
        key = (intent, outcome)
        child = self._attempts.get(key)
        if child is None:
            child = self._attempts[key] = self.attempts.labels(intent, outcome)
        child.inc()
        self.attempt_seconds.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
