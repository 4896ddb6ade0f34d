"""Per-endpoint bounds and the requests waiting for a slot (gateway/slots.py, Router.acquire).

The router, its registry and the slots are the real ones, on a fake clock; an "attempt" is the
router's own bookkeeping (attempt_started / attempt_finished), as the delivery loop does it.
Nothing here sleeps: a test waits for what it needs (queued waiters, a finished task) with
bounded loops of event-loop turns.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from agent_reach.core.model import Outcome
from agent_reach.core.retry import Deadline
from agent_reach.errors import DeadlineExceeded, Overloaded
from agent_reach.gateway.router import RoutePlan, Router
from agent_reach.gateway.slots import Slots
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody

INTENT = "slot.test"


async def make(names: list[str], bound: int, **settings: Any) -> tuple[Router, FakeClock]:
    clock = FakeClock()
    router = Router(
        GatewaySettings(max_inflight_per_endpoint=bound, **settings),
        MemoryRegistry(),
        clock,
        rng=random.Random(7),
    )
    for n, name in enumerate(names):
        await register(router, name, port=9000 + n)
    return router, clock


async def register(router: Router, name: str, port: int, intent: str = INTENT) -> None:
    await router.register(
        RegisterBody(
            endpoint_id=name, capabilities=[intent], endpoint_url=f"http://127.0.0.1:{port}/"
        )
    )


async def plan(router: Router, intent: str = INTENT, hint: str | None = None) -> RoutePlan:
    return await router.route(intent, hint)


def finish(router: Router, name: str, outcome: Outcome = Outcome.OK) -> None:
    stats = router.stats[name]
    router.attempt_finished(name, stats, outcome, 5.0, reached=True, eject=False)


async def turns(until: Callable[[], bool], bound: int = 200) -> None:
    """Let the event loop run until ``until()`` holds (at most ``bound`` turns)."""
    for _ in range(bound):
        if until():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached within the bound of event-loop turns")


# --- the bound -------------------------------------------------------------------------------


async def test_an_endpoint_at_its_bound_is_skipped_like_an_ineligible_one() -> None:
    router, _ = await make(["agent://a", "agent://b"], bound=2)
    p = await plan(router)
    for _ in range(2):
        router.attempt_started("agent://a")
    chosen = {router.choose(p) for _ in range(200)}
    assert chosen == {"agent://b"}
    assert await router.acquire(p, prefer="agent://a") == "agent://b"  # a has no slot
    router.attempt_started("agent://b")
    finish(router, "agent://b")
    finish(router, "agent://a")  # a has a slot again; b now has none
    for _ in range(2):
        router.attempt_started("agent://b")
    assert {router.choose(p) for _ in range(200)} == {"agent://a"}


async def test_choose_falls_back_to_a_full_endpoint_but_free_only_does_not() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    assert router.full("agent://a")
    assert router.choose(p) == "agent://a"  # the loop's choice stays: acquire waits for it
    assert router.choose(p, free_only=True) is None  # a hedge must not wait


async def test_acquire_returns_at_once_while_a_slot_is_free() -> None:
    router, _ = await make(["agent://a"], bound=3)
    p = await plan(router)
    for _ in range(3):
        assert await router.acquire(p, (), "low", prefer="agent://a") == "agent://a"
        router.attempt_started("agent://a")
    assert router.slots.waiting == 0
    assert router.full("agent://a")


async def test_a_slot_handed_out_is_held_until_its_attempt_starts() -> None:
    router, _ = await make(["agent://a"], bound=2)
    p = await plan(router)
    assert await router.acquire(p) == "agent://a"
    assert await router.acquire(p) == "agent://a"
    assert router.full("agent://a")  # two handed out, neither attempt started yet
    assert router.choose(p, free_only=True) is None
    router.attempt_started("agent://a")  # one starts: its slot is its own now
    assert router.slots.reserved == {"agent://a": 1}
    await turns(lambda: not router.slots.reserved)  # the other never started: given back
    assert not router.full("agent://a")
    assert router.stats["agent://a"].inflight == 1


async def test_an_attempt_started_in_a_task_of_its_own_keeps_its_slot() -> None:
    """A hedge race starts its first attempt in a new task, a turn of the loop later: the slot
    acquire gave it is still held then, so no other request takes it meanwhile."""
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    target = await router.acquire(p)
    assert target == "agent://a"
    seen = []

    async def attempt() -> None:  # its first step runs a turn later, as a hedge race's does
        seen.append(router.full(target))  # held for it: full, though nothing is in flight
        router.attempt_started(target)

    await asyncio.wait([asyncio.create_task(attempt())])
    assert seen == [True]
    assert router.slots.reserved == {}
    assert router.stats[target].inflight == 1


# --- waiting in priority order ---------------------------------------------------------------


class Callers:
    """Requests that acquire a slot, start their attempt at once, and record the order."""

    def __init__(self, router: Router, p: RoutePlan) -> None:
        self.router = router
        self.plan = p
        self.served: list[str] = []
        self.tasks: dict[str, asyncio.Task[str | None]] = {}

    def send(self, name: str, priority: str, deadline: Deadline | None = None) -> None:
        async def run() -> str | None:
            target = await self.router.acquire(self.plan, (), priority, deadline)
            if target is not None:
                self.router.attempt_started(target)  # before any await, as the loop does
                self.served.append(name)
            return target

        self.tasks[name] = asyncio.create_task(run())


async def test_waiters_are_served_high_then_normal_then_low_fifo_within_one() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")  # the one slot, taken
    callers = Callers(router, p)
    order = [("low-1", "low"), ("normal-1", "normal"), ("low-2", "low"), ("high-1", "high")]
    order += [("normal-2", "normal"), ("high-2", "high")]
    for name, priority in order:
        callers.send(name, priority)
    await turns(lambda: router.slots.waiting == 6)
    for n in range(6):  # each attempt that ends gives its slot to the first in line
        finish(router, "agent://a")
        await turns(lambda n=n: len(callers.served) == n + 1)  # type: ignore[misc]
        assert router.slots.waiting == 5 - n
    assert callers.served == ["high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"]
    assert router.slots.served == 6


async def test_a_slot_freed_for_a_waiter_is_not_taken_by_a_request_arriving_meanwhile() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("low-waiting", "low")
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")  # reserved for the low one, which has not run yet
    assert router.slots.reserved == {"agent://a": 1}
    assert router.full("agent://a")
    callers.send("high-late", "high")
    await turns(lambda: len(callers.served) == 1 and router.slots.waiting == 1)
    assert callers.served == ["low-waiting"]
    finish(router, "agent://a")
    await turns(lambda: len(callers.served) == 2)
    assert callers.served == ["low-waiting", "high-late"]


async def test_nobody_waits_while_another_candidate_has_a_slot() -> None:
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("low", "low")  # b is free: no wait, whatever its priority
    await turns(lambda: callers.served == ["low"])
    assert router.slots.waiting == 0
    assert callers.tasks["low"].result() == "agent://b"


async def test_a_new_endpoint_of_the_intent_takes_a_waiter_at_once() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("w", "normal")
    await turns(lambda: router.slots.waiting == 1)
    await register(router, "agent://new", port=9100)  # room appears: offered to the waiter
    await turns(lambda: callers.served == ["w"])
    assert callers.tasks["w"].result() == "agent://new"


async def test_a_cancelled_waiter_hands_its_reserved_slot_to_the_next() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("first", "high")
    callers.send("second", "low")
    await turns(lambda: router.slots.waiting == 2)
    finish(router, "agent://a")  # reserved for "first"...
    callers.tasks["first"].cancel()  # ...which goes away before it runs
    await turns(lambda: callers.served == ["second"])
    assert callers.tasks["first"].cancelled()
    assert router.slots.waiting == 0
    assert router.slots.reserved == {}


async def test_a_cancelled_attempt_frees_its_slot_for_a_waiter() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    stats = router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("w", "normal")
    await turns(lambda: router.slots.waiting == 1)
    router.attempt_cancelled("agent://a", stats)
    await turns(lambda: callers.served == ["w"])


async def test_a_hinted_request_waits_for_its_endpoint_only() -> None:
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    hinted = await plan(router, hint="agent://a")
    router.attempt_started("agent://a")
    callers = Callers(router, hinted)
    callers.send("hinted", "normal")
    await turns(lambda: router.slots.waiting == 1)
    router.attempt_started("agent://b")
    finish(router, "agent://b")  # b's slot is no use to it
    assert callers.served == []
    finish(router, "agent://a")
    await turns(lambda: callers.served == ["hinted"])
    assert callers.tasks["hinted"].result() == "agent://a"


# --- bounds of the waiting -------------------------------------------------------------------


async def test_a_wait_queue_holds_what_the_gateway_admits() -> None:
    """A review: the queues held 256 each, hard-coded, so that with one agent a ``high``
    request was refused at 64 + 256 in delivery, where the contract refuses it only at 100 %
    of --max-inflight (1,024 by default)."""
    router, _ = await make(["agent://a"], bound=1)
    assert router.slots.max_waiting == GatewaySettings().max_inflight == 1024
    router, _ = await make(["agent://a"], bound=1, max_inflight=300)
    assert router.slots.max_waiting == 300


async def test_the_wait_queue_is_bounded_low_refused_first() -> None:
    # low up to 7 waiting, normal up to 9, high up to 10 (the queue backs the gateway bound)
    router, _ = await make(["agent://a"], bound=1, max_inflight=10)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    for n in range(7):
        callers.send(f"low-{n}", "low")
    await turns(lambda: router.slots.waiting == 7)
    with pytest.raises(Overloaded) as refused:
        await router.acquire(p, (), "low")
    assert refused.value.retry_after_s == 1
    assert "7" in refused.value.detail
    callers.send("normal-0", "normal")
    callers.send("normal-1", "normal")
    await turns(lambda: router.slots.waiting == 9)
    with pytest.raises(Overloaded):
        await router.acquire(p, (), "normal")
    callers.send("high-0", "high")
    await turns(lambda: router.slots.waiting == 10)
    with pytest.raises(Overloaded):
        await router.acquire(p, (), "high")
    assert router.slots.refused == 3
    for task in callers.tasks.values():
        task.cancel()
    await asyncio.gather(*callers.tasks.values(), return_exceptions=True)
    assert router.slots.waiting == 0


async def test_a_request_whose_deadline_has_run_out_does_not_wait() -> None:
    router, clock = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    with pytest.raises(DeadlineExceeded):
        await router.acquire(p, (), "high", Deadline(clock.monotonic()))
    assert router.slots.waiting == 0
    # with a free slot the deadline is the attempt's business, not acquire's
    finish(router, "agent://a")
    assert await router.acquire(p, (), "high", Deadline(clock.monotonic())) == "agent://a"


async def test_a_waiter_whose_last_candidate_goes_away_gets_none() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("w", "normal")
    await turns(lambda: router.slots.waiting == 1)
    await router.deregister("agent://a")  # the waiters of its tags look again at once
    await turns(callers.tasks["w"].done)
    assert callers.tasks["w"].result() is None
    assert router.slots.waiting == 0


async def test_a_hinted_waiter_whose_endpoint_goes_away_gets_none_at_once() -> None:
    """Not at its next recheck (RECHECK_S later): the deregistration kicks the hint's queue as
    it kicks the intents' (a review found it waiting 250 ms)."""
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router, hint="agent://a")
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("w", "normal")
    await turns(lambda: router.slots.waiting == 1)
    await router.deregister("agent://a")
    await turns(callers.tasks["w"].done, bound=20)  # a few turns of the loop, not 250 ms
    assert callers.tasks["w"].result() is None
    assert router.slots.waiting == 0


async def test_no_candidate_at_all_is_none_without_waiting() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    finish_eject = router.attempt_started("agent://a")
    router.attempt_finished(
        "agent://a", finish_eject, Outcome.CONNECT_ERROR, 1.0, reached=False, eject=True
    )
    assert await router.acquire(p, ()) is None
    assert router.slots.waiting == 0


async def test_a_blameless_failure_leaves_the_endpoints_books_and_frees_its_slot() -> None:
    """Nothing went out for the gateway's sake (its NATS link down, a request over the
    server's max_payload): a review found the endpoint penalized all the same, so a caller's
    oversized payloads kept a NATS agent out of the load-aware choice."""
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    for name, blameless in (("agent://a", True), ("agent://b", False)):
        stats = router.attempt_started(name)
        router.attempt_finished(
            name, stats, Outcome.CONNECT_ERROR, 1.0, reached=False, eject=False,
            blameless=blameless,
        )  # fmt: skip
        assert stats.inflight == 0
    now = router.now()
    assert router.stats["agent://a"].cost_ms(now) == 0.0
    assert router.stats["agent://b"].cost_ms(now) > 0.0  # penalized: the agent's failure
    p = await plan(router)
    assert await router.acquire(p, ()) is not None  # a's slot was given back


# --- the queues themselves -------------------------------------------------------------------


async def test_offer_wakes_the_first_in_line_across_the_queues_an_endpoint_serves() -> None:
    slots = Slots(lambda: 0.0)
    low = slots.join("t.a", "low", intent="t.a")
    high = slots.join("t.b", "high", intent="t.b")
    normal = slots.join("t.a", "normal", intent="t.a")
    other = slots.join("t.c", "high", intent="t.c")  # a tag the endpoint does not serve
    woken = []
    for _ in range(4):
        slots.offer("agent://e", ("t.a", "t.b"), 1, routable=True, hintable=True)
        woken.append([w.woken for w in (high, normal, low, other)])
    assert woken == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, False],  # nobody left who can use it
    ]
    assert slots.reserved == {"agent://e": 3}


async def test_offer_order_and_requeue_keep_the_place_in_line() -> None:
    slots = Slots(lambda: 0.0)
    a = slots.join("t", "low", intent="t")
    b = slots.join("t", "low", intent="t")
    assert slots.offer("agent://e", ("t",), 1, routable=True, hintable=False) == 1
    assert a.woken and not b.woken
    assert slots.taken(a) == "agent://e"
    slots.requeue(a)  # found nothing after all: back in front of b
    assert slots.offer("agent://e", ("t",), 1, routable=True, hintable=False) == 1
    assert a.woken and not b.woken
    assert slots.leave(a) == "agent://e"  # left holding it: the caller offers it again
    assert slots.offer("agent://e", ("t",), 5, routable=True, hintable=False) == 1
    assert b.woken
    assert slots.offer("agent://e", ("t",), 5, routable=False, hintable=True) == 0
    slots.leave(b)
    assert slots.waiting == 0
    assert slots.reserved == {}


async def test_a_waiter_looking_again_keeps_one_entry_in_line() -> None:
    """A waiter looks again every RECHECK_S of a long wait and goes back in line: its entry
    stays one (a review found a copy pushed at each look: 55,000 entries for 230 waiters of a
    minute, and every leave() re-sorting them all, 11 ms of the loop each)."""
    slots = Slots(lambda: 0.0)
    a = slots.join("t", "low", intent="t")
    b = slots.join("t", "low", intent="t")
    for _ in range(100):  # looked again on its timeout, found nothing: back in line
        slots.requeue(a)
        slots.requeue(b)
    queue = slots._queues["t"]
    assert len(queue.heap) == 2
    # woken, it left the heap; having found nothing it is back, once, in front of b
    assert slots.offer("agent://e", ("t",), 1, routable=True, hintable=False) == 1
    assert slots.taken(a) == "agent://e"
    slots.requeue(a)
    slots.requeue(a)
    assert len(queue.heap) == 2
    assert slots.offer("agent://e", ("t",), 1, routable=True, hintable=False) == 1
    assert a.woken and not b.woken
    slots.leave(a)
    slots.leave(b)
    assert slots.waiting == 0


async def test_a_scoped_queue_is_offered_only_its_endpoints() -> None:
    slots = Slots(lambda: 0.0)
    scoped = slots.join(("t", ("agent://x",)), "high", intent="t", ids=("agent://x",))
    plain = slots.join("t", "low", intent="t")
    assert slots.offer("agent://y", ("t",), 1, routable=True, hintable=True) == 1
    assert plain.woken and not scoped.woken
    assert slots.offer("agent://x", ("t",), 1, routable=True, hintable=True) == 1
    assert scoped.woken


async def test_wait_times_out_without_a_wake_and_returns_at_once_when_woken() -> None:
    slots = Slots(lambda: 0.0)
    w = slots.join("t", "normal", intent="t")
    assert await slots.wait(w, 0.0) is False
    slots.offer("agent://e", ("t",), 1, routable=True, hintable=True)
    assert await slots.wait(w, 60.0) is True


# --- the hand-over: one wake-up a wait --------------------------------------------------------


async def test_two_waiters_one_slot_one_wake_up() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    callers = Callers(router, p)
    callers.send("first", "normal")
    callers.send("second", "normal")
    await turns(lambda: router.slots.waiting == 2)
    finish(router, "agent://a")  # one slot: reserved for the first, who takes it as it is
    await turns(lambda: callers.served == ["first"])
    for _ in range(5):  # nothing else stirs
        await asyncio.sleep(0)
    assert router.slots.wakeups == 1
    assert router.slots.waiting == 1
    assert not callers.tasks["second"].done()
    assert router.slots.reserved == {}  # the claim became the attempt's own slot
    finish(router, "agent://a")
    await turns(lambda: callers.served == ["first", "second"])
    assert router.slots.wakeups == 2


async def test_a_woken_waiter_takes_the_slot_it_was_woken_for_without_choosing_again() -> None:
    """Another candidate freed a slot too before the waiter ran, and looks cheaper: a choice
    made again would go there; the waiter takes the slot reserved for it instead."""
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    p = await plan(router)
    stats = {e: router.attempt_started(e) for e in ("agent://a", "agent://b")}
    waiting = asyncio.create_task(router.acquire(p, (), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    for endpoint_id, ms in (("agent://a", 500.0), ("agent://b", 1.0)):  # a offered, b free
        router.attempt_finished(
            endpoint_id, stats[endpoint_id], Outcome.OK, ms, reached=True, eject=False
        )
    assert router.choose(p, free_only=True) == "agent://b"  # free, and the cheaper of the two
    await turns(waiting.done)
    assert waiting.result() == "agent://a"
    assert router.slots.wakeups == 1


async def test_a_woken_waiter_takes_the_reserved_slot_as_its_claim() -> None:
    """The reservation the offer made is the slot acquire hands out: held until the attempt
    starts (or two turns of the loop), never counted twice."""
    router, _ = await make(["agent://a"], bound=2)
    p = await plan(router)
    for _ in range(2):
        router.attempt_started("agent://a")
    task = asyncio.create_task(router.acquire(p, (), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")
    assert router.slots.reserved == {"agent://a": 1}
    await turns(task.done)
    assert task.result() == "agent://a"
    assert router.slots.reserved == {"agent://a": 1}  # now the claim, not a second slot
    assert router.full("agent://a")  # one in flight, one claimed
    assert (router.slots.waiting, router.slots.served) == (0, 1)
    await turns(lambda: not router.slots.reserved)  # never started: given back
    assert not router.full("agent://a")


async def test_a_claim_from_a_hand_over_that_never_starts_goes_to_the_next_waiter() -> None:
    router, _ = await make(["agent://a"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    idle = asyncio.create_task(router.acquire(p, (), "high"))  # takes a slot, starts nothing
    callers = Callers(router, p)
    callers.send("next", "low")
    await turns(lambda: router.slots.waiting == 2)
    finish(router, "agent://a")
    await turns(lambda: idle.done() and callers.served == ["next"])
    assert idle.result() == "agent://a"
    assert router.slots.wakeups == 2


async def test_a_waiter_woken_for_an_endpoint_its_request_tried_chooses_again() -> None:
    """A retry waits; the slot offered first is at the endpoint it failed at, while another
    candidate has one too: it goes there (failover), and the offered slot is freed again."""
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    router.attempt_started("agent://b")
    retry = asyncio.create_task(router.acquire(p, ("agent://a",), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")  # offered to the retry, which tried a
    finish(router, "agent://b")  # nobody left in line: b's slot stays free
    await turns(retry.done)
    assert retry.result() == "agent://b"
    assert router.slots.reserved == {"agent://b": 1}  # a's reservation was given back
    assert not router.full("agent://a")


async def test_a_waiter_woken_for_a_tried_endpoint_takes_it_when_it_is_the_only_one() -> None:
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    router.attempt_started("agent://b")
    retry = asyncio.create_task(router.acquire(p, ("agent://a",), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")  # b stays full: a again is the only choice
    await turns(retry.done)
    assert retry.result() == "agent://a"
    assert router.slots.reserved == {"agent://a": 1}


async def test_a_hinted_waiter_takes_its_endpoint_though_tried() -> None:
    router, _ = await make(["agent://a"], bound=1)
    hinted = await plan(router, hint="agent://a")
    router.attempt_started("agent://a")
    retry = asyncio.create_task(router.acquire(hinted, ("agent://a",), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")
    await turns(retry.done)
    assert retry.result() == "agent://a"
    assert router.slots.wakeups == 1


async def test_a_waiter_woken_for_an_endpoint_gone_meanwhile_chooses_again() -> None:
    router, _ = await make(["agent://a", "agent://b"], bound=1)
    p = await plan(router)
    router.attempt_started("agent://a")
    router.attempt_started("agent://b")
    waiting = asyncio.create_task(router.acquire(p, (), "normal"))
    await turns(lambda: router.slots.waiting == 1)
    finish(router, "agent://a")  # reserved for the waiter...
    await router.deregister("agent://a")  # ...and gone before it runs
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()  # b is full: back in line
    assert router.slots.waiting == 1
    assert router.slots.reserved == {}
    finish(router, "agent://b")
    await turns(waiting.done)
    assert waiting.result() == "agent://b"


async def test_hand_over_turns_the_reservation_into_a_claim() -> None:
    slots = Slots(lambda: 0.0)
    w = slots.join("t", "normal", intent="t")
    slots.offer("agent://e", ("t",), 1, routable=True, hintable=True)
    assert slots.hand_over(w) == "agent://e"
    assert slots.reserved == {"agent://e": 1}
    assert (slots.waiting, slots.served, slots.wakeups) == (0, 1, 1)
    assert slots.leave(w) is None  # gone already: nothing to give back
    slots.consume("agent://e")  # its attempt starts
    assert slots.reserved == {}


async def test_a_retry_gets_its_endpoint_only_if_it_is_still_eligible_after_the_backoff() -> None:
    """The contract: before each retry the target's status is checked again. choose() gave a
    retry its endpoint; during the backoff that endpoint went away, or down: acquire chooses
    again (another candidate, or none), rather than start an attempt there (a deregistered one
    failed the whole request with all_attempts_failed)."""
    router, clock = await make(["agent://a", "agent://b"], 4)
    p = await plan(router)
    tried = {"agent://a": None}
    assert router.choose(p, tried) in ("agent://a", "agent://b")
    await router.deregister("agent://a")
    assert await router.acquire(p, tried, prefer="agent://a") == "agent://b"
    # re-registered meanwhile without the tag: not a candidate either
    await register(router, "agent://a", port=9000, intent="other.tag")
    assert await router.acquire(p, tried, prefer="agent://a") == "agent://b"

    router, clock = await make(["agent://c"], 4)
    p = await plan(router)
    tried = {"agent://c": None}
    assert router.choose(p, tried) == "agent://c"  # a retry of the same endpoint, after a wait
    clock.advance(10 * router.settings.heartbeat_interval)  # no heartbeat meanwhile: down
    assert await router.acquire(p, tried, prefer="agent://c") is None
    # the first attempt is given what choose() gave a moment before, as it is
    router, clock = await make(["agent://d"], 4)
    p = await plan(router)
    assert await router.acquire(p, (), prefer="agent://d") == "agent://d"


async def test_a_nats_subject_is_refused_while_any_other_id_there_is_up() -> None:
    """A review: the subject's holder was one id, the last registered; two could share it (the
    first down when the second came, then back by heartbeat), and when the second left, a third
    was let in beside the live first. Every id registered at the subject is kept."""
    from agent_reach.errors import InvalidRequest

    router, clock = await make([], bound=1, heartbeat_interval=1.0)

    async def at(name: str) -> None:
        body = RegisterBody(endpoint_id=name, capabilities=[INTENT], endpoint_url="nats:s.one")
        await router.register(body)

    await at("agent://n1")
    with pytest.raises(InvalidRequest):
        await at("agent://n2")
    clock.advance(10.0)  # n1 down (no heartbeat for 10 intervals)
    await at("agent://n2")  # a down holder does not keep the subject
    router.heartbeat("agent://n1")  # n1 back: both on it now
    await router.deregister("agent://n2")
    with pytest.raises(InvalidRequest):  # n1 still holds it
        await at("agent://n3")
    await at("agent://n1")  # its own subject again
