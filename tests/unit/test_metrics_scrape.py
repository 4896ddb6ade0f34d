"""A scrape generates the exposition in a worker thread, from state read on the loop first.

A probe collector (a prometheus-client Collector, registered beside the gateway's metrics)
blocks the generation until the test, running on the loop, lets it go: that can only happen
while the loop is free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from agent_reach.core.model import EndpointRecord
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.registry.memory import MemoryRegistry

BOUND_S = 5.0


class Probe(Collector):
    """Records the thread of each collection, and holds it until released."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        self.entered.set()
        if not self.release.wait(BOUND_S):
            raise AssertionError("the probe was not released: the loop was blocked")
        yield GaugeMetricFamily("probe_collections", "collections so far", len(self.threads))


def record(name: str, tag: str) -> EndpointRecord:
    return EndpointRecord(f"agent://{name}", (tag,), "http://127.0.0.1:9/reach", "", 0.0, 0.0)


async def entered(probe: Probe) -> bool:
    """Wait (bounded) for the probe to be collected, without blocking the loop."""
    return await asyncio.to_thread(probe.entered.wait, BOUND_S)


async def test_the_exposition_is_generated_off_the_loop_from_state_read_on_it() -> None:
    loop_thread = threading.get_ident()
    state_threads: list[int] = []

    def status_counts() -> dict[str, int]:
        state_threads.append(threading.get_ident())
        return {"healthy": 1}

    metrics = GatewayMetrics(status_counts)
    probe = Probe()
    metrics.registry.register(probe)
    metrics.request_done("off.loop", "ok", 0.01)
    scrape = asyncio.create_task(metrics.scrape())
    assert await entered(probe)  # generating, and the loop still runs this test
    probe.release.set()
    body = await asyncio.wait_for(scrape, BOUND_S)
    assert probe.threads and loop_thread not in probe.threads
    assert state_threads == [loop_thread]
    assert b'agent_reach_requests_total{intent="off.loop",outcome="ok"} 1.0' in body
    assert b'agent_reach_endpoints{status="healthy"} 1.0' in body


async def test_a_scrape_exports_the_state_read_when_it_began() -> None:
    registry = MemoryRegistry()
    await registry.upsert(record("a", "snap.tag"))
    metrics = GatewayMetrics(lambda: {"healthy": len(registry)}, registry.state)
    metrics.follow(registry)
    metrics.watch(
        records=registry.records, now=lambda: 1.0, heartbeat_interval_s=10.0, trace_count=lambda: 7
    )
    probe = Probe()
    metrics.registry.register(probe)
    scrape = asyncio.create_task(metrics.scrape())
    assert await entered(probe)
    # the view changes while the thread generates: it reads a copy, never the live dict
    for n in range(100):
        await registry.upsert(record(f"b{n}", "snap.more"))
    probe.release.set()
    text = (await asyncio.wait_for(scrape, BOUND_S)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples["agent_reach_endpoints", (("status", "healthy"),)] == 1
    assert samples["agent_reach_heartbeat_age_seconds_gcount", ()] == 1
    assert samples["agent_reach_heartbeat_age_seconds_gsum", ()] == 1.0
    assert samples["agent_reach_trace_store_traces", ()] == 7
    assert samples["agent_reach_registry_available", (("backend", "memory"),)] == 1


async def test_scrape_and_render_give_the_same_exposition() -> None:
    registry = MemoryRegistry()
    await registry.upsert(record("a", "same.tag"))
    metrics = GatewayMetrics(lambda: {"healthy": len(registry)}, registry.state)
    metrics.follow(registry)
    metrics.watch(
        records=registry.records, now=lambda: 3.0, heartbeat_interval_s=10.0, trace_count=lambda: 1
    )
    metrics.request_done("same.tag", "ok", 0.2)
    metrics.attempt_done("same.tag", "ok", 0.2)
    scraped, rendered = await metrics.scrape(), metrics.render()
    # the cyclic collector's counts may move between the two (a collection can run at any
    # allocation): the same series, their values aside
    assert _without_gc_values(scraped) == _without_gc_values(rendered)
    assert b"\npython_gc_collections_total{generation=" in scraped


def _without_gc_values(exposition: bytes) -> list[bytes]:
    return [
        line.rpartition(b" ")[0] if line.startswith((b"python_gc_", b"agent_reach_gc_")) else line
        for line in exposition.splitlines()
    ]


async def test_a_cancelled_scrape_holds_the_next_until_its_thread_ends() -> None:
    metrics = GatewayMetrics(lambda: {})
    probe = Probe()
    metrics.registry.register(probe)
    first = asyncio.create_task(metrics.scrape())
    assert await entered(probe)
    probe.entered.clear()
    first.cancel()
    second = asyncio.create_task(metrics.scrape())
    # bounded negative wait: the second must not start a thread while the first's runs
    done, _ = await asyncio.wait([first, second], timeout=0.2)
    assert not done
    assert len(probe.threads) == 1
    probe.release.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, BOUND_S)
    body = await asyncio.wait_for(second, BOUND_S)
    assert b"probe_collections 2.0" in body


async def test_a_scrape_reads_every_endpoint_a_chunk_per_turn_of_the_loop() -> None:
    """At 50,000 endpoints the statuses took ~50 ms of the loop in one go, on every scrape.
    Now the loop turns between chunks, and registrations meanwhile change nothing counted."""
    from agent_reach.gateway.node import Node
    from agent_reach.gateway.router import STATUS_CHUNK
    from agent_reach.settings import GatewaySettings
    from agent_reach.testing import FakeClock
    from agent_reach.wire.bodies import RegisterBody
    from tests.support import turns_during

    n = 5_000
    clock = FakeClock()
    node = Node(GatewaySettings(matcher="none"), clock=clock)

    def body(i: int) -> RegisterBody:
        return RegisterBody(
            endpoint_id=f"agent://s{i}", capabilities=["bulk.tag"], endpoint_url="http://h:9/"
        )

    for i in range(n):
        await node.router.register(body(i))

    async def churn() -> None:  # beside the scrape, between its chunks
        for i in range(n, n + 50):
            clock.advance(0.01)
            await node.router.register(body(i))
            await node.router.deregister(f"agent://s{i - n}")
            await asyncio.sleep(0)

    beside = asyncio.create_task(churn())
    # the state a scrape reads on the loop (the exposition is then made in a thread)
    state, served = await turns_during(node.metrics._read_state())
    await beside
    assert served >= n // STATUS_CHUNK - 1, served
    assert state.status_counts["healthy"] == sum(state.status_counts.values()) == n
    assert state.last_seen is not None and len(state.last_seen) == n  # the records at its start
    assert max(state.last_seen) <= state.now  # no age comes out negative
    text = (await node.metrics.scrape()).decode()  # the next one sees the churn's result
    families = {f.name: f for f in text_string_to_metric_families(text)}
    counted = {s.labels["status"]: s.value for s in families["agent_reach_endpoints"].samples}
    assert sum(counted.values()) == n and counted["healthy"] == n
    ages = families["agent_reach_heartbeat_age_seconds"].samples
    assert [s.value for s in ages if s.labels.get("le") == "+Inf"] == [n]
