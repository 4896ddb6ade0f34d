"""The order in which the SDKs try several gateways (agent_reach.sdk._failover), and which
aiohttp errors allow trying the next one."""

from __future__ import annotations

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.sdk._failover import GatewayRing, never_sent

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def test_starts_with_the_first_and_sticks_to_the_last_that_worked() -> None:
    ring = GatewayRing([A, B, C])
    assert (ring.current, ring.order(0.0)) == (A, [A, B, C])
    ring.worked(B)
    assert (ring.current, ring.order(0.0)) == (B, [B, C, A])  # round the ring from B
    assert ring.order(1000.0) == [B, C, A]  # stickiness does not wear off


def test_a_failed_gateway_is_tried_last_for_the_cooloff_then_in_its_place() -> None:
    ring = GatewayRing([A, B, C], cooloff_s=5.0)
    ring.failed(A, now=10.0)
    assert ring.current == A  # still the last that worked: nothing else has
    assert ring.order(10.0) == [B, C, A]
    assert ring.order(14.9) == [B, C, A]
    assert ring.order(15.0) == [A, B, C]


def test_cooling_gateways_come_oldest_failure_first_and_an_answer_clears_one() -> None:
    ring = GatewayRing([A, B, C])
    ring.failed(B, now=1.0)
    ring.failed(A, now=2.0)
    assert ring.order(3.0) == [C, B, A]
    ring.worked(A)
    assert ring.order(3.0) == [A, C, B]


def test_no_cooloff_means_only_stickiness() -> None:
    ring = GatewayRing([A, B], cooloff_s=0.0)
    ring.failed(A, now=1.0)
    assert ring.order(1.0) == [A, B]


def test_needs_a_gateway() -> None:
    with pytest.raises(ValueError, match="at least one"):
        GatewayRing([])


events = st.lists(
    st.tuples(st.sampled_from(["failed", "worked"]), st.integers(0, 4), st.floats(0, 20)),
    max_size=30,
)


@given(n=st.integers(1, 5), history=events, now=st.floats(0, 40))
def test_every_gateway_is_in_the_order_once_and_fresh_ones_come_first(
    n: int, history: list[tuple[str, int, float]], now: float
) -> None:
    urls = [f"http://g{i}:1" for i in range(n)]
    ring = GatewayRing(urls, cooloff_s=5.0)
    failed_at: dict[str, float] = {}
    for what, i, at in sorted(history, key=lambda h: h[2]):
        url = urls[i % n]
        if what == "failed":
            ring.failed(url, at)
            failed_at[url] = at
        else:
            ring.worked(url)
            failed_at.pop(url, None)
    order = ring.order(now)
    assert sorted(order) == sorted(urls)  # never dropped, never twice
    cooling = [u for u in order if u in failed_at and now - failed_at[u] < 5.0]
    assert order[len(order) - len(cooling) :] == cooling  # recently failed ones last
    if ring.current not in cooling:
        assert order[0] == ring.current  # sticky


def test_only_errors_before_the_request_was_sent_allow_the_next_gateway() -> None:
    key = aiohttp.client_reqrep.ConnectionKey("a", 1, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))
    assert never_sent(refused)
    assert never_sent(aiohttp.ConnectionTimeoutError("connect timeout"))
    assert not never_sent(aiohttp.ServerDisconnectedError())
    assert not never_sent(aiohttp.ClientOSError(104, "reset by peer"))
    assert not never_sent(aiohttp.SocketTimeoutError("read timeout"))
    assert not never_sent(TimeoutError())
