"""Unit tests of agent_reach.core.routing and agent_reach.core.names: health tiers, the
load-aware pick, fallback matching and the name grammar."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.health import INF, EndpointStats, derive
from agent_reach.core.model import EndpointRecord, Status, Thresholds
from agent_reach.core.names import is_endpoint_id, is_intent
from agent_reach.core.routing import (
    PRIORITY_RANK,
    PROBE_SHARE,
    Tiers,
    at_bound,
    build_tiers,
    pick,
    rank_of,
    wait_admits,
    wait_limit,
)

T = Thresholds()  # 10 / 20 / 30 s, slow over 2000 ms, samples kept 60 s
NOW = 10_000.0

# heartbeat age (s), latencies observed just now (ms), ejected: what makes each kind
KINDS: dict[str, tuple[float, list[float], bool]] = {
    "healthy": (1.0, [], False),
    "fast": (1.0, [50.0], False),
    "late": (15.0, [], False),  # degraded by heartbeat age
    "slow": (1.0, [5000.0] * 5, False),  # degraded by latency only: probe share
    "suspect": (25.0, [], False),
    "ejected": (1.0, [], True),
    "down": (45.0, [], False),
    "gone": (0.0, [], False),  # no record at all (deregistered between listing and lookup)
}
EXPECTED = {
    "healthy": Status.HEALTHY,
    "fast": Status.HEALTHY,
    "late": Status.DEGRADED,
    "slow": Status.DEGRADED,
    "suspect": Status.SUSPECT,
    "ejected": Status.SUSPECT,
    "down": Status.DOWN,
}


class World:
    """Records and stats for a set of endpoints of one intent."""

    def __init__(self) -> None:
        self.records: dict[str, EndpointRecord] = {}
        self.stats: dict[str, EndpointStats] = {}

    def add(self, endpoint_id: str, kind: str, now: float = NOW) -> str:
        age, latencies, ejected = KINDS[kind]
        if kind == "gone":
            return endpoint_id
        self.records[endpoint_id] = EndpointRecord(
            endpoint_id=endpoint_id,
            capabilities=("weather.query",),
            endpoint_url="http://127.0.0.1:9001/reach",
            description="",
            last_seen=now - age,
            last_seen_at=1_700_000_000.0,
        )
        s = EndpointStats()
        for ms in latencies:
            s.observe(ms, now - 0.5)
        if ejected:
            s.ejected_at = now - 0.5
        self.stats[endpoint_id] = s
        return endpoint_id

    def tiers(self, ids: list[str], now: float = NOW) -> Tiers:
        return build_tiers(ids, self.records.get, self.stats, now, T)


def world_of(kinds: list[str]) -> tuple[World, list[str]]:
    w = World()
    ids = [w.add(f"agent://e{i}-{kind}", kind) for i, kind in enumerate(kinds)]
    return w, ids


# --- build_tiers ----------------------------------------------------------------------------------


def test_kinds_have_the_status_they_are_named_for() -> None:
    w, ids = world_of([k for k in KINDS if k != "gone"])
    for endpoint_id in ids:
        kind = endpoint_id.split("-", 1)[1]
        r = w.records[endpoint_id]
        assert derive(r.last_seen, w.stats[endpoint_id], NOW, T).status is EXPECTED[kind]


def test_build_tiers_splits_by_health() -> None:
    w, ids = world_of(["healthy", "late", "slow", "suspect", "down", "ejected", "fast", "gone"])
    tiers = w.tiers(ids, NOW)
    assert tiers.healthy == ["agent://e0-healthy", "agent://e6-fast"]
    assert tiers.degraded == ["agent://e1-late", "agent://e2-slow"]
    assert tiers.probe == ["agent://e2-slow"]
    assert tiers.unavailable == 3  # suspect, down, ejected; a missing record is not counted


def test_build_tiers_valid_until_is_min_changes_at() -> None:
    w, ids = world_of(["late", "slow", "suspect", "down", "ejected"])
    tiers = w.tiers(ids, NOW)
    expected = min(derive(w.records[i].last_seen, w.stats[i], NOW, T).changes_at for i in w.records)
    assert tiers.valid_until == expected
    # late: suspect at NOW+5; slow: heartbeat ages at NOW+9; suspect/ejected: down at NOW+5/+29
    assert tiers.valid_until == NOW + 5.0
    w, ids = world_of(["slow", "healthy", "fast"])
    assert w.tiers(ids, NOW).valid_until == NOW + 9.0


def test_build_tiers_valid_until_with_only_down_is_infinite() -> None:
    w, ids = world_of(["down", "down"])
    tiers = w.tiers(ids, NOW)
    assert tiers.valid_until == INF
    assert tiers.unavailable == 2
    assert pick(tiers, w.stats, NOW, random.Random(0)) is None


def test_build_tiers_empty() -> None:
    tiers = build_tiers([], {}.get, {}, NOW, T)
    assert (tiers.healthy, tiers.degraded, tiers.probe, tiers.unavailable) == ([], [], [], 0)
    assert tiers.valid_until == INF


def test_tiers_are_stable_until_valid_until() -> None:
    w, ids = world_of(["healthy", "late", "slow", "fast"])
    tiers = w.tiers(ids, NOW)
    same = w.tiers(ids, tiers.valid_until)
    assert (same.healthy, same.degraded, same.probe) == (
        tiers.healthy,
        tiers.degraded,
        tiers.probe,
    )
    later = w.tiers(ids, tiers.valid_until + 0.001)
    assert (later.healthy, later.degraded) != (tiers.healthy, tiers.degraded)


def test_build_tiers_without_stats() -> None:
    w, ids = world_of(["healthy", "late", "suspect"])
    tiers = build_tiers(ids, w.records.get, {}, NOW, T)
    assert tiers.healthy == [ids[0]]
    assert tiers.degraded == [ids[1]]
    assert tiers.unavailable == 1


# --- pick: eligibility ----------------------------------------------------------------------------

routable_kinds = st.sampled_from(sorted(KINDS))


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(routable_kinds, min_size=1, max_size=8),
    seed=st.integers(0, 2**32 - 1),
    exclude_mask=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_pick_never_returns_suspect_or_down(
    kinds: list[str], seed: int, exclude_mask: list[bool]
) -> None:
    w, ids = world_of(kinds)
    tiers = w.tiers(ids, NOW)
    rng = random.Random(seed)
    exclude = {i for i, skip in zip(ids, exclude_mask, strict=False) if skip}
    status = {i: EXPECTED[i.split("-", 1)[1]] for i in ids if i in w.records}
    healthy_left = [i for i in ids if status.get(i) is Status.HEALTHY and i not in exclude]
    degraded_left = [i for i in ids if status.get(i) is Status.DEGRADED and i not in exclude]
    probe_left = [i for i in degraded_left if i.endswith("-slow")]
    for _ in range(50):
        for ex in ((), exclude):
            chosen = pick(tiers, w.stats, NOW, rng, exclude=ex)
            if chosen is None:
                assert not any(
                    status.get(i) in (Status.HEALTHY, Status.DEGRADED) for i in ids if i not in ex
                )
                continue
            assert chosen in status
            assert status[chosen] in (Status.HEALTHY, Status.DEGRADED)
            assert chosen not in ex
    for _ in range(50):
        chosen = pick(tiers, w.stats, NOW, rng, exclude=exclude)
        if healthy_left:
            assert chosen in healthy_left or chosen in probe_left
        elif degraded_left:
            assert chosen in degraded_left
        else:
            assert chosen is None


def test_healthy_before_degraded_except_probe_share() -> None:
    w, ids = world_of(["healthy", "healthy", "healthy", "slow", "late"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(1234)
    n = 20_000
    counts = Counter(pick(tiers, w.stats, NOW, rng) for _ in range(n))
    assert counts["agent://e4-late"] == 0  # degraded by age: never while healthy ones exist
    probe = counts["agent://e3-slow"]
    assert 0 < probe <= 0.05 * n
    assert probe == pytest.approx(PROBE_SHARE * n, rel=0.2)
    assert sum(counts[i] for i in ids[:3]) == n - probe


def test_no_probe_share_without_a_slow_only_endpoint() -> None:
    w, ids = world_of(["healthy", "late", "late"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(5)
    assert {pick(tiers, w.stats, NOW, rng) for _ in range(5000)} == {ids[0]}


def test_probe_share_over_several_slow_endpoints_is_still_small() -> None:
    w, ids = world_of(["healthy", "slow", "slow", "slow"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(99)
    n = 20_000
    counts = Counter(pick(tiers, w.stats, NOW, rng) for _ in range(n))
    probes = sum(counts[i] for i in ids[1:])
    assert 0 < probes <= 0.05 * n
    assert all(counts[i] > 0 for i in ids[1:])  # each slow one gets a chance to recover


def test_degraded_are_used_when_no_healthy_left() -> None:
    w, ids = world_of(["late", "slow", "suspect"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(3)
    chosen = {pick(tiers, w.stats, NOW, rng) for _ in range(2000)}
    assert chosen == {ids[0]}  # of two degraded, the one that is not slow
    assert pick(tiers, w.stats, NOW, rng, exclude={ids[0]}) == ids[1]


# --- pick: failover -------------------------------------------------------------------------------


def test_failover_skips_tried_endpoints() -> None:
    w, ids = world_of(["healthy", "fast", "healthy", "late", "slow", "suspect"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(11)
    tried: list[str] = []
    while (chosen := pick(tiers, w.stats, NOW, rng, exclude=tried)) is not None:
        assert chosen not in tried
        tried.append(chosen)
        assert len(tried) <= 5
    assert set(tried) == set(ids[:5])
    # every healthy one is tried before any degraded one (bar the probe share)
    healthy_positions = [tried.index(i) for i in ids[:3]]
    assert max(healthy_positions) < tried.index(ids[3])


def test_failover_to_degraded_when_healthy_excluded() -> None:
    w, ids = world_of(["healthy", "late"])
    tiers = w.tiers(ids, NOW)
    assert pick(tiers, w.stats, NOW, random.Random(0), exclude={ids[0]}) == ids[1]


def test_pick_returns_none_when_all_excluded() -> None:
    w, ids = world_of(["healthy", "fast", "late", "slow"])
    tiers = w.tiers(ids, NOW)
    rng = random.Random(0)
    for _ in range(100):
        assert pick(tiers, w.stats, NOW, rng, exclude=set(ids)) is None


def test_pick_on_empty_tiers() -> None:
    assert pick(Tiers(), {}, NOW, random.Random(0)) is None


# --- pick: load-aware choice ----------------------------------------------------------------------


def test_p2c_spreads_load_over_equal_endpoints() -> None:
    w, ids = world_of(["fast"] * 4)
    tiers = w.tiers(ids, NOW)
    rng = random.Random(2024)
    n = 20_000
    counts = Counter(pick(tiers, w.stats, NOW, rng) for _ in range(n))
    for endpoint_id in ids:
        assert 0.15 * n <= counts[endpoint_id] <= 0.35 * n, counts


def test_p2c_spreads_load_without_stats() -> None:
    tiers = Tiers(healthy=[f"agent://n{i}" for i in range(4)])
    rng = random.Random(7)
    n = 20_000
    counts = Counter(pick(tiers, {}, NOW, rng) for _ in range(n))
    assert all(0.15 * n <= counts[i] <= 0.35 * n for i in tiers.healthy), counts


def stats_at(cost_ms: float, now: float = NOW, inflight: int = 0) -> EndpointStats:
    s = EndpointStats()
    s.observe(cost_ms, now)
    s.inflight = inflight
    return s


def test_faster_endpoints_get_more_traffic_not_all_of_it() -> None:
    ids = ["agent://fast", "agent://medium", "agent://slow"]
    stats = {ids[0]: stats_at(20.0), ids[1]: stats_at(100.0), ids[2]: stats_at(800.0)}
    tiers = Tiers(healthy=list(ids))
    rng = random.Random(42)
    n = 20_000
    counts = Counter(pick(tiers, stats, NOW, rng) for _ in range(n))
    assert counts[ids[0]] > counts[ids[1]] > counts[ids[2]]
    assert counts[ids[1]] > 0.2 * n  # the single fastest one is not flooded


def test_slower_endpoint_gets_less_traffic_but_not_zero() -> None:
    """Closed loop over simulated time: every pick is answered at the endpoint's latency.

    At one frozen instant power-of-two-choices never picks the worst of three (it loses every
    pair it is in); it is the decay of an idle endpoint's cost that brings it traffic again.
    """
    latency = {"agent://fast-a": 20.0, "agent://fast-b": 25.0, "agent://slow": 400.0}
    stats = {i: EndpointStats() for i in latency}
    tiers = Tiers(healthy=list(latency))
    rng = random.Random(8)
    counts: Counter[str] = Counter()
    now = NOW
    for _ in range(20_000):  # 50 requests a second for 400 s
        now += 0.02
        chosen = pick(tiers, stats, now, rng)
        assert chosen is not None
        counts[chosen] += 1
        stats[chosen].observe(latency[chosen], now)
    assert counts["agent://slow"] > 0
    assert counts["agent://slow"] < counts["agent://fast-a"]
    assert counts["agent://slow"] < counts["agent://fast-b"]
    assert counts["agent://slow"] < 0.05 * sum(counts.values())


def test_inflight_moves_traffic_away() -> None:
    ids = [f"agent://eq{i}" for i in range(4)]
    stats = {i: stats_at(50.0) for i in ids}
    stats[ids[0]].inflight = 3
    tiers = Tiers(healthy=list(ids))
    rng = random.Random(17)
    n = 20_000
    counts = Counter(pick(tiers, stats, NOW, rng) for _ in range(n))
    assert counts[ids[0]] < 0.05 * n
    for i in ids[1:]:
        assert 0.25 * n <= counts[i] <= 0.42 * n


def test_busy_fast_endpoint_loses_to_idle_slower_one() -> None:
    stats = {"agent://fast": stats_at(10.0, inflight=9), "agent://idle": stats_at(50.0)}
    tiers = Tiers(healthy=["agent://fast", "agent://idle"])
    rng = random.Random(1)
    assert {pick(tiers, stats, NOW, rng) for _ in range(200)} == {"agent://idle"}
    stats["agent://fast"].inflight = 0
    assert {pick(tiers, stats, NOW, rng) for _ in range(200)} == {"agent://fast"}


def test_inflight_spreads_concurrent_load() -> None:
    """Requests that stay in flight push the next ones to the other endpoints."""
    ids = [f"agent://c{i}" for i in range(3)]
    stats = {i: stats_at(50.0) for i in ids}
    tiers = Tiers(healthy=list(ids))
    rng = random.Random(4)
    for _ in range(30):
        chosen = pick(tiers, stats, NOW, rng)
        assert chosen is not None
        stats[chosen].inflight += 1
    assert sorted(stats[i].inflight for i in ids) == [10, 10, 10]


# --- fallback matching ----------------------------------------------------------------------------


# --- names ----------------------------------------------------------------------------------------

GOOD_INTENTS = [
    "weather.query",
    "note.create",
    "a",
    "weather",
    "a1",
    "a_b-c",
    "x.y.z",
    "ab.c9.d_-",
    "a" * 128,
    "a" * 126 + ".b",  # 128 characters in all
]
BAD_INTENTS = [
    "",
    "Weather.query",
    "weather.Query",
    "WEATHER",
    "1weather",
    "weather.1x",
    "_weather",
    "-weather",
    "weather.-x",
    ".weather",
    "weather.",
    "weather..query",
    "weather query",
    "weather/query",
    "weather:query",
    " weather",
    "weather ",
    "wéather",
    "weather.ǫ",
    "a\u0661",  # a non-ASCII digit (ARABIC-INDIC DIGIT ONE)
    "a" * 129,
    "a" * 127 + ".b",  # 129 characters
    # "$" would also match before a final newline: the grammar must not
    "weather.query\n",
    "a\n",
    "weather\nquery",
]


@pytest.mark.parametrize("value", GOOD_INTENTS)
def test_good_intents(value: str) -> None:
    assert len(value) <= 128
    assert is_intent(value) is True


@pytest.mark.parametrize("value", BAD_INTENTS)
def test_bad_intents(value: str) -> None:
    assert is_intent(value) is False


GOOD_IDS = [
    "agent://weather-cn-01",
    "agent://a",
    "agent://0",
    "agent://scheduler-01",
    "agent://a.b_c-d",
    "agent://9lives",
    "agent://a-",
    "agent://a.",
    "agent://" + "a" * 128,
    "agent://0" + "-" * 127,
]
BAD_IDS = [
    "",
    "agent://",
    "agent://A",
    "agent://weather-CN-01",
    "agent://-a",
    "agent://.a",
    "agent://_a",
    "agent://a b",
    "agent://a/b",
    "agent://a:1",
    "agent:///a",
    "agent:/a",
    "agent:a",
    "AGENT://a",
    "Agent://a",
    "http://a",
    "weather-cn-01",
    " agent://a",
    "agent://a ",
    "agent://ä",
    "agent://\u0661",  # a non-ASCII digit
    "agent://" + "a" * 129,
    "agent://x\n",
    "agent://" + "a" * 128 + "\n",
    "agent://x\ny",
]


@pytest.mark.parametrize("value", GOOD_IDS)
def test_good_endpoint_ids(value: str) -> None:
    assert is_endpoint_id(value) is True


@pytest.mark.parametrize("value", BAD_IDS)
def test_bad_endpoint_ids(value: str) -> None:
    assert is_endpoint_id(value) is False


name_char = st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789._-")


@settings(max_examples=200, deadline=None)
@given(first=st.sampled_from("abcxyz0189"), rest=st.text(name_char, max_size=140))
def test_endpoint_id_length_limit(first: str, rest: str) -> None:
    assert is_endpoint_id("agent://" + first + rest) is (len(rest) <= 127)


segment = st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(segment, min_size=1, max_size=12))
def test_intent_grammar_and_length(segments: list[str]) -> None:
    value = ".".join(segments)
    assert is_intent(value) is (len(value) <= 128)
    assert is_intent(value.upper()) is False


# --- pick: the per-endpoint bound (--max-inflight-per-endpoint) -----------------------------------


def test_pick_with_a_bound_skips_endpoints_at_it() -> None:
    w, ids = world_of(["fast"] * 4)
    for endpoint_id in ids[:2]:
        w.stats[endpoint_id].inflight = 3
    tiers = w.tiers(ids, NOW)
    rng = random.Random(3)
    n = 10_000
    counts = Counter(pick(tiers, w.stats, NOW, rng, bound=3) for _ in range(n))
    assert set(counts) == set(ids[2:])
    assert all(0.4 * n <= counts[i] <= 0.6 * n for i in ids[2:]), counts


def test_reserved_slots_count_toward_the_bound() -> None:
    w, ids = world_of(["fast", "fast"])
    w.stats[ids[0]].inflight = 1
    tiers = w.tiers(ids, NOW)
    rng = random.Random(5)
    reserved = {ids[0]: 1, ids[1]: 2}
    assert {pick(tiers, w.stats, NOW, rng, bound=2, reserved=reserved) for _ in range(100)} == {
        None
    }
    assert pick(tiers, w.stats, NOW, rng, bound=3, reserved=reserved) in ids
    assert at_bound(w.stats[ids[0]], 1, 2)
    assert not at_bound(None, 1, 2)
    assert at_bound(None, 2, 2)


def test_every_healthy_one_at_its_bound_sends_to_degraded_then_none() -> None:
    w, ids = world_of(["healthy", "healthy", "late"])
    for endpoint_id in ids[:2]:
        w.stats[endpoint_id].inflight = 1
    tiers = w.tiers(ids, NOW)
    rng = random.Random(9)
    assert {pick(tiers, w.stats, NOW, rng, bound=1) for _ in range(200)} == {ids[2]}
    assert {pick(tiers, w.stats, NOW, rng) for _ in range(200)} <= set(ids[:2])  # unbounded
    w.stats[ids[2]].inflight = 1
    assert pick(tiers, w.stats, NOW, rng, bound=1) is None


def test_a_bound_nobody_reaches_draws_exactly_as_no_bound() -> None:
    w, ids = world_of(["fast", "healthy", "slow", "fast", "late", "slow", "fast"])
    tiers = w.tiers(ids, NOW)
    a, b = random.Random(77), random.Random(77)
    unbounded = [pick(tiers, w.stats, NOW, a) for _ in range(2000)]
    bounded = [pick(tiers, w.stats, NOW, b, bound=1000) for _ in range(2000)]
    assert bounded == unbounded


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(routable_kinds, min_size=1, max_size=8),
    inflight=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    bound=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_pick_with_a_bound_never_returns_one_at_it(
    kinds: list[str], inflight: list[int], bound: int, seed: int
) -> None:
    w, ids = world_of(kinds)
    for endpoint_id, n in zip(ids, inflight, strict=False):
        if endpoint_id in w.stats:
            w.stats[endpoint_id].inflight = n
    tiers = w.tiers(ids, NOW)
    rng = random.Random(seed)
    routable = {
        i
        for i in ids
        if i in w.records and EXPECTED[i.split("-", 1)[1]] in (Status.HEALTHY, Status.DEGRADED)
    }
    room = {i for i in routable if w.stats[i].inflight < bound}
    for _ in range(30):
        chosen = pick(tiers, w.stats, NOW, rng, bound=bound)
        if chosen is None:
            assert not room
        else:
            assert chosen in room


# --- pick: recovery probes ---------------------------------------------------------------------


def probing_world(kinds: list[str]) -> tuple[World, list[str], str]:
    """``kinds`` and one endpoint ejected 0.9 s ago, after its last heartbeat, with its first
    probe due (0.5 s backoff)."""
    w, ids = world_of(kinds)
    ejected = w.add("agent://back", "healthy")  # its last heartbeat 1 s ago
    w.stats[ejected].eject(NOW - 0.9)
    return w, ids, ejected


def test_an_ejected_endpoint_due_a_probe_is_in_the_probe_tier_only() -> None:
    w, ids, ejected = probing_world(["healthy", "healthy"])
    tiers = w.tiers([*ids, ejected], NOW)
    assert tiers.probe == [ejected]
    assert ejected not in tiers.healthy
    assert ejected not in tiers.degraded
    assert tiers.unavailable == 1  # still out of routing: only probed
    before = w.tiers([*ids, ejected], NOW - 0.6)  # 0.3 s after the ejection: not yet due
    assert before.probe == []
    assert before.unavailable == 1


def test_an_ejected_endpoint_gets_a_bounded_probe_share_one_at_a_time() -> None:
    w, ids, ejected = probing_world(["healthy", "healthy", "healthy"])
    tiers = w.tiers([*ids, ejected], NOW)
    rng = random.Random(21)
    n = 20_000
    counts = Counter(pick(tiers, w.stats, NOW, rng) for _ in range(n))
    assert 0 < counts[ejected] <= 0.05 * n
    assert counts[ejected] == pytest.approx(PROBE_SHARE * n, rel=0.2)
    w.stats[ejected].inflight = 1  # a probe is out: no second one meanwhile
    assert ejected not in {pick(tiers, w.stats, NOW, rng) for _ in range(5000)}


def test_a_probe_only_endpoint_is_never_chosen_without_healthy_ones() -> None:
    w, ids, ejected = probing_world(["late"])
    tiers = w.tiers([*ids, ejected], NOW)
    rng = random.Random(2)
    assert {pick(tiers, w.stats, NOW, rng) for _ in range(2000)} == {ids[0]}
    tiers = w.tiers([ejected], NOW)
    assert pick(tiers, w.stats, NOW, rng) is None


def test_a_penalized_healthy_endpoint_due_a_probe_gets_the_probe_share() -> None:
    """A failed twin loses every choice to the other (its cost is 2000 ms): without the probe
    share it would get nothing until that cost decays, a minute later."""
    w, ids = world_of(["fast", "fast"])
    twin = ids[1]
    w.stats[twin].penalize(2000.0, NOW - 2.0)
    w.stats[twin].fail(NOW - 2.0)
    tiers = w.tiers(ids, NOW)
    assert tiers.healthy == ids
    assert tiers.probe == [twin]
    rng = random.Random(4)
    n = 10_000
    counts = Counter(pick(tiers, w.stats, NOW, rng) for _ in range(n))
    assert 0 < counts[twin] <= 0.05 * n


# --- waiting: order and bounds -------------------------------------------------------------------


def test_priority_ranks_and_wait_limits() -> None:
    assert [rank_of(p) for p in ("high", "normal", "low", None, "odd")] == [0, 1, 2, 1, 1]
    assert PRIORITY_RANK["high"] < PRIORITY_RANK["normal"] < PRIORITY_RANK["low"]
    assert [wait_limit(256, p) for p in ("low", "normal", "high")] == [179, 230, 256]
    assert [wait_limit(1, p) for p in ("low", "normal", "high")] == [1, 1, 1]
    assert wait_admits(178, 256, "low")
    assert not wait_admits(179, 256, "low")
    assert wait_admits(255, 256, "high")
    assert not wait_admits(256, 256, "high")
