"""The metrics' intent label set stays bounded: series of departed tags are dropped, past the
cap tags count as ``_other``. Driven through a real MemoryRegistry, read from the exposition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agent_reach.core.model import EndpointRecord
from agent_reach.gateway.metrics import (
    MAX_DOMAIN_LABELS,
    MAX_INTENT_LABELS,
    OTHER_INTENTS,
    GatewayMetrics,
)
from agent_reach.registry.memory import MemoryRegistry

INTENT_FAMILIES = (
    "agent_reach_requests",
    "agent_reach_request_duration_seconds",
    "agent_reach_attempts",
)


def record(endpoint_id: str, *tags: str, seen: float = 0.0) -> EndpointRecord:
    return EndpointRecord(
        f"agent://{endpoint_id}", tags, "http://127.0.0.1:9/reach", "", seen, seen
    )


def followed() -> tuple[GatewayMetrics, MemoryRegistry]:
    registry = MemoryRegistry()
    metrics = GatewayMetrics(lambda: {"healthy": len(registry)}, registry.state)
    metrics.follow(registry)
    metrics.watch(
        records=registry.records, now=lambda: 0.0, heartbeat_interval_s=10.0, trace_count=lambda: 0
    )
    return metrics, registry


def observe(metrics: GatewayMetrics, tag: str, outcome: str = "ok") -> None:
    metrics.request_done(tag, outcome, 0.01)
    metrics.attempt_done(tag, outcome, 0.01)


def intents(text: str | list[Metric]) -> dict[str, set[str]]:
    """family -> the intent label values it has series for, in an exposition."""
    out: dict[str, set[str]] = {name: set() for name in INTENT_FAMILIES}
    for family in parse(text):
        if family.name in out:
            out[family.name] |= {s.labels["intent"] for s in family.samples}
    return out


def children(metric: Counter | Histogram) -> set[tuple[tuple[str, str], ...]]:
    """The label sets a metric has children for (a histogram's ``le`` aside)."""
    samples = next(iter(metric.collect())).samples
    return {tuple((k, v) for k, v in sorted(s.labels.items()) if k != "le") for s in samples}


def parse(text: str | list[Metric]) -> list[Metric]:
    return list(text_string_to_metric_families(text)) if isinstance(text, str) else text


def total(text: str | list[Metric], intent: str) -> float:
    """``agent_reach_requests_total`` of ``intent`` in an exposition (0: no series)."""
    return sum(
        s.value
        for family in parse(text)
        for s in family.samples
        if s.name == "agent_reach_requests_total" and s.labels["intent"] == intent
    )


def requests_of(metrics: GatewayMetrics, intent: str) -> float:
    """``agent_reach_requests_total`` of ``intent``, read from the metric itself."""
    samples = next(iter(metrics.requests.collect())).samples
    return sum(
        s.value for s in samples if s.name.endswith("_total") and s.labels["intent"] == intent
    )


async def test_thousands_of_register_send_deregister_cycles_stay_bounded() -> None:
    metrics, registry = followed()
    await registry.upsert(record("live", "live.echo"))
    sizes = []
    live_sends = 0
    for cycle in range(3_000):
        tag = f"cycle.c{cycle}"
        await registry.upsert(record(f"c{cycle}", tag))
        observe(metrics, tag)
        observe(metrics, tag, "timeout")
        await registry.remove(f"agent://c{cycle}")
        if cycle % 10 == 0:
            observe(metrics, "live.echo")
            live_sends += 1
        if cycle % 500 == 499:
            sizes.append(len(metrics.render()))
    text = metrics.render().decode()
    for name, labels in intents(text).items():
        assert labels == {"live.echo"}, (name, labels)
    assert total(text, "live.echo") == live_sends  # the live tag's series survived every drop
    # a few digits grow with the live counters; nothing grows with the cycles
    assert max(sizes) - min(sizes) < 200, sizes
    # every metric's HELP and TYPE, one live series, and the collector's pauses (36 lines)
    assert len(text) < 17_000, len(text)
    assert children(metrics.requests) == {(("intent", "live.echo"), ("outcome", "ok"))}
    assert children(metrics.attempts) == {(("intent", "live.echo"), ("outcome", "ok"))}
    assert children(metrics.request_seconds) == {(("intent", "live.echo"),)}


async def test_a_tag_stays_while_any_endpoint_declares_it() -> None:
    metrics, registry = followed()
    await registry.upsert(record("a", "shared.tag", "only.a"))
    await registry.upsert(record("b", "shared.tag"))
    observe(metrics, "shared.tag")
    observe(metrics, "only.a")
    await registry.remove("agent://a")
    text = metrics.render().decode()
    assert intents(text)["agent_reach_requests"] == {"shared.tag"}
    assert total(text, "shared.tag") == 1
    # a record whose capabilities change gives up the tags it no longer declares
    await registry.upsert(record("b", "other.tag"))
    assert intents(metrics.render().decode())["agent_reach_requests"] == set()


async def test_heartbeats_keep_the_series() -> None:
    metrics, registry = followed()
    await registry.upsert(record("a", "beat.tag"))
    observe(metrics, "beat.tag")
    for n in range(5):
        registry.touch("agent://a", float(n), float(n))
    assert total(metrics.render().decode(), "beat.tag") == 1


async def test_a_request_in_flight_across_the_deregistration_is_exported_once() -> None:
    metrics, registry = followed()
    await registry.upsert(record("a", "late.tag"))
    observe(metrics, "late.tag")
    await registry.remove("agent://a")
    observe(metrics, "late.tag")  # answered after its endpoint left
    assert total(metrics.render().decode(), "late.tag") == 1
    assert total(metrics.render().decode(), "late.tag") == 0
    assert intents(metrics.render().decode())["agent_reach_attempts"] == set()


async def test_a_late_answer_is_dropped_at_the_next_registry_change_too() -> None:
    metrics, registry = followed()
    await registry.upsert(record("a", "late.tag"))
    await registry.remove("agent://a")
    observe(metrics, "late.tag")
    await registry.upsert(record("b", "unrelated.tag"))
    assert intents(metrics.render().decode())["agent_reach_requests"] == set()


async def test_a_tag_registered_again_before_the_prune_keeps_its_series() -> None:
    metrics, registry = followed()
    await registry.upsert(record("a", "back.tag"))
    await registry.remove("agent://a")
    observe(metrics, "back.tag")
    await registry.upsert(record("a2", "back.tag"))
    metrics.render()
    assert total(metrics.render().decode(), "back.tag") == 1


async def test_the_gateways_own_labels_are_never_dropped_nor_capped() -> None:
    metrics, registry = followed()
    metrics.request_done("_unroutable", "no_capable_agent", 0.001)
    for n in range(50):
        await registry.upsert(record(f"c{n}", f"cycle.c{n}"))
        await registry.remove(f"agent://c{n}")
    assert total(metrics.render().decode(), "_unroutable") == 1


async def test_past_the_cap_new_tags_count_as_other() -> None:
    metrics, registry = followed()
    extra = 5
    for n in range(MAX_INTENT_LABELS + extra):
        await registry.upsert(record(f"c{n}", f"cap.c{n}"))
        observe(metrics, f"cap.c{n}")
    metrics.request_done("_unroutable", "no_capable_agent", 0.001)
    exposition = parse(metrics.render().decode())
    labels = intents(exposition)
    own = {f"cap.c{n}" for n in range(MAX_INTENT_LABELS)}
    assert labels["agent_reach_requests"] == own | {OTHER_INTENTS, "_unroutable"}
    assert labels["agent_reach_attempts"] == own | {OTHER_INTENTS}
    assert labels["agent_reach_request_duration_seconds"] == own | {OTHER_INTENTS, "_unroutable"}
    assert total(exposition, OTHER_INTENTS) == extra
    # a tag counted as _other leaving keeps the shared series (read from the metric: cheaper)
    await registry.remove(f"agent://c{MAX_INTENT_LABELS}")
    assert requests_of(metrics, OTHER_INTENTS) == extra
    # an own tag leaving frees a slot for the next new tag; _other tags stay under _other
    await registry.remove("agent://c0")
    await registry.upsert(record("fresh", "cap.fresh"))
    observe(metrics, "cap.fresh")
    observe(metrics, f"cap.c{MAX_INTENT_LABELS + 1}")
    assert requests_of(metrics, "cap.fresh") == 1
    assert requests_of(metrics, "cap.c0") == 0
    assert requests_of(metrics, OTHER_INTENTS) == extra + 1


async def test_without_a_followed_registry_the_cap_still_bounds_the_set() -> None:
    metrics = GatewayMetrics(lambda: {})
    for n in range(MAX_INTENT_LABELS + 200):
        observe(metrics, f"loose.c{n}")
    labels = intents(metrics.render().decode())["agent_reach_requests"]
    assert len(labels) == MAX_INTENT_LABELS + 1
    assert OTHER_INTENTS in labels


TAGS = [f"prop.t{n}" for n in range(4)]
IDS = [f"p{n}" for n in range(3)]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("register"), st.sampled_from(IDS), st.sets(st.sampled_from(TAGS))),
        st.tuples(st.just("deregister"), st.sampled_from(IDS), st.just(frozenset())),
        st.tuples(st.just("observe"), st.sampled_from(TAGS), st.just(frozenset())),
        st.tuples(st.just("scrape"), st.just(""), st.just(frozenset())),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
async def test_only_declared_tags_keep_series_and_their_counts(
    ops: list[tuple[str, str, frozenset[str]]],
) -> None:
    metrics, registry = followed()
    counted: dict[str, int] = {}  # declared tags: what their counter must show
    late: dict[str, int] = {}  # answers counted while nobody declared the tag

    def settle() -> None:
        """A registry change or a scrape: late answers stay only if their tag is back."""
        declared = set(registry.intents())
        for tag, n in late.items():
            if tag in declared:
                counted[tag] = n
        late.clear()
        for tag in [t for t in counted if t not in declared]:
            del counted[tag]

    for op, name, tags in ops:
        if op == "register":
            await registry.upsert(record(name, *sorted(tags)))
            settle()
        elif op == "deregister":
            if await registry.remove(f"agent://{name}") is not None:
                settle()
        elif op == "observe":
            observe(metrics, name)
            if name in registry.intents():
                counted[name] = counted.get(name, 0) + 1
            else:
                late[name] = late.get(name, 0) + 1
        else:
            text = metrics.render().decode()
            for tag, n in late.items():
                assert total(text, tag) == n  # exported once before being dropped
            settle()
    metrics.render()
    settle()
    text = metrics.render().decode()
    declared = set(registry.intents())
    for labels in intents(text).values():
        assert labels <= declared
    for tag in declared:
        assert total(text, tag) == counted.get(tag, 0), (tag, ops)


def test_past_the_cap_new_domains_of_forwards_count_as_other() -> None:
    # domains come and go through the directory over a process's life: the forwards' label set
    # must not grow with every domain ever forwarded to
    metrics, _ = followed()
    for n in range(MAX_DOMAIN_LABELS + 50):
        metrics.forwarded(f"domain-{n}", "ok")
    metrics.forwarded("domain-0", "timeout")  # a domain with series of its own keeps them
    domains = {domain for ((_, domain), _) in children(metrics.forwards)}
    assert len(domains) == MAX_DOMAIN_LABELS + 1 and OTHER_INTENTS in domains
    samples = next(iter(metrics.forwards.collect())).samples
    other = [
        s.value for s in samples if s.name.endswith("_total") and s.labels["domain"] == "_other"
    ]
    assert other == [50.0]
    assert ("domain", "domain-0") in {
        pair for labels in children(metrics.forwards) for pair in labels
    }
