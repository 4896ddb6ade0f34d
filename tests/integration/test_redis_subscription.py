"""The Redis registry's subscription to its channel, on the real Redis (127.0.0.1:6379, a unique
prefix per test), reached through the relay of :mod:`test_redis_write_buffer`, which can freeze
the subscription's connection alone: open and silent, as a NAT or load balancer leaves a quiet
connection it dropped, while the registry's other connection goes on.

Shown here: a gateway whose subscription went silent subscribes again and reconciles, so that a
removal and a URL change made meanwhile (which only the channel or a reconcile bring: the
heartbeat reads do not) reach its view within the stated bound, with the periodic reconcile
far out of the way; and a quiet subscription that answers its PINGs is kept."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

import pytest

from agent_reach.core.model import EndpointRecord
from agent_reach.registry.redis import RedisRegistry
from agent_reach.registry.redis.loops import LISTEN_IDLE_S
from tests.integration.test_redis_write_buffer import Relay, ids_of
from tests.support import REDIS_URL, drop_prefix, until

SYNC_S = 0.05
TIMEOUT_S = 0.5  # the registries' socket timeout: a PING unanswered this long fails
# the bound the registry states (loops.py), from the moment its subscription went silent
BOUND_S = LISTEN_IDLE_S + TIMEOUT_S + 2 * SYNC_S
# on top of it: a few round trips (close, connect, SUBSCRIBE, the reconcile's reads) and the
# polling of the wait below
SLACK_S = 0.5


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    made = Relay(REDIS_URL)
    await made.mend()
    yield made
    made.thaw()
    if made._server is not None:
        await made.cut()


@pytest.fixture
async def pair(relay: Relay) -> AsyncIterator[tuple[RedisRegistry, RedisRegistry]]:
    """Two gateways on one fresh prefix: ``a`` through the relay, ``b`` straight to Redis;
    neither reconciles on its own in the test's time (only a resubscription asks for one)."""
    prefix = f"test-{secrets.token_hex(6)}"
    made = []
    for url in (relay.url, REDIS_URL):
        registry = RedisRegistry(
            url, prefix=prefix, sync_s=SYNC_S, reconcile_s=3600.0, connect_timeout_s=TIMEOUT_S
        )
        registry.bind(time.monotonic)
        made.append(registry)
    yield made[0], made[1]
    relay.thaw()  # a test that failed frozen: close() need not wait for timeouts
    for registry in made:
        await registry.close()
    drop_prefix(prefix)


def rec(name: str, url: str = "http://127.0.0.1:9/a") -> EndpointRecord:
    return EndpointRecord(f"agent://{name}", ("t.a",), url, "", time.monotonic(), 0.0)


def url_on(registry: RedisRegistry, name: str) -> str | None:
    record = registry.get(f"agent://{name}")
    return None if record is None else record.endpoint_url


async def test_a_silent_subscription_is_replaced_and_the_view_catches_up_within_the_bound(
    relay: Relay, pair: tuple[RedisRegistry, RedisRegistry]
) -> None:
    a, b = pair
    await a.start()
    await b.start()
    await b.upsert(rec("gone"))
    await b.upsert(rec("moved"))
    await until(lambda: ids_of(a) == {"agent://gone", "agent://moved"}, 2.0, "a sees both")
    # the reconcile a's first subscription asked for is done (else it would bring the change)
    await until(lambda: not a._link.reconcile_due, 1.0, "a's reconcile after subscribing")
    # a URL change reaches a through its subscription (its reconcile is an hour away)
    await b.upsert(rec("moved", "http://127.0.0.1:9/second"))
    await until(lambda: url_on(a, "moved") == "http://127.0.0.1:9/second", 1.0, "a notice")

    assert relay.freeze_subscriptions() == 1  # a's; its other connection goes on
    silent_at = time.monotonic()
    assert await b.remove("agent://gone") is not None
    await b.upsert(rec("moved", "http://127.0.0.1:9/third"))

    await until(
        lambda: ids_of(a) == {"agent://moved"} and url_on(a, "moved") == "http://127.0.0.1:9/third",
        BOUND_S + SLACK_S,
        f"a's view caught up within {BOUND_S} s (+{SLACK_S} s)",
    )
    caught_up = time.monotonic() - silent_at
    print(f"caught up {caught_up:.2f} s after the subscription went silent (bound {BOUND_S} s)")
    # subscribed again, on a new connection (the relay may read its SUBSCRIBE a moment later)
    await until(lambda: sum(c.subscribed for c in relay.connections) == 2, 1.0, "resubscribed")
    await until(lambda: a.state().available, 1.0, "a finds Redis available again")
    # and the new subscription carries notices again
    await b.remove("agent://moved")
    await until(lambda: not ids_of(a), 1.0, "a notice on the new subscription")


async def test_a_quiet_subscription_that_answers_its_pings_is_kept(
    relay: Relay, pair: tuple[RedisRegistry, RedisRegistry]
) -> None:
    a, _ = pair
    await a.start()
    subscribed = await until(lambda: [c for c in relay.connections if c.subscribed], 1.0)
    # two PINGs sent, the second LISTEN_IDLE_S after the first's answer was heard
    await until(lambda: subscribed[0].pings >= 2, 2 * (LISTEN_IDLE_S + TIMEOUT_S) + 1.0, "PINGs")
    assert [c for c in relay.connections if c.subscribed] == subscribed  # never subscribed again
    assert a.state().available
