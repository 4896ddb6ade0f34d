"""The trace store's request summaries: bounded, most recent first, filtered."""

from __future__ import annotations

import gc

from agent_reach.gateway.traces import TraceStore
from agent_reach.wire.answers import Attempt
from agent_reach.wire.bodies import OUTCOMES

OK = [Attempt("agent://a", "ok", 1.0)]
FAILED = [Attempt("agent://a", "timeout", 2000.0), Attempt("agent://b", "server_error", 3.0)]


def test_summaries_are_kept_most_recent_first_and_bounded() -> None:
    store = TraceStore(recent_capacity=3)
    for n in range(5):
        store.request_done(float(n), f"t{n}", f"m{n}", "x.y", "ok", OK, 1.0)
    assert [s.trace_id for s in store.recent(limit=10)] == ["t4", "t3", "t2"]
    assert [s.trace_id for s in store.recent(limit=2)] == ["t4", "t3"]
    assert store.recent(limit=0) == []


def test_a_summary_names_the_last_endpoint_tried_and_counts_attempts() -> None:
    store = TraceStore()
    store.request_done(1.0, "t1", "m1", "x.y", "all_attempts_failed", FAILED, 2003.4567)
    store.request_done(2.0, "t2", "m2", "x.z", "no_capable_agent", [], 0.1)
    failed, refused = store.recent()[::-1]
    assert failed.to_body() == {
        "trace_id": "t1",
        "msg_id": "m1",
        "intent": "x.y",
        "outcome": "all_attempts_failed",
        "endpoint_id": "agent://b",
        "latency_ms": 2003.457,
        "attempts": 2,
        "ts": 1.0,
    }
    assert (refused.endpoint_id, refused.attempts) == (None, 0)


def test_filters_by_intent_and_outcome() -> None:
    store = TraceStore()
    rows = [("a.b", "ok"), ("a.b", "agent_error"), ("c.d", "ok"), ("a.b", "ok")]
    for n, (intent, outcome) in enumerate(rows):
        store.request_done(float(n), f"t{n}", f"m{n}", intent, outcome, OK, 1.0)
    assert [s.trace_id for s in store.recent(intent="a.b")] == ["t3", "t1", "t0"]
    assert [s.trace_id for s in store.recent(outcome="ok")] == ["t3", "t2", "t0"]
    assert [s.trace_id for s in store.recent("a.b", "ok", limit=1)] == ["t3"]


def test_summaries_outlive_the_events_they_point_to() -> None:
    store = TraceStore(capacity=1)
    store.add("t1", 1.0, "received")
    store.request_done(1.0, "t1", "m1", "x.y", "ok", OK, 1.0)
    store.add("t2", 2.0, "received")  # t1's events are dropped
    assert store.get("t1") is None
    assert [s.trace_id for s in store.recent()] == ["t1"]


def test_evictions_and_dropped_events_are_counted() -> None:
    store = TraceStore(capacity=2, max_events=3)
    for n in range(5):
        store.add("busy", float(n), "event")
    assert len(store.get("busy") or []) == 3 and store.events_dropped == 2
    store.add("t2", 6.0, "received")
    assert store.evicted == 0
    store.add("t3", 7.0, "received")  # busy, the least recently written, goes
    assert store.get("busy") is None and store.evicted == 1


def test_outcomes_are_ok_and_every_reach_error_code() -> None:
    codes = {"no_capable_agent", "recipient_not_found", "recipient_incapable"}
    codes |= {"no_available_agent", "agent_error", "all_attempts_failed", "deadline_exceeded"}
    assert {"ok", *codes} <= OUTCOMES
    assert "invalid_request" not in OUTCOMES  # refused before the delivery loop: never listed
    assert all(isinstance(c, str) for c in OUTCOMES)
    # a policy refusing every candidate, and a fault of ours, are answers of the loop too
    assert {"forbidden", "internal_error"} <= OUTCOMES


def test_the_events_held_in_all_are_bounded_not_only_per_trace() -> None:
    """A review: 10,000 traces of 256 events each, a caller's 2,000 characters in each, are
    gigabytes; the store now also holds at most ``max_total`` events, the oldest traces going
    first (never the one being written), each counted."""
    store = TraceStore(capacity=100, max_events=8, max_total=20)
    for n in range(5):
        for i in range(8):  # each trace filled to max_events
            store.add(f"t{n}", float(n), "received", {"i": i})
    assert store.total == 16 and store.evicted == 3
    assert [store.get(f"t{n}") is None for n in range(5)] == [True, True, True, False, False]
    big = TraceStore(capacity=100, max_events=50, max_total=20)
    for i in range(30):  # one trace over max_total by itself: it stays, it is the one written
        big.add("solo", float(i), "attempt")
    assert big.total == 30 and len(big.get("solo") or []) == 30


def test_each_sender_reads_only_its_own_requests_of_a_shared_trace_id() -> None:
    store = TraceStore()
    store.add("shared", 1.0, "received", {"sender": "agent://a"}, ("agent://a", None))
    store.add("shared", 2.0, "received", {"sender": "agent://b"}, ("agent://b", "far"))
    assert [e["sender"] for e in store.get("shared") or []] == ["agent://a", "agent://b"]
    mine = store.get("shared", lambda reader: reader[0] == "agent://a")
    assert [e["sender"] for e in mine or []] == ["agent://a"]
    assert store.get("shared", lambda reader: reader[1] == "far") == [
        {"ts": 2.0, "kind": "received", "sender": "agent://b"}
    ]
    assert store.get("shared", lambda reader: False) == []  # held, none readable
    assert store.get("other", lambda reader: True) is None


def route_event(n: int) -> dict[str, object]:
    """A route event's shape: a match and candidates nested in it."""
    return {
        "chosen": f"agent://a-{n}",
        "match": {"method": "exact", "tag": "x.y", "confidence": 1.0},
        "candidates": {"healthy": [f"agent://a-{n}", "agent://b"], "degraded": []},
    }


def tracked_from(store: TraceStore) -> int:
    """The objects the store holds (reachable from its attributes, classes aside) that the
    cyclic collector tracks."""
    roots = list(vars(store).values())
    seen, stack, tracked = {id(root) for root in roots}, roots, 0
    while stack:
        obj = stack.pop()
        tracked += gc.is_tracked(obj)
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, type):
                seen.add(id(ref))
                stack.append(ref)
    return tracked


def test_the_events_held_add_one_tracked_object_a_trace_to_the_collectors_work() -> None:
    """A full store held ~10 objects a trace the cyclic collector walks (tuples, the nested
    dicts and lists of route events): ~100,000, and 47-77 ms a full collection, in a gateway
    under churn (docs/reliability.md, F20). Now one list a trace."""
    store = TraceStore(capacity=2000)
    empty = tracked_from(store)
    for n in range(1000):
        trace = f"t{n}"
        reader = (f"agent://caller-{n}", None)
        store.add(trace, 1.0, "received", {"msg_id": f"m{n}", "intent": "x.y"}, reader)
        store.add(trace, 1.1, "route", route_event(n), reader)
        store.add(trace, 1.2, "attempt", {"attempt": 1, "latency_ms": 2.5}, reader)
        store.add(trace, 1.3, "answer", None, reader)
    gc.collect()  # what a collection leaves tracked (it untracks tuples of plain values)
    added = tracked_from(store) - empty
    assert added == 1000, added


def test_events_with_nested_fields_read_back_as_they_were_added() -> None:
    store = TraceStore()
    event = route_event(1)
    store.add("t", 1.0, "route", event, ("agent://s", None))
    store.add("t", 2.0, "answer", None)
    event["chosen"] = "changed later"  # kept as it was when added
    assert store.get("t") == [
        {"ts": 1.0, "kind": "route", **route_event(1)},
        {"ts": 2.0, "kind": "answer"},
    ]
    assert store.get("t", lambda reader: reader[0] == "agent://s") == [
        {"ts": 1.0, "kind": "route", **route_event(1)}
    ]
    odd = {"values": [1j]}  # not JSON: kept as it is (tracked), never an error here
    store.add("t", 3.0, "odd", odd)
    assert (store.get("t") or [])[-1] == {"ts": 3.0, "kind": "odd", "values": [1j]}
