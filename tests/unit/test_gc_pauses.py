"""The collector's pauses: each timed into its generation's bucket (``le`` bounds), and
``/metrics``' histogram made of them (docs/reliability.md, F20)."""

from __future__ import annotations

import gc

from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.observability.gcpause import GC_PAUSE_BUCKETS, GcPauses


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pause(pauses: GcPauses, clock: Clock, generation: int, seconds: float) -> None:
    clock.now = 0.0  # each pause from 0: its length exact in floating point
    pauses.on_gc("start", {"generation": generation})
    clock.now += seconds
    pauses.on_gc("stop", {"generation": generation, "collected": 0, "uncollectable": 0})


def test_each_pause_is_counted_in_its_generations_bucket() -> None:
    clock = Clock()
    pauses = GcPauses(clock)
    pause(pauses, clock, 0, 0.0002)
    pause(pauses, clock, 0, 0.001)  # at a bound: in that bucket (le)
    pause(pauses, clock, 2, 0.060)
    pause(pauses, clock, 1, 3.0)  # past the last bound: +Inf
    snap = pauses.snapshot()
    index = {bound: i for i, bound in enumerate(GC_PAUSE_BUCKETS)}
    young = [0] * (len(GC_PAUSE_BUCKETS) + 1)
    young[index[0.0005]] = young[index[0.001]] = 1
    assert snap.counts[0] == tuple(young)
    assert snap.counts[2][index[0.1]] == 1 and sum(snap.counts[2]) == 1
    assert snap.counts[1][-1] == 1 and sum(snap.counts[1]) == 1
    assert round(snap.sums[0], 6) == 0.0012 and round(snap.sums[2], 6) == 0.06
    assert snap.sums[1] == 3.0


def test_installed_it_times_the_processes_collections_and_leaves_no_callback() -> None:
    pauses = GcPauses()
    callbacks = list(gc.callbacks)
    with pauses.installed():
        gc.collect()
    assert gc.callbacks == callbacks
    snap = pauses.snapshot()
    assert sum(snap.counts[2]) == 1 and snap.sums[2] > 0
    gc.collect()  # not counted: removed
    assert sum(pauses.snapshot().counts[2]) == 1


def test_metrics_export_the_pauses_as_a_histogram_by_generation() -> None:
    clock = Clock()
    metrics = GatewayMetrics(lambda: {})
    metrics.gc_pauses = GcPauses(clock)
    pause(metrics.gc_pauses, clock, 2, 0.060)
    pause(metrics.gc_pauses, clock, 0, 0.0001)
    text = metrics.render().decode()
    assert 'agent_reach_gc_pause_seconds_bucket{generation="2",le="0.05"} 0.0' in text
    assert 'agent_reach_gc_pause_seconds_bucket{generation="2",le="0.1"} 1.0' in text
    assert 'agent_reach_gc_pause_seconds_bucket{generation="2",le="+Inf"} 1.0' in text
    assert 'agent_reach_gc_pause_seconds_count{generation="0"} 1.0' in text
    assert 'agent_reach_gc_pause_seconds_count{generation="1"} 0.0' in text
    assert 'agent_reach_gc_pause_seconds_sum{generation="2"} 0.06' in text
