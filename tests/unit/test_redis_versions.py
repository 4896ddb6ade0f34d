"""The version bookkeeping of a Redis registry view (pure: no Redis, no clock)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent_reach.registry.redis.versions import Versions


def test_a_removal_outranks_the_registrations_before_it() -> None:
    v = Versions(ttl_s=10.0)
    v.registered("x", 3)
    assert not v.newer("x", 3) and v.newer("x", 4)
    v.removed("x", 5, now=0.0)
    assert "x" not in v.live
    assert not v.newer("x", 4)  # a notice of the registration v4, arriving late: stale
    v.registered("x", 4)  # a late read of it: ignored
    assert "x" not in v.live
    v.registered("x", 6)  # registered again since: taken, the tombstone goes
    assert v.live == {"x": 6} and v.tombstones() == 0


def test_a_removal_older_than_the_record_leaves_it() -> None:
    v = Versions(ttl_s=10.0)
    v.registered("x", 7)
    v.removed("x", 5, now=0.0)  # a late notice of an earlier removal
    assert v.live == {"x": 7}
    assert not v.newer("x", 6)


def test_tombstones_go_once_the_channel_passed_them_or_after_the_ttl() -> None:
    v = Versions(ttl_s=10.0)
    v.removed("a", 5, now=0.0)
    v.removed("b", 9, now=0.0)
    v.prune(now=1.0)
    assert v.tombstones() == 2  # nothing came through the channel yet
    v.on_channel(5)
    v.prune(now=1.0)
    assert v.tombstones() == 1  # a's notice came back: nothing older can follow it
    v.prune(now=10.5)
    assert v.tombstones() == 0  # b's notice was lost: gone after the ttl all the same


def test_unknown_ids_are_never_recorded() -> None:
    v = Versions(ttl_s=10.0)
    for i in range(1000):
        assert v.newer(f"nobody-{i}", 1)
        v.forget(f"nobody-{i}")
    assert v.live == {} and v.tombstones() == 0


def test_clear_starts_again() -> None:
    v = Versions(ttl_s=10.0)
    v.registered("x", 40)
    v.removed("y", 41, now=0.0)
    v.on_channel(41)
    assert v.top == 41
    v.clear()
    assert (v.live, v.tombstones(), v.channel, v.top) == ({}, 0, 0, 0)
    assert v.newer("x", 1)


# every change in Redis has a version of its own (one counter for all), in any arrival order
ops = st.lists(
    st.tuples(st.sampled_from(["reg", "rm"]), st.sampled_from("abc"), st.integers(1, 80)),
    max_size=60,
    unique_by=lambda change: change[2],
)


@given(ops)
def test_what_is_known_is_the_newest_change_and_pruning_empties_tombstones(
    changes: list[tuple[str, str, int]],
) -> None:
    """Whatever order changes arrive in, the newest version of each id wins; once the channel
    has passed them all, no tombstone is left, and live holds only ids whose newest change is
    a registration."""
    v = Versions(ttl_s=10.0)
    newest: dict[str, tuple[int, str]] = {}
    for kind, endpoint_id, version in changes:
        if kind == "reg":
            v.registered(endpoint_id, version)
        else:
            v.removed(endpoint_id, version, now=0.0)
        if version > newest.get(endpoint_id, (0, ""))[0]:
            newest[endpoint_id] = (version, kind)
    for endpoint_id, (version, _) in newest.items():
        assert v.of(endpoint_id) == version
        assert not v.newer(endpoint_id, version) and v.newer(endpoint_id, version + 1)
    assert set(v.live) <= {i for i, (_, kind) in newest.items() if kind == "reg"}
    v.on_channel(max((c[2] for c in changes), default=0))
    v.prune(now=0.0)
    assert v.tombstones() == 0


def test_a_change_known_here_that_a_snapshot_lacks_is_found() -> None:
    v = Versions(ttl_s=10.0)
    v.registered("x", 4)
    v.removed("y", 6, now=0.0)
    assert v.missing_in({"x": 4, "z": 2}, seq=9) is None
    assert v.missing_in({"x": 7}, seq=9) is None  # registered again since
    assert v.missing_in({"x": 3}, seq=9) == "x"  # the copy has x's registration before v4
    assert v.missing_in({"x": 3}, seq=3) is None  # v4 came after the snapshot: not a loss
    assert v.missing_in({"y": 5}, seq=9) == "y"  # the copy has y, whose removal v6 it lacks
    assert v.missing_in({"y": 5}, seq=5) is None
