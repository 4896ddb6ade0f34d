"""Prometheus metrics of one gateway, on a registry of its own (no process globals).

Named by the Prometheus conventions: ``agent_reach_`` prefix, base units (seconds), counters
ending in ``_total``, durations as ``_seconds`` histograms. Every metric is listed in
docs/operations.md. What is derived from state (endpoints by status, heartbeat ages, the trace
store's size) is computed at scrape time, so that it costs the request paths nothing.

Invariants:

- The ``intent`` label (requests, request durations, attempts) takes a registered tag, or one of
  the gateway's own values, which start with ``_`` and so are never tags (``_unroutable``,
  ``_other``). Tags come from whoever registers (open mode), so the label set is bounded twice:
  a tag's series are dropped once no endpoint declares it (:meth:`GatewayMetrics.follow`), and at
  most :data:`MAX_INTENT_LABELS` tags have series of their own at once; the tags seen past that
  count under :data:`OTHER_INTENTS`, for as long as they are declared. The ``domain`` label of
  forwards takes at most :data:`MAX_DOMAIN_LABELS` domains, then ``_other``. Every other label
  takes values from a fixed set in the code (outcomes, error codes, actions, statuses, kinds,
  the bounds of ``agent_reach_bound_hits_total``).
- The exposition is generated off the event loop (:meth:`GatewayMetrics.scrape`): what the
  loop mutates without locks (the registry's view, the router's health state, the trace store)
  is read on the loop into plain values first; the client library's metrics lock their own
  state, so the worker thread reads them while the loop keeps counting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agent_reach.core.model import EndpointRecord
from agent_reach.observability.gcpause import GC_PAUSE_BUCKETS, GcPauses, GcPauseSnapshot
from agent_reach.observability.logs import log
from agent_reach.registry.base import RegistryBackend, RegistryChange, RegistryState

__all__ = ["MAX_INTENT_LABELS", "OTHER_INTENTS", "GatewayMetrics"]

MAX_INTENT_LABELS = 1_000
"""Tags with series of their own at once; past it, new tags count under :data:`OTHER_INTENTS`."""

OTHER_INTENTS = "_other"
"""The ``intent`` label of the tags seen past :data:`MAX_INTENT_LABELS` (``other`` is a valid
tag, so the gateway's own values start with ``_``, as ``_unroutable`` does)."""

MAX_DOMAIN_LABELS = 1_024
"""Distinct ``domain`` values of ``agent_reach_forwards_total``; past it, new domains count under
:data:`OTHER_INTENTS` (domains come and go through the directory over a process's life)."""

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

# heartbeat-age buckets, as multiples of the heartbeat interval: SDK agents beat every 0.6-0.8 x
_AGE_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class _Watched(NamedTuple):
    """What :meth:`GatewayMetrics.watch` reads at each scrape."""

    records: Callable[[], Iterable[EndpointRecord]]
    now: Callable[[], float]
    interval_s: float
    trace_count: Callable[[], int]


class _State(NamedTuple):
    """The gateway state one scrape exports, read on the loop (plain values only)."""

    status_counts: dict[str, int]
    registry: RegistryState | None
    now: float
    last_seen: list[float] | None  # None: not watched
    interval_s: float
    trace_count: int
    nats: NatsLinkState | None = None  # None: no NATS link
    bound_hits: dict[str, int] | None = None  # bound name -> times hit (watch_bound)
    gc_pauses: GcPauseSnapshot | None = None


class NatsLinkState(Protocol):
    """What ``/metrics`` reads of a NATS link (:class:`~agent_reach.transport.natslink.NatsState`
    has it)."""

    @property
    def connected(self) -> bool: ...
    @property
    def reconnects(self) -> int: ...
    @property
    def slow_consumers(self) -> int: ...
    @property
    def unreadable(self) -> int: ...


class _Exposition(Collector):
    """One scrape: the metrics' registry, then the families derived from a state snapshot.

    Its ``collect`` runs in a worker thread and reads nothing the loop mutates without a lock.
    """

    def __init__(self, registry: CollectorRegistry, state: _State) -> None:
        self._registry = registry
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        state = self._state
        endpoints = GaugeMetricFamily(
            "agent_reach_endpoints", "Registered endpoints by derived status", labels=["status"]
        )
        for status, n in state.status_counts.items():
            endpoints.add_metric([status], n)
        yield endpoints
        if state.registry is not None:
            available = GaugeMetricFamily(
                "agent_reach_registry_available",
                "1 while the registry's shared store is reachable (0: routing on the last view)",
                labels=["backend"],
            )
            available.add_metric([state.registry.backend], 1.0 if state.registry.available else 0.0)
            yield available
            if state.registry.last_sync_age_s is not None:
                yield GaugeMetricFamily(
                    "agent_reach_registry_sync_age_seconds",
                    "Age of the local view's last successful sync with the shared registry",
                    value=state.registry.last_sync_age_s,
                )
        if state.nats is not None:
            yield from _nats_families(state.nats)
        if state.gc_pauses is not None:
            yield _gc_pause_family(state.gc_pauses)
        if state.bound_hits:
            hits = CounterMetricFamily(
                "agent_reach_bound_hits",
                "Times a bounded queue, cache or table of the gateway was at its bound and "
                "refused, dropped or cleared something (docs/operations.md, Bounds)",
                labels=["bound"],
            )
            for name, n in state.bound_hits.items():
                hits.add_metric([name], n)
            yield hits
        if state.last_seen is not None:
            yield from _heartbeat_families(state.now, state.last_seen, state.interval_s)
            yield GaugeMetricFamily(
                "agent_reach_trace_store_traces",
                "Trace ids held by the trace store (GET /v1/traces/ID)",
                value=state.trace_count,
            )


def _nats_families(link: NatsLinkState) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "agent_reach_nats_connected",
        "1 while the gateway's link to NATS is up (0: NATS endpoints and the NATS API are "
        "unreachable; HTTP is still served)",
        value=1.0 if link.connected else 0.0,
    )
    yield CounterMetricFamily(
        "agent_reach_nats_reconnects",
        "Times the link to NATS was made again since start",
        value=link.reconnects,
    )
    yield CounterMetricFamily(
        "agent_reach_nats_slow_consumer_drops",
        "Messages dropped because a responder of the gateway's NATS API fell behind",
        value=link.slow_consumers,
    )
    yield CounterMetricFamily(
        "agent_reach_nats_unreadable_messages",
        "Messages dropped because the NATS client could not read them (a reply subject that is "
        "not UTF-8): their requesters time out",
        value=link.unreadable,
    )


def _gc_pause_family(pauses: GcPauseSnapshot) -> Metric:
    family = HistogramMetricFamily(
        "agent_reach_gc_pause_seconds",
        "Collections of Python's cyclic garbage collector, by generation, and how long each "
        "stopped the process (the event loop with it)",
        labels=["generation"],
    )
    for generation, (counts, total) in enumerate(zip(pauses.counts, pauses.sums, strict=True)):
        family.add_metric([str(generation)], _cumulative(GC_PAUSE_BUCKETS, counts), total)
    return family


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """Exposition buckets (``le``, cumulative count) of ``counts`` per bucket, one more than
    ``bounds`` (the last for +Inf)."""
    cumulative, buckets = 0, []
    for bound, n in zip([*map(floatToGoString, bounds), "+Inf"], counts, strict=True):
        cumulative += n
        buckets.append((bound, float(cumulative)))
    return buckets


def _heartbeat_families(now: float, last_seen: list[float], interval_s: float) -> Iterator[Metric]:
    """Heartbeat ages (a gauge histogram, buckets in multiples of the interval), the interval."""
    bounds = [interval_s * m for m in _AGE_BUCKETS]
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for seen in last_seen:
        age = max(0.0, now - seen)
        total += age
        for i, bound in enumerate(bounds):
            if age <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    yield GaugeHistogramMetricFamily(
        "agent_reach_heartbeat_age_seconds",
        "Time since each registered endpoint's last heartbeat, at scrape time (heartbeat lag)",
        buckets=_cumulative(bounds, counts),
        gsum_value=total,
    )
    yield GaugeMetricFamily(
        "agent_reach_heartbeat_interval_seconds",
        "The heartbeat interval agents are told to keep",
        value=interval_s,
    )


class _Series:
    """The label children of one ``intent`` label value, made on first use (hot path cache)."""

    __slots__ = ("attempts", "duration", "label", "requests")

    def __init__(self, label: str) -> None:
        self.label = label
        self.requests: dict[str, Counter] = {}  # outcome -> child
        self.duration: Histogram | None = None
        self.attempts: dict[str, Counter] = {}  # outcome -> child


class GatewayMetrics:
    """Counters and histograms of requests, attempts, retries and heartbeats.

    Wiring: :meth:`follow` the registry (drops the series of tags nobody declares any more),
    :meth:`watch` the gateway state, and serve ``await scrape()`` on ``GET /metrics``.
    """

    def __init__(
        self,
        status_counts: Callable[[], dict[str, int]],
        registry_state: Callable[[], RegistryState] | None = None,
        *,
        scan: Callable[[], Awaitable[tuple[dict[str, int], list[float]]]] | None = None,
    ) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        # python_gc_*: the cyclic collector's runs and what they found; garbage in cycles made
        # per request pauses the loop (docs/reliability.md, F11), and this is where it shows
        GCCollector(registry=r)
        # ... and how long each collection stopped the loop: timed while the gateway serves
        # (GcPauses.installed; docs/reliability.md, F20)
        self.gc_pauses = GcPauses()
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
        self.resends = Counter(
            "agent_reach_transport_resends",
            "Requests sent again on a fresh connection inside their attempt: the agent closed "
            "the idle pooled connection they went out on (the keep-alive race; not a retry)",
            registry=r,
        )
        self.retry_budget_exhausted = Counter(
            "agent_reach_retry_budget_exhausted", "Retries refused by the retry budget", registry=r
        )
        self.hedges = Counter(
            "agent_reach_hedges",
            "Hedged attempts (the dictionary's hedge_after_ms), by result: sent, won (the "
            "hedge's ok answer was the request's), refused (by the retry budget)",
            ["result"],
            registry=r,
        )
        self.heartbeats = Counter(
            "agent_reach_heartbeats", "Heartbeats received, by result", ["result"], registry=r
        )
        self.registrations = Counter(
            "agent_reach_registrations", "Registrations (new or replacing)", registry=r
        )
        self.denied = Counter(
            "agent_reach_denied",
            "Requests refused by access control (401, 403, 429) and registrations refused at"
            " --max-endpoints (503), by action and status",
            ["action", "status"],
            registry=r,
        )
        # the intent dictionary and matching (docs/intents.md); labels from fixed sets
        self.matches = Counter(
            "agent_reach_matches",
            "Sends and dry runs routed by intent, by how the tag matched (exact, alias, "
            "semantic, lexical, hint)",
            ["method"],
            registry=r,
        )
        self.refused_with_suggestions = Counter(
            "agent_reach_refused_with_suggestions",
            "no_capable_agent answers that carried suggestions (tags below the threshold)",
            registry=r,
        )
        self.unknown_intents = Counter(
            "agent_reach_unknown_intent_registrations",
            "Registrations declaring tags outside the dictionary, by what the mode did "
            "(warn: registered; strict: refused)",
            ["mode"],
            registry=r,
        )
        self.deprecated_requests = Counter(
            "agent_reach_deprecated_intent_requests",
            "Requests routed on a tag the dictionary marks deprecated",
            registry=r,
        )
        self.nats_api = Counter(
            "agent_reach_nats_api_requests",
            "Requests to the gateway's API over NATS (PREFIX.v1.*), by operation and the HTTP "
            "status of the answer (its Reach-Status)",
            ["op", "status"],
            registry=r,
        )
        self.overloaded = Counter(
            "agent_reach_overloaded",
            "Requests refused at admission (503 overloaded: --max-inflight), by priority",
            ["priority"],
            registry=r,
        )
        self.in_delivery = Gauge(
            "agent_reach_requests_in_delivery",
            "Requests taken into delivery and not yet answered (against --max-inflight)",
            registry=r,
        )
        self.slot_waiting = Gauge(
            "agent_reach_slot_waiting",
            "Requests waiting for a free attempt slot (every candidate at"
            " --max-inflight-per-endpoint)",
            registry=r,
        )
        self.slot_refused = Gauge(
            "agent_reach_slot_wait_refused",
            "Requests refused because their intent's wait queue was full (503 overloaded; a"
            " retry after an attempt that reached an agent: all_attempts_failed), since start",
            registry=r,
        )
        self.slot_served = Gauge(
            "agent_reach_slot_wait_served",
            "Requests that waited for a free slot and got one, since start",
            registry=r,
        )
        # the HTTP edge's bounds (edges/http/server.py), each also a throttled WARNING line
        self.http_malformed = Counter(
            "agent_reach_http_malformed",
            "Malformed HTTP requests answered 4xx by the edge (http.malformed)",
            registry=r,
        )
        self.http_evicted = Counter(
            "agent_reach_http_connections_closed_at_bound",
            "Connections closed to keep the open ones within --max-connections"
            " (http.connections_full)",
            registry=r,
        )
        self.http_read_timeouts = Counter(
            "agent_reach_http_read_timeouts",
            "Connections closed because a request did not arrive whole within --read-timeout"
            " of its first byte (http.read_timeout)",
            registry=r,
        )
        self.forwards = Counter(
            "agent_reach_forwards",
            "Requests forwarded to another domain's gateway (federation), by domain and the "
            "attempt's outcome (ok, timeout, connect_error, agent_error, server_error)",
            ["domain", "outcome"],
            registry=r,
        )
        self.summaries_published = Counter(
            "agent_reach_federation_publications",
            "Publications of this domain's summary to the directory, by result (ok, failed)",
            ["result"],
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
        self.heartbeats_ok = self.heartbeats.labels("ok")
        self.heartbeats_unknown = self.heartbeats.labels("unknown")
        self._status_counts = status_counts
        # what a scrape reads of every endpoint when given (statuses counted, heartbeat ages),
        # a chunk per turn of the loop: the records it reads stand for those of watch() (the
        # node gives both from its one registry)
        self._scan = scan
        self._registry_state = registry_state
        self._watched: _Watched | None = None
        self._nats_state: Callable[[], NatsLinkState] | None = None
        self._bounds: dict[str, Callable[[], int]] = {}  # bound name -> times hit, read
        self._domains: set[str] = set()  # domains with forwards series of their own
        self._followed: RegistryBackend | None = None
        # tag (or own label) -> its series; the tags past the cap share the _other series
        self._series: dict[str, _Series] = {}
        self._own = 0  # tags with series of their own
        self._other = _Series(OTHER_INTENTS)
        # tags given series while nobody declared them (a request in flight across the last
        # deregistration): dropped at the next registry change or after the next scrape
        self._orphans: set[str] = set()
        self._scraping = asyncio.Lock()

    # --- wiring ----------------------------------------------------------------------------

    def follow(self, registry: RegistryBackend) -> None:
        """Drop the series of a tag once no endpoint of ``registry`` declares it (by listening
        to its changes; call once, before traffic). Without it, only the cap bounds the label
        set, and the series of departed tags stay until the process ends."""
        self._followed = registry
        registry.subscribe(self._changed)

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
        self._watched = _Watched(records, now, heartbeat_interval_s, trace_count)

    def watch_nats(self, state: Callable[[], NatsLinkState]) -> None:
        """Export the NATS link's state (connected, reconnects, slow-consumer drops), read at
        each scrape. Call once, when the gateway has a link."""
        self._nats_state = state

    def watch_bound(self, name: str, hits: Callable[[], int]) -> None:
        """Export ``hits()`` (a count that only grows) as
        ``agent_reach_bound_hits_total{bound=name}``, read at each scrape: the times a bounded
        structure was at its bound. The names are fixed at wiring: a bounded label set."""
        self._bounds[name] = hits

    # --- the hot paths ---------------------------------------------------------------------

    def forwarded(self, domain: str, outcome: str) -> None:
        """Count one forward to ``domain``: past :data:`MAX_DOMAIN_LABELS` distinct domains,
        new ones count under ``_other``."""
        domains = self._domains
        if domain not in domains:
            if len(domains) >= MAX_DOMAIN_LABELS:
                domain = OTHER_INTENTS
            else:
                domains.add(domain)
        self.forwards.labels(domain, outcome).inc()

    def request_done(self, intent: str, outcome: str, seconds: float) -> None:
        """Count one answered request (``intent``: the registered tag routed on, or
        ``_unroutable``; ``outcome``: ``ok`` or an error code)."""
        series = self._series.get(intent)
        if series is None:
            series = self._admit(intent)
        child = series.requests.get(outcome)
        if child is None:
            child = series.requests[outcome] = self.requests.labels(series.label, outcome)
        child.inc()
        duration = series.duration
        if duration is None:
            duration = series.duration = self.request_seconds.labels(series.label)
        duration.observe(seconds)

    def attempt_done(self, intent: str, outcome: str, seconds: float) -> None:
        """Count one delivery attempt (``intent``: the registered tag, as for requests)."""
        series = self._series.get(intent)
        if series is None:
            series = self._admit(intent)
        child = series.attempts.get(outcome)
        if child is None:
            child = series.attempts[outcome] = self.attempts.labels(series.label, outcome)
        child.inc()
        self.attempt_seconds.observe(seconds)

    def _admit(self, intent: str) -> _Series:
        """The series of a label value seen for the first time (or since it was dropped)."""
        if intent.startswith("_"):  # the gateway's own values: never tags, never dropped
            series = _Series(intent)
        elif self._own < MAX_INTENT_LABELS:
            series = _Series(intent)
            self._own += 1
        else:
            series = self._other
        self._series[intent] = series
        followed = self._followed
        if followed is not None and not intent.startswith("_") and not followed.by_intent(intent):
            self._orphans.add(intent)
        return series

    # --- the label set ---------------------------------------------------------------------

    def _changed(self, change: RegistryChange) -> None:
        """Registry listener: drop the tags ``change`` took from the last endpoint declaring
        them. Quick (heartbeats come through here too) and never raises."""
        if self._orphans:
            self._drop_orphans()
        before = change.before
        after = change.after
        if before is None or (after is not None and after.capabilities == before.capabilities):
            return
        followed = self._followed
        assert followed is not None  # subscribed by follow()
        kept = () if after is None else after.capabilities
        series = self._series
        for tag in before.capabilities:
            if tag not in kept and tag in series and not followed.by_intent(tag):
                self._drop(tag)

    def _drop_orphans(self) -> None:
        followed = self._followed
        assert followed is not None  # orphans are only found with a followed registry
        for tag in self._orphans:
            if not followed.by_intent(tag):
                self._drop(tag)
        self._orphans.clear()

    def _drop(self, tag: str) -> None:
        """Remove the series of ``tag`` (those under ``_other`` stay: other tags share them)."""
        series = self._series.pop(tag, None)
        if series is None or series.label != tag:
            return
        self._own -= 1
        for outcome in series.requests:
            self.requests.remove(tag, outcome)
        if series.duration is not None:
            self.request_seconds.remove(tag)
        for outcome in series.attempts:
            self.attempts.remove(tag, outcome)

    # --- scrapes ---------------------------------------------------------------------------

    async def scrape(self) -> bytes:
        """The Prometheus text exposition, generated in a worker thread so that a large one
        does not stop the event loop (the state it derives from is read here first, cheaply).

        Scrapes run one at a time; a scrape cancelled (the client went away) ends when its
        thread does, so that abandoned scrapes cannot pile up threads."""
        async with self._scraping:
            exposition = _Exposition(self.registry, await self._read_state())
            work = asyncio.ensure_future(asyncio.to_thread(generate_latest, exposition))
            try:
                body = await asyncio.shield(work)
            except asyncio.CancelledError:
                await asyncio.wait([work])
                if not work.cancelled() and (error := work.exception()) is not None:
                    log(logging.ERROR, "metrics.scrape_failed", error=repr(error))
                raise
        if self._orphans:
            self._drop_orphans()
        return body

    def render(self) -> bytes:
        """:meth:`scrape`, on the calling thread (tests and tools; a gateway serves scrape)."""
        body = generate_latest(_Exposition(self.registry, self._state()))
        if self._orphans:
            self._drop_orphans()
        return body

    async def _read_state(self) -> _State:
        """:meth:`_state`, its reads of every endpoint (``scan``) a chunk per turn of the loop
        (at 50,000 endpoints the statuses took ~50 ms in one go, the heartbeat ages ~2.5 ms)."""
        if self._scan is None:
            return self._state()
        counts, last_seen = await self._scan()
        return self._state(counts, last_seen)

    def _state(
        self, status_counts: dict[str, int] | None = None, last_seen: list[float] | None = None
    ) -> _State:
        """The gateway state a scrape exports, read now (on the loop: O(endpoints)), with
        ``status_counts`` and ``last_seen`` when they were read already (``now`` is read after
        them: no age comes out negative)."""
        if status_counts is None:
            status_counts = self._status_counts()
        registry = self._registry_state() if self._registry_state is not None else None
        nats = self._nats_state() if self._nats_state is not None else None
        hits = {name: read() for name, read in sorted(self._bounds.items())}
        gc_pauses = self.gc_pauses.snapshot()
        watched = self._watched
        if watched is None:
            return _State(status_counts, registry, 0.0, None, 0.0, 0, nats, hits, gc_pauses)
        return _State(
            status_counts,
            registry,
            watched.now(),
            [record.last_seen for record in watched.records()] if last_seen is None else last_seen,
            watched.interval_s,
            watched.trace_count(),
            nats,
            hits,
            gc_pauses,
        )
