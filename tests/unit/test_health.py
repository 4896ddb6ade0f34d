"""Unit tests of agent_reach.core.health: derive(), EndpointStats and LivenessClock."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.health import (
    EWMA_DECAY_S,
    INF,
    PROBE_BACKOFF_MAX_S,
    PROBE_BACKOFF_S,
    SLOW_RECOVERY,
    STRIKE_MEMORY_S,
    WARMUP_SAMPLES,
    EndpointStats,
    LivenessClock,
    derive,
    probe_backoff_s,
    slow_after,
)
from agent_reach.core.model import Status, Thresholds
from agent_reach.errors import ConfigError

DEFAULT = Thresholds()
T0 = 1000.0  # an arbitrary liveness time for "last heartbeat"


def just_past(x: float) -> float:
    """The smallest float greater than ``x``."""
    return math.nextafter(x, math.inf)


def just_before(x: float) -> float:
    """The greatest float smaller than ``x``."""
    return math.nextafter(x, -math.inf)


def stats_with(latencies: list[float], at: float) -> EndpointStats:
    """Stats holding ``latencies`` (ms), all observed at liveness time ``at``."""
    s = EndpointStats()
    for ms in latencies:
        s.observe(ms, at)
    return s


# --- derive(): heartbeat age ------------------------------------------------------------------

CUSTOM = Thresholds(degraded_after=2.0, suspect_after=5.0, down_after=7.5)
HALF = Thresholds.from_interval(0.5)  # 0.5 / 1.0 / 1.5
FLAT = Thresholds(degraded_after=5.0, suspect_after=5.0, down_after=5.0)  # allowed by check()


@pytest.mark.parametrize(
    ("t", "now", "status", "changes_at"),
    [
        # default thresholds: 10 / 20 / 30 s
        (DEFAULT, T0, Status.HEALTHY, T0 + 10),
        (DEFAULT, T0 + 9.999, Status.HEALTHY, T0 + 10),
        (DEFAULT, T0 + 10, Status.HEALTHY, T0 + 10),  # age == degraded_after: still healthy
        (DEFAULT, just_past(T0 + 10), Status.DEGRADED, T0 + 20),
        (DEFAULT, T0 + 20, Status.DEGRADED, T0 + 20),
        (DEFAULT, just_past(T0 + 20), Status.SUSPECT, T0 + 30),
        (DEFAULT, T0 + 30, Status.SUSPECT, T0 + 30),
        (DEFAULT, just_past(T0 + 30), Status.DOWN, INF),
        (DEFAULT, T0 + 1e6, Status.DOWN, INF),
        # a heartbeat stamped slightly in the future (clock skew between reads) is healthy
        (DEFAULT, T0 - 1, Status.HEALTHY, T0 + 10),
        # custom thresholds: 2 / 5 / 7.5 s
        (CUSTOM, T0 + 2, Status.HEALTHY, T0 + 2),
        (CUSTOM, just_past(T0 + 2), Status.DEGRADED, T0 + 5),
        (CUSTOM, T0 + 5, Status.DEGRADED, T0 + 5),
        (CUSTOM, just_past(T0 + 5), Status.SUSPECT, T0 + 7.5),
        (CUSTOM, T0 + 7.5, Status.SUSPECT, T0 + 7.5),
        (CUSTOM, just_past(T0 + 7.5), Status.DOWN, INF),
        # from_interval(0.5): 0.5 / 1.0 / 1.5 s
        (HALF, T0 + 0.5, Status.HEALTHY, T0 + 0.5),
        (HALF, just_past(T0 + 0.5), Status.DEGRADED, T0 + 1.0),
        (HALF, just_past(T0 + 1.0), Status.SUSPECT, T0 + 1.5),
        (HALF, just_past(T0 + 1.5), Status.DOWN, INF),
        # all three thresholds equal: straight from healthy to down
        (FLAT, T0 + 5, Status.HEALTHY, T0 + 5),
        (FLAT, just_past(T0 + 5), Status.DOWN, INF),
    ],
)
def test_derive_status_at_every_age_boundary(
    t: Thresholds, now: float, status: Status, changes_at: float
) -> None:
    t.check()
    h = derive(T0, None, now, t)
    assert h.status is status
    assert h.changes_at == changes_at
    assert h.slow_only is False
    assert h.reason


def test_thresholds_from_interval_and_overrides() -> None:
    assert Thresholds.from_interval(10) == DEFAULT
    t = Thresholds.from_interval(4, suspect_after=9.0)
    assert (t.degraded_after, t.suspect_after, t.down_after) == (4, 9.0, 12)


@pytest.mark.parametrize(
    "t",
    [
        Thresholds(heartbeat_interval=0),
        Thresholds(degraded_after=0),
        Thresholds(degraded_after=30, suspect_after=20),
        Thresholds(suspect_after=40, down_after=30),
        Thresholds(slow_threshold_ms=0),
        Thresholds(sample_ttl=-1),
    ],
)
def test_thresholds_check_rejects_bad_values(t: Thresholds) -> None:
    with pytest.raises(ConfigError):
        t.check()


# --- derive(): slowness -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("latencies", "slow"),
    [
        ([2000.0] * 5, False),  # mean == threshold is not "above"
        ([2001.0] * 5, True),
        ([2500.0], True),  # fewer than 5 samples: mean of those there are
        ([1000.0, 1000.0, 1000.0, 1000.0, 6001.0], True),  # mean 2000.2
        ([1000.0, 1000.0, 1000.0, 1000.0, 5999.0], False),  # mean 1999.8
        ([9000.0] * 5 + [100.0] * 5, False),  # only the last 5 count
        ([100.0] * 5 + [9000.0] * 5, True),
        ([9000.0] * 95 + [100.0] * 5, False),
    ],
)
def test_slow_is_mean_of_last_five_over_threshold(latencies: list[float], slow: bool) -> None:
    h = derive(T0, stats_with(latencies, T0), T0, DEFAULT)
    if slow:
        assert h.status is Status.DEGRADED
        assert h.slow_only is True
        assert "slow" in h.reason
    else:
        assert h.status is Status.HEALTHY
        assert h.slow_only is False


def test_slow_uses_custom_threshold() -> None:
    t = Thresholds(slow_threshold_ms=100.0)
    assert derive(T0, stats_with([150.0], T0), T0, t).status is Status.DEGRADED
    assert derive(T0, stats_with([100.0], T0), T0, t).status is Status.HEALTHY


@pytest.mark.parametrize(
    ("fast_after", "status"),
    [
        (0, Status.DEGRADED),  # mean 3000
        (1, Status.DEGRADED),  # mean 2400
        (2, Status.HEALTHY),  # mean 1800
        (5, Status.HEALTHY),  # all slow ones pushed out
    ],
)
def test_fast_samples_push_slow_ones_out(fast_after: int, status: Status) -> None:
    s = stats_with([3000.0] * 5, T0)
    for k in range(fast_after):
        s.observe(0.0, T0 + 1 + k)
    now = T0 + 10
    h = derive(now, s, now, DEFAULT)
    assert h.status is status
    assert h.slow_only is (status is Status.DEGRADED)


def test_slow_samples_age_out_after_sample_ttl() -> None:
    s = stats_with([5000.0] * 5, T0)
    at_ttl = T0 + DEFAULT.sample_ttl
    # last_seen = now each time: only the samples decide
    h = derive(at_ttl, s, at_ttl, DEFAULT)
    assert h.status is Status.DEGRADED
    assert h.slow_only
    assert h.changes_at == at_ttl  # the samples age out just after this
    after = just_past(at_ttl)
    assert derive(after, s, after, DEFAULT).status is Status.HEALTHY


def test_aged_slow_samples_leave_the_recent_fast_one() -> None:
    s = stats_with([9000.0] * 5, 0.0)
    s.observe(100.0, 50.0)
    assert derive(55.0, s, 55.0, DEFAULT).status is Status.DEGRADED  # mean (4x9000+100)/5
    assert derive(60.5, s, 60.5, DEFAULT).status is Status.HEALTHY  # only 100 ms is left


def test_custom_sample_ttl() -> None:
    t = Thresholds(sample_ttl=5.0)
    s = stats_with([5000.0], T0)
    assert derive(T0 + 5, s, T0 + 5, t).status is Status.DEGRADED
    assert derive(T0 + 5.5, s, T0 + 5.5, t).status is Status.HEALTHY


def test_slow_healthy_changes_at_is_min_of_heartbeat_and_sample_expiry() -> None:
    s = stats_with([100.0], T0)
    h = derive(T0 + 55, s, T0 + 55, DEFAULT)
    assert h.status is Status.HEALTHY
    assert h.changes_at == T0 + 60  # the sample ages out before the heartbeat does (T0 + 65)
    slow = stats_with([5000.0], T0)
    h = derive(T0 + 2, slow, T0 + 5, DEFAULT)
    assert h.changes_at == T0 + 12  # the heartbeat ages before the sample (T0 + 60)


def test_late_and_slow_is_degraded_but_not_slow_only() -> None:
    s = stats_with([5000.0] * 5, T0 + 15)
    h = derive(T0, s, T0 + 15, DEFAULT)
    assert h.status is Status.DEGRADED
    assert h.slow_only is False  # a late heartbeat is not cured by a probe


def test_no_samples_is_not_slow() -> None:
    h = derive(T0, EndpointStats(), T0, DEFAULT)
    assert h.status is Status.HEALTHY
    assert h.changes_at == T0 + 10


# --- derive(): slowness with hysteresis -------------------------------------------------------


@pytest.mark.parametrize(
    ("was_slow", "mean", "slow"),
    [
        (False, None, False),
        (True, None, False),  # every sample aged out: not slow, whatever it was
        (False, 2000.0, False),  # at the threshold: not over it
        (False, 2000.1, True),
        (True, 2000.1, True),
        (True, 1600.0, True),  # at 0.8 x the threshold: not under it, still slow
        (False, 1600.0, False),
        (True, 1599.9, False),
        (False, 1800.0, False),  # in the band: as it was
        (True, 1800.0, True),
    ],
)
def test_slow_after_is_a_hysteresis(was_slow: bool, mean: float | None, slow: bool) -> None:
    assert SLOW_RECOVERY == 0.8
    assert slow_after(was_slow, mean, 2000.0) is slow


@pytest.mark.parametrize(
    ("fast_after", "status"),
    [
        (1, Status.DEGRADED),  # mean 2400
        (2, Status.DEGRADED),  # mean 1800: under the threshold, not clearly: still slow
        (3, Status.HEALTHY),  # mean 1200: under 1600
    ],
)
def test_a_slow_endpoint_is_healthy_again_only_clearly_under_the_threshold(
    fast_after: int, status: Status
) -> None:
    s = EndpointStats()
    for k in range(5):
        s.observe(3000.0, T0 + k * 0.1, t=DEFAULT)
    for k in range(fast_after):
        s.observe(0.0, T0 + 1 + k, t=DEFAULT)
    now = T0 + 10
    assert derive(now, s, now, DEFAULT).status is status


def test_a_fast_endpoint_becomes_slow_only_over_the_threshold() -> None:
    s = EndpointStats()
    for k in range(5):
        s.observe(1900.0, T0 + k, t=DEFAULT)  # in the band, coming from fast: healthy
    assert derive(T0 + 5, s, T0 + 5, DEFAULT).status is Status.HEALTHY
    s.observe(2600.0, T0 + 6, t=DEFAULT)  # mean 2040
    assert derive(T0 + 6, s, T0 + 6, DEFAULT).status is Status.DEGRADED


def test_an_agent_near_the_threshold_does_not_flap() -> None:
    """Ten minutes of deliveries whose latency wanders 15 % around the threshold, 10 a second,
    on a fake clock: the status changes once (to degraded), not at every other sample, as the
    rule without hysteresis would have it (issue 17: at most one transition a minute)."""
    rng = random.Random(17)
    t = DEFAULT
    s = EndpointStats()
    status = []
    plain = []  # what "mean of the last 5 over the threshold" alone would say
    window: list[float] = []
    for k in range(6000):
        now = T0 + k * 0.1
        ms = t.slow_threshold_ms * rng.uniform(0.85, 1.15)
        s.observe(ms, now, t=t)
        window = [*window[-4:], ms]
        status.append(derive(now, s, now, t).status)
        plain.append(sum(window) / len(window) > t.slow_threshold_ms)
    transitions = sum(a is not b for a, b in itertools.pairwise(status))
    assert transitions <= 10  # the goal: <= 1 a minute
    assert Status.DEGRADED in status
    assert sum(a != b for a, b in itertools.pairwise(plain)) > 500  # the scenario does flap


def test_an_agent_alternating_fast_and_slow_around_the_threshold_does_not_flap() -> None:
    s = EndpointStats()
    changes = 0
    before = None
    for k in range(600):  # a minute at 10 a second: 1.3 x and 0.7 x the threshold in turn
        now = T0 + k * 0.1
        s.observe(2600.0 if k % 2 else 1400.0, now, t=DEFAULT)
        status = derive(now, s, now, DEFAULT).status
        changes += before is not None and status is not before
        before = status
    assert changes <= 1


def test_samples_ageing_out_do_not_turn_a_recovered_endpoint_slow_again() -> None:
    """No delivery after the fifth: as the samples age out one by one the mean goes 2160 ->
    1450 (clearly under: healthy) -> 1600 (in the band). Time alone must not bring "slow"
    back: the band keeps what the endpoint was, and it was healthy (a review found it flip)."""
    t = Thresholds(sample_ttl=60.0)
    s = EndpointStats()
    for k, ms in enumerate([5000.0, 1000.0, 1000.0, 1900.0, 1900.0]):
        s.observe(ms, T0 + k, t=t)
    seen = []
    for now in [T0 + 4.5, T0 + 60.5, T0 + 61.5, T0 + 62.5, T0 + 63.5, T0 + 64.5]:
        h = derive(now - 1.0, s, now, t)  # heartbeats fresh throughout
        seen.append((h.status, s.is_slow(now, t)))
    assert seen == [
        (Status.DEGRADED, True),  # 2160
        (Status.HEALTHY, False),  # 1450
        (Status.HEALTHY, False),  # 1600: in the band, and it had recovered
        (Status.HEALTHY, False),  # 1900
        (Status.HEALTHY, False),  # 1900 (one sample)
        (Status.HEALTHY, False),  # none left
    ]


def test_samples_ageing_out_can_make_an_endpoint_slow() -> None:
    """The other way: fast samples ageing out leave the slow ones, over the threshold."""
    t = Thresholds(sample_ttl=60.0)
    s = EndpointStats()
    for k, ms in enumerate([100.0, 100.0, 100.0, 2600.0, 2600.0]):  # mean 1100: healthy
        s.observe(ms, T0 + k, t=t)
    assert not s.is_slow(T0 + 4.5, t)
    assert s.is_slow(T0 + 62.5, t)  # 2600, 2600: slow
    assert derive(T0 + 62, s, T0 + 62.5, t).status is Status.DEGRADED
    assert not s.is_slow(T0 + 64.5, t)  # none left


def _reference_slow(samples: list[tuple[int, float]], now: float, t: Thresholds) -> bool:
    """The hysteresis walked through time: at each sample (one by one, also at the same
    instant) and each instant a sample ages out (just after its time + ttl: an eighth of a
    second after), the state moves on the window of that moment."""
    ttl = t.sample_ttl
    # (time, samples taken by then): a sample's arrival, or an ageing out
    events = [(float(when), i + 1) for i, (when, _) in enumerate(samples)]
    events += [(when + ttl + 0.125, len(samples)) for when, _ in samples]
    slow = False
    for at, taken in sorted(events):
        if at > now:
            break
        kept = [ms for when, ms in samples[:taken] if when <= at and at - when <= ttl][-5:]
        slow = slow_after(slow, sum(kept) / len(kept) if kept else None, t.slow_threshold_ms)
    return slow


@settings(max_examples=400, deadline=None)
@given(
    gaps=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    latencies=st.lists(
        st.sampled_from([100.0, 1500.0, 1700.0, 1900.0, 2500.0, 6000.0]), min_size=12, max_size=12
    ),
    later=st.lists(st.integers(0, 150), min_size=1, max_size=6),
)
def test_slowness_follows_the_hysteresis_through_time(
    gaps: list[int], latencies: list[float], later: list[int]
) -> None:
    """Against the reference walk: samples at whole seconds (ageing out just after a whole
    second), the state read between them (at quarters), samples observed as they come."""
    t = Thresholds(sample_ttl=60.0)
    s = EndpointStats()
    samples: list[tuple[int, float]] = []
    at = 0
    for gap, ms in zip(gaps, latencies, strict=False):
        at += gap
        if gap:  # (time does not go back: not read before a sample already taken)
            assert s.is_slow(at - 0.25, t) is _reference_slow(samples, at - 0.25, t)
        s.observe(ms, float(at), t=t)
        samples.append((at, ms))
        assert s.is_slow(float(at), t) is _reference_slow(samples, float(at), t)
    for extra in sorted(later):
        now = at + extra + 0.25
        assert s.is_slow(now, t) is _reference_slow(samples, now, t), (samples, now)


# --- recovery: probes after a failure ---------------------------------------------------------


@pytest.mark.parametrize(
    ("strikes", "backoff"), [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (40, 5.0)]
)
def test_probe_backoff_doubles_up_to_its_bound(strikes: int, backoff: float) -> None:
    assert (PROBE_BACKOFF_S, PROBE_BACKOFF_MAX_S) == (0.5, 5.0)
    assert probe_backoff_s(strikes) == backoff


def test_strikes_grow_with_failures_close_together_and_start_again_after_a_while() -> None:
    s = EndpointStats()
    for k in range(4):
        s.fail(T0 + k)
    assert s.strikes == 4
    assert s.probe_at == T0 + 3 + 4.0
    s.fail(T0 + 3 + STRIKE_MEMORY_S + 1)  # long after the last one: a new count
    assert s.strikes == 1
    assert s.probe_at == T0 + 3 + STRIKE_MEMORY_S + 1 + 0.5


def test_an_ejected_endpoint_is_probe_eligible_after_its_backoff() -> None:
    s = EndpointStats()
    s.eject(T0 + 1)
    h = derive(T0, s, T0 + 1.2, DEFAULT)
    assert (h.status, h.probe) == (Status.SUSPECT, False)
    assert h.changes_at == T0 + 1.5  # when the probe is due
    h = derive(T0, s, T0 + 1.5, DEFAULT)
    assert h.probe is False  # changes_at itself is still the old state
    h = derive(T0, s, just_past(T0 + 1.5), DEFAULT)
    assert (h.status, h.probe) == (Status.SUSPECT, True)  # still out of routing, but probed
    assert h.changes_at == T0 + DEFAULT.suspect_after  # then suspect by age: no more probes
    assert derive(T0, s, T0 + 21, DEFAULT).probe is False
    assert "probe" in h.reason
    s.eject(T0 + 2)  # the probe was refused: out again, for longer
    assert derive(T0, s, T0 + 2.9, DEFAULT).probe is False
    assert derive(T0, s, T0 + 3.1, DEFAULT).probe is True


def test_an_answer_ends_the_ejection_and_forgets_the_failures_cost() -> None:
    s = EndpointStats()
    s.observe(3.0, T0)
    s.penalize(2000.0, T0 + 1)
    s.eject(T0 + 1)
    assert s.cost_ms(T0 + 1) == 2000.0
    assert s.recovering
    s.recover(4.0, T0 + 2)
    assert not s.recovering
    assert s.cost_ms(T0 + 2) == 4.0
    assert s.probe_at == INF
    h = derive(T0, s, T0 + 2, DEFAULT)
    assert (h.status, h.probe) == (Status.HEALTHY, False)


def test_a_heartbeat_forgives_an_ejection_and_its_cost() -> None:
    s = EndpointStats()
    s.penalize(2000.0, T0 + 1)
    s.eject(T0 + 1)
    s.forgive()
    assert not s.recovering
    assert s.cost_ms(T0 + 1) == 0.0  # looks new: gets its share back at once
    assert derive(T0 + 2, s, T0 + 2, DEFAULT).status is Status.HEALTHY


def test_a_penalized_healthy_endpoint_is_probed_after_its_backoff() -> None:
    s = EndpointStats()
    s.observe(2000.0, T0, answered=False, penalty_ms=2000.0, t=DEFAULT)  # a timeout
    s.fail(T0)
    h = derive(T0, s, T0 + 0.2, DEFAULT)
    assert (h.status, h.probe, h.changes_at) == (Status.HEALTHY, False, T0 + 0.5)
    h = derive(T0, s, T0 + 0.6, DEFAULT)
    assert (h.status, h.probe) == (Status.HEALTHY, True)
    s.recover(3.0, T0 + 0.7)
    assert derive(T0, s, T0 + 0.8, DEFAULT).probe is False


def test_a_late_heartbeat_is_not_probed_even_when_penalized() -> None:
    s = EndpointStats()
    s.fail(T0)
    h = derive(T0, s, T0 + 15, DEFAULT)
    assert (h.status, h.probe) == (Status.DEGRADED, False)


# --- derive(): passive ejection ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("ejected_at", "status"),
    [
        (T0 + 1, Status.SUSPECT),  # ejected after its last heartbeat
        (T0, Status.SUSPECT),  # at the same instant: still out
        (T0 - 0.001, Status.HEALTHY),  # a heartbeat after the ejection clears it
        (None, Status.HEALTHY),
    ],
)
def test_passive_ejection(ejected_at: float | None, status: Status) -> None:
    s = EndpointStats()
    s.ejected_at = ejected_at
    h = derive(T0, s, T0 + 2, DEFAULT)
    assert h.status is status
    if status is Status.SUSPECT:
        assert h.changes_at == T0 + DEFAULT.down_after
        assert "refused" in h.reason


def test_later_heartbeat_clears_ejection() -> None:
    s = EndpointStats()
    s.ejected_at = T0 + 3
    assert derive(T0, s, T0 + 4, DEFAULT).status is Status.SUSPECT
    # next heartbeat at T0 + 5 (> ejected_at)
    assert derive(T0 + 5, s, T0 + 6, DEFAULT).status is Status.HEALTHY


def test_ejected_and_past_down_after_is_down() -> None:
    s = EndpointStats()
    s.ejected_at = T0 + 1
    assert derive(T0, s, T0 + 31, DEFAULT).status is Status.DOWN


def test_ejection_beats_slowness() -> None:
    s = stats_with([5000.0] * 5, T0)
    s.ejected_at = T0
    h = derive(T0, s, T0, DEFAULT)
    assert h.status is Status.SUSPECT
    assert h.slow_only is False


# --- derive(): changes_at is a true bound ------------------------------------------------------

# Times on a 1/1024 s grid are exact in binary floating point, so the property below is about
# the logic of changes_at, not about the last bit of a subtraction.
grid_time = st.integers(min_value=0, max_value=2_000_000 * 1024).map(lambda n: n / 1024)
grid_offset = st.integers(min_value=0, max_value=200 * 1024).map(lambda n: n / 1024)


@st.composite
def thresholds(draw: st.DrawFn) -> Thresholds:
    d = draw(st.integers(1, 60 * 1024)) / 1024
    s = d + draw(st.integers(0, 60 * 1024)) / 1024
    down = s + draw(st.integers(0, 60 * 1024)) / 1024
    t = Thresholds(
        heartbeat_interval=d,
        degraded_after=d,
        suspect_after=s,
        down_after=down,
        slow_threshold_ms=draw(st.sampled_from([50.0, 2000.0])),
        sample_ttl=draw(st.integers(1, 120 * 1024)) / 1024,
    )
    t.check()
    return t


@settings(max_examples=300, deadline=None)
@given(
    t=thresholds(),
    last_seen=grid_time,
    age=st.integers(-10 * 1024, 300 * 1024).map(lambda n: n / 1024),
    sample_gaps=st.lists(grid_offset, max_size=8),
    latencies=st.lists(
        st.sampled_from([10.0, 45.0, 100.0, 1500.0, 1800.0, 2500.0, 9000.0]), max_size=8
    ),
    ejected=st.one_of(st.none(), st.integers(-50 * 1024, 50 * 1024).map(lambda n: n / 1024)),
    failed=st.lists(st.integers(-50 * 1024, 50 * 1024).map(lambda n: n / 1024), max_size=3),
    fractions=st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=1, max_size=8),
)
def test_status_does_not_change_before_changes_at(
    t: Thresholds,
    last_seen: float,
    age: float,
    sample_gaps: list[float],
    latencies: list[float],
    ejected: float | None,
    failed: list[float],
    fractions: list[float],
) -> None:
    now = last_seen + age
    stats = EndpointStats()
    # samples observed at increasing times, the last of them no later than now, with the
    # slow flag's hysteresis (1800 and 45 ms are in the band of the thresholds drawn)
    n = min(len(sample_gaps), len(latencies))
    at = now - sum(sample_gaps[:n])
    for gap, ms in zip(sample_gaps[:n], latencies[:n], strict=True):
        stats.observe(ms, at, t=t)
        at += gap
    for offset in sorted(failed):  # failed attempts: penalized, probed after a backoff
        stats.fail(min(now, last_seen + offset))
    if ejected is not None:
        stats.eject(last_seen + ejected)
    h = derive(last_seen, stats, now, t)
    assert h.changes_at >= now
    if h.changes_at == INF:
        probes = [now, now + 1e3, now + 1e9]
    else:
        # changes_at itself is still the old status: every threshold is a strict inequality
        probes = [now, max(now, just_before(h.changes_at)), h.changes_at]
        probes += [min(h.changes_at, now + f * (h.changes_at - now)) for f in fractions]
    for later in probes:
        got = derive(last_seen, stats, later, t)
        assert (got.status, got.probe) == (h.status, h.probe), (later, h)


@settings(max_examples=300, deadline=None)
@given(
    last_seen=st.floats(0.0, 1e7),
    age=st.floats(-5.0, 400.0),
    interval=st.floats(0.001, 100.0),
    sample_age=st.one_of(st.none(), st.floats(0.0, 200.0)),
    latency=st.sampled_from([10.0, 5000.0]),
    fraction=st.floats(0.0, 1.0, exclude_max=True),
)
def test_status_does_not_change_before_changes_at_any_float(
    last_seen: float,
    age: float,
    interval: float,
    sample_age: float | None,
    latency: float,
    fraction: float,
) -> None:
    t = Thresholds.from_interval(interval)
    now = last_seen + age
    stats = None
    if sample_age is not None:
        stats = stats_with([latency], now - sample_age)
    h = derive(last_seen, stats, now, t)
    if h.changes_at == INF:
        probes = [now, now + 1e6]
    elif h.changes_at == now:
        probes = [now]
    else:
        probes = [now, just_before(h.changes_at), now + fraction * (h.changes_at - now)]
        probes = [p for p in probes if now <= p < h.changes_at]
    for later in probes:
        assert derive(last_seen, stats, later, t).status is h.status, (later, h)


@settings(max_examples=200, deadline=None)
@given(last_seen=grid_time, age=grid_offset)
def test_changes_at_is_where_the_age_status_changes(last_seen: float, age: float) -> None:
    now = last_seen + age
    h = derive(last_seen, None, now, DEFAULT)
    if h.changes_at != INF:
        assert derive(last_seen, None, just_past(h.changes_at), DEFAULT).status is not h.status


# --- EndpointStats ----------------------------------------------------------------------------


def test_fresh_stats_have_no_history() -> None:
    s = EndpointStats()
    assert s.p95_ms() is None
    assert s.latency_stats() == (None, None)
    assert s.recent_mean(T0, 60) == (None, INF)
    assert s.cost_ms(T0) == 0.0
    assert s.score(T0) == 1.0


@pytest.mark.parametrize(
    ("latencies", "p95", "avg"),
    [
        ([7.0], 7.0, 7.0),
        ([1.0, 2.0], 2.0, 1.5),
        ([float(i) for i in range(1, 21)], 19.0, 10.5),
        ([float(i) for i in range(100, 0, -1)], 95.0, 50.5),
        # only the last 100 are kept: 51..150
        ([float(i) for i in range(1, 151)], 145.0, 100.5),
    ],
)
def test_p95_and_avg(latencies: list[float], p95: float, avg: float) -> None:
    s = stats_with(latencies, T0)
    assert s.p95_ms() == p95
    assert s.latency_stats() == (avg, p95)


def test_p95_and_avg_stay_known_however_old_and_skip_timeouts() -> None:
    s = stats_with([100.0, 300.0], T0)
    s.observe(5000.0, T0 + 1, answered=False)  # a timeout: "slow", but no latency shown
    assert s.latency_stats() == (200.0, 300.0)
    assert s.recent_mean(T0 + 1, 60)[0] == pytest.approx(1800.0)


def test_recent_mean_reports_when_the_oldest_ages_out() -> None:
    s = EndpointStats()
    for k in range(7):
        s.observe(100.0 * (k + 1), T0 + k)
    mean, ages_out = s.recent_mean(T0 + 6, 60)
    assert mean == pytest.approx((300 + 400 + 500 + 600 + 700) / 5)
    assert ages_out == T0 + 2 + 60  # the oldest of the last five was observed at T0 + 2


def test_peak_ewma_rises_at_once_on_a_slow_sample() -> None:
    s = EndpointStats()
    for k in range(20):
        s.observe(10.0, T0 + k * 0.1)
    assert s.cost_ms(T0 + 2) == pytest.approx(10.0, rel=0.05)
    s.observe(500.0, T0 + 2)
    assert s.cost_ms(T0 + 2) == 500.0


def test_peak_ewma_decays_while_idle() -> None:
    s = EndpointStats()
    for _ in range(WARMUP_SAMPLES):  # warm: decays at the full time constant
        s.observe(1000.0, T0)
    costs = [s.cost_ms(T0 + dt) for dt in (0, 1, 5, 10, 30, 100)]
    assert costs[0] == 1000.0
    assert costs[3] == pytest.approx(1000.0 / math.e)
    assert all(a > b for a, b in itertools.pairwise(costs))
    assert costs[-1] < 1.0


def test_a_cost_with_few_samples_behind_it_decays_faster() -> None:
    """The warm-up: one slow first answer (a cold process) must not keep a new endpoint out
    for seconds; the time constant grows with the samples, to the full one at WARMUP_SAMPLES."""
    s = EndpointStats()
    s.observe(5.0, T0)
    first = EWMA_DECAY_S / WARMUP_SAMPLES
    assert s.cost_ms(T0 + first) == pytest.approx(5.0 / math.e)
    assert s.cost_ms(T0 + 1.0) < 2.5 / 3  # under a warm twin's 2.5 ms within a second
    s.observe(5.0, T0 + 1.0)  # peak again; now two samples behind it
    assert s.cost_ms(T0 + 1.0 + 2 * first) == pytest.approx(5.0 / math.e)
    for k in range(WARMUP_SAMPLES):
        s.observe(5.0, T0 + 2.0 + k)
    at = T0 + 1.0 + WARMUP_SAMPLES
    assert s.cost_ms(at + EWMA_DECAY_S) == pytest.approx(s.cost_ms(at) / math.e)


def test_a_failures_cost_decays_at_the_full_time_constant_even_when_new() -> None:
    s = EndpointStats()
    s.observe(5.0, T0)
    s.observe(2000.0, T0 + 0.1, answered=False, penalty_ms=2000.0)  # a timeout
    s.fail(T0 + 0.1)
    assert s.cost_ms(T0 + 0.1 + EWMA_DECAY_S) == pytest.approx(2000.0 / math.e)
    fresh = EndpointStats()  # refused before it ever answered
    fresh.penalize(2000.0, T0)
    fresh.eject(T0)
    assert fresh.cost_ms(T0 + EWMA_DECAY_S) == pytest.approx(2000.0 / math.e)


def test_a_failure_does_not_change_the_cost_already_decayed() -> None:
    s = EndpointStats()
    s.observe(100.0, T0)
    before = s.cost_ms(T0 + 0.3)
    s.fail(T0 + 0.3)  # the time constant changes from here on, not backwards
    assert s.cost_ms(T0 + 0.3) == pytest.approx(before)
    assert s.cost_ms(T0 + 0.3 + EWMA_DECAY_S) == pytest.approx(before / math.e)


def test_an_answer_that_ends_a_penalty_starts_the_warm_up_again() -> None:
    s = EndpointStats()
    for k in range(WARMUP_SAMPLES):
        s.observe(3.0, T0 + k * 0.01)
    s.observe(2000.0, T0 + 1, answered=False, penalty_ms=2000.0)
    s.fail(T0 + 1)
    s.recover(6.0, T0 + 2)  # a probe's answer, from a process still cold
    assert s.cost_ms(T0 + 2 + EWMA_DECAY_S / WARMUP_SAMPLES) == pytest.approx(6.0 / math.e)


def test_a_registration_starts_the_cost_again_unless_penalized() -> None:
    s = EndpointStats()
    for k in range(WARMUP_SAMPLES):
        s.observe(3.0, T0 + k * 0.01)
    s.renew()  # registered again: perhaps a new process
    assert s.cost_ms(T0 + 1) == 0.0
    assert s.p95_ms() == 3.0  # its samples stay
    s.observe(5.0, T0 + 1)  # the new process's first answer, cold
    assert s.cost_ms(T0 + 1 + EWMA_DECAY_S / WARMUP_SAMPLES) == pytest.approx(5.0 / math.e)
    s.penalize(2000.0, T0 + 2)
    s.fail(T0 + 2)
    s.renew()  # a failing agent that registers again keeps its penalty
    assert s.cost_ms(T0 + 2) == 2000.0
    assert s.penalized


def test_peak_ewma_blends_down_on_a_faster_sample() -> None:
    s = EndpointStats()
    s.observe(1000.0, T0)
    before = s.cost_ms(T0 + 1)
    s.observe(100.0, T0 + 1)
    after = s.cost_ms(T0 + 1)
    assert 100.0 < after < before  # moved toward the sample, not all the way


def test_penalty_makes_a_fast_failure_look_slow() -> None:
    s = EndpointStats()
    s.observe(5.0, T0, penalty_ms=2000.0)
    assert s.cost_ms(T0) == 2000.0
    assert s.p95_ms() == 5.0  # the latency itself is recorded as it was


def test_penalize_raises_cost_without_a_sample() -> None:
    s = EndpointStats()
    s.observe(20.0, T0)
    s.penalize(3000.0, T0 + 1)
    assert s.cost_ms(T0 + 1) == 3000.0
    assert s.recent_mean(T0 + 1, 60)[0] == 20.0
    fresh = EndpointStats()
    fresh.penalize(3000.0, T0)
    assert fresh.p95_ms() is None
    assert fresh.score(T0) > EndpointStats().score(T0)


def test_score_grows_with_inflight() -> None:
    s = EndpointStats()
    s.observe(50.0, T0)
    scores = []
    for n in range(5):
        s.inflight = n
        scores.append(s.score(T0))
    assert scores[0] == 51.0
    assert scores == [51.0 * (n + 1) for n in range(5)]
    idle = EndpointStats()
    idle.inflight = 3
    assert idle.score(T0) > EndpointStats().score(T0)  # in-flight counts with no history too


# --- LivenessClock ----------------------------------------------------------------------------


def test_ticks_on_time_credit_nothing() -> None:
    lc = LivenessClock(tick_interval=0.25, tolerance=1.0)
    mono = 100.0
    for k in range(400):
        # on time, early, or late within the tolerance
        mono += 0.25 + (0.9 if k % 50 == 7 else 0.0) - (0.1 if k % 3 == 0 else 0.0)
        lag = lc.tick(mono)
        assert 0.0 <= lag <= 1.0
    assert lc.credit == 0.0
    assert lc.now(mono) == mono
    assert lc.now(mono + 0.5) == mono + 0.5


def test_first_tick_has_no_lag() -> None:
    lc = LivenessClock(tick_interval=0.25, tolerance=1.0)
    assert lc.now(50.0) == 50.0  # before any tick: plain monotonic time
    assert lc.tick(100.0) == 0.0
    assert lc.credit == 0.0


@pytest.mark.parametrize(
    ("gap", "lag", "credit"),
    [
        (0.25, 0.0, 0.0),
        (1.25, 1.0, 0.0),  # exactly at the tolerance: nothing credited
        (1.5, 1.25, 0.25),
        (40.25, 40.0, 39.0),
    ],
)
def test_stall_longer_than_tolerance_is_credited(gap: float, lag: float, credit: float) -> None:
    lc = LivenessClock(tick_interval=0.25, tolerance=1.0)
    lc.tick(100.0)
    assert lc.tick(100.0 + gap) == pytest.approx(lag)
    assert lc.credit == pytest.approx(credit)
    assert lc.now(100.0 + gap) == pytest.approx(100.0 + gap - credit)


def test_credit_accumulates_over_stalls() -> None:
    lc = LivenessClock(tick_interval=1.0, tolerance=0.5)
    lc.tick(0.0)
    lc.tick(11.0)  # lag 10 -> 9.5
    lc.tick(12.0)
    lc.tick(18.0)  # lag 5 -> 4.5
    assert lc.credit == pytest.approx(14.0)
    assert lc.now(18.0) == pytest.approx(4.0)


def test_endpoint_stays_healthy_across_a_40s_stall() -> None:
    """SIGSTOP-like: the gateway freezes for 40 s right after an agent's heartbeat."""
    t = Thresholds.from_interval(10)
    lc = LivenessClock(tick_interval=0.25, tolerance=1.0)  # as the gateway sets it up
    mono = 100.0
    while mono < 200.0:
        mono += 0.25
        lc.tick(mono)
    last_seen = lc.now(mono)  # heartbeat handled at mono == 200
    assert derive(last_seen, None, lc.now(mono), t).status is Status.HEALTHY

    resumed = mono + 40.25  # the next tick should have run at 200.25
    # without the guard the agent would look dead to the first request after the stall
    assert derive(last_seen, None, resumed - lc.credit, t).status is Status.DOWN
    # the first request after the stall runs before the late tick: now() is capped
    first = lc.now(resumed)
    assert first == pytest.approx(last_seen + 0.25 + 1.0)
    assert derive(last_seen, None, first, t).status is Status.HEALTHY
    # the late tick credits the stall; time does not jump back or forward across it
    assert lc.tick(resumed) == pytest.approx(40.0)
    assert lc.credit == pytest.approx(39.0)
    assert lc.now(resumed) == pytest.approx(first)
    assert derive(last_seen, None, lc.now(resumed), t).status is Status.HEALTHY
    # afterwards the lease runs on: degraded about 10 s after the heartbeat, liveness time
    mono = resumed
    while mono < resumed + 8.5:
        mono += 0.25
        lc.tick(mono)
    assert derive(last_seen, None, lc.now(mono), t).status is Status.HEALTHY
    while mono < resumed + 9.5:
        mono += 0.25
        lc.tick(mono)
    assert derive(last_seen, None, lc.now(mono), t).status is Status.DEGRADED


def test_now_is_capped_until_the_late_tick() -> None:
    lc = LivenessClock(tick_interval=0.25, tolerance=1.0)
    lc.tick(10.0)
    assert lc.now(10.5) == 10.5
    assert lc.now(11.25) == 11.25
    assert lc.now(12.0) == 11.25
    assert lc.now(500.0) == 11.25


# Events: ("tick" | "read", gap to the previous event). Times on a 1/1024 s grid are exact in
# binary floating point; the arbitrary-float case is test_now_never_goes_backwards_any_float.
grid_gap = st.one_of(
    st.integers(0, 1024).map(lambda n: n / 1024),
    st.integers(0, 60 * 1024).map(lambda n: n / 1024),
    st.sampled_from([0.0, 0.25, 1.0, 1.25, 40.25]),
)
grid_events = st.lists(st.tuples(st.sampled_from(["tick", "read"]), grid_gap), max_size=60)


def run_events(
    lc: LivenessClock, start: float, seq: list[tuple[str, float]]
) -> list[tuple[float, float]]:
    """Play ``seq`` on ``lc``; return (reading before, reading after) around each event."""
    out = []
    mono = start
    for kind, gap in seq:
        mono += gap
        before = lc.now(mono)
        if kind == "tick":
            assert lc.tick(mono) >= 0.0
        after = lc.now(mono)
        assert after <= mono
        assert lc.credit >= 0.0
        out.append((before, after))
    return out


@settings(max_examples=400, deadline=None)
@given(
    start=st.integers(0, 10**6 * 1024).map(lambda n: n / 1024),
    interval=st.sampled_from([0.0625, 0.25, 1.0]),
    tolerance=st.sampled_from([0.0, 0.125, 0.5, 1.0, 5.0]),
    seq=grid_events,
)
def test_now_never_goes_backwards(
    start: float, interval: float, tolerance: float, seq: list[tuple[str, float]]
) -> None:
    lc = LivenessClock(interval, tolerance)
    readings = [lc.now(start)]
    for before, after in run_events(lc, start, seq):
        readings += [before, after]
    assert readings == sorted(readings)


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(0.0, 1e6),
    interval=st.floats(0.01, 2.0),
    tolerance=st.floats(0.0, 5.0),
    seq=st.lists(st.tuples(st.sampled_from(["tick", "read"]), st.floats(0.0, 60.0)), max_size=40),
)
def test_now_never_goes_backwards_any_float(
    start: float, interval: float, tolerance: float, seq: list[tuple[str, float]]
) -> None:
    lc = LivenessClock(interval, tolerance)
    prev = lc.now(start)
    for before, after in run_events(lc, start, seq):
        assert before >= prev
        assert after >= before  # exactly, rounding included
        prev = after


def test_late_tick_rounding_does_not_move_now_back() -> None:
    lc = LivenessClock(tick_interval=0.05, tolerance=0.0)
    lc.tick(0.0)
    before = lc.now(0.5)  # capped at 0.05
    lc.tick(0.5)  # late by 0.45: credit 0.45
    assert lc.now(0.5) >= before  # 0.5 - 0.45 == 0.04999999999999999 < 0.05


def test_a_request_read_at_the_end_of_a_stall_arrived_at_its_start() -> None:
    from agent_reach.core.health import LivenessClock

    clock = LivenessClock(tick_interval=0.25, tolerance=1.0)
    clock.tick(10.0)
    assert clock.arrival(10.1) == 10.1  # the loop is keeping time: read when it came
    # the loop was held from 10.25 (the tick was due) to 12.0: a read at 12.0, before the
    # late tick ran, may have waited since 10.25
    assert clock.arrival(12.0) == 10.25
    clock.tick(12.001)  # the late tick: the stall is noted
    assert clock.last_stall == (10.25, 12.001)
    assert clock.arrival(12.0) == 10.25
    assert clock.arrival(12.03) == 10.25  # read just after the late tick: it waited too
    assert clock.arrival(12.1) == 12.1  # read after the stall ended
    clock.tick(12.251)
    assert clock.arrival(12.3) == 12.3


def test_the_probe_backoff_of_a_long_outage_stays_bounded() -> None:
    from agent_reach.core.health import PROBE_BACKOFF_MAX_S, probe_backoff_s

    # thousands of failures in a row (a NATS server down under load): no overflow
    assert probe_backoff_s(5000) == PROBE_BACKOFF_MAX_S


@given(
    last_seen=st.floats(0.0, 1e7, allow_nan=False),
    interval=st.floats(0.05, 600.0, allow_nan=False),
)
@settings(max_examples=500, deadline=None)
def test_a_status_changes_exactly_at_its_changes_at(last_seen: float, interval: float) -> None:
    """A review found ``derive`` comparing a heartbeat's age (``now - last_seen > d``) where
    ``changes_at`` said ``last_seen + d``: by a rounding the two disagree (last seen 0.18, 0.5
    s thresholds, now 0.68), and the tier cache, re-deriving at the due time the same status
    with the same due time, looped for ever (the gateway's event loop with it). The status at
    ``changes_at`` is the one before, and just past it another."""
    t = Thresholds.from_interval(interval)
    h = derive(last_seen, None, last_seen, t)
    while h.changes_at < INF:
        assert derive(last_seen, None, h.changes_at, t).status is h.status
        after = derive(last_seen, None, just_past(h.changes_at), t)
        assert after.status is not h.status, (h, after)
        h = after


def test_the_reviews_rounding_case() -> None:
    t = Thresholds.from_interval(0.5)
    assert 0.18 + 0.5 < 0.68 and not 0.68 - 0.18 > 0.5  # the two comparisons disagree here
    h = derive(0.18, None, 0.18, t)
    assert h.changes_at == 0.18 + 0.5
    assert derive(0.18, None, 0.68, t).status is Status.DEGRADED
