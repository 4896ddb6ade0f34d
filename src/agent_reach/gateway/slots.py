"""Requests waiting for an attempt slot (``--max-inflight-per-endpoint``), in priority order.

When every eligible candidate of a request has its bound of attempts open, the request waits
here rather than overloading an agent. The router owns the counting (attempts in flight per
endpoint, :mod:`agent_reach.core.routing` decides who is at the bound); this module owns the
queues and the hand-over of freed slots.

Invariants:
- One queue per key: an intent (every endpoint of its tag), an intent and the endpoints a
  policy scope keeps, or one hinted endpoint. Everyone in a queue can use any slot that one of
  its endpoints frees, so a freed slot is offered to the first waiter of the queues it serves.
- Order: ``high`` before ``normal`` before ``low``, first come first served within one
  (rank, then arrival). A slot freed while requests wait is *reserved* for the first of them
  (:attr:`Slots.reserved` counts toward the bound), so that a request arriving meanwhile does
  not take it from them; a request that finds a slot free does not wait (nobody waits while a
  slot is free that they could use).
- One wake-up a wait: a waiter woken with a slot reserved at an endpoint that :meth:`Slots.offer`
  judged it could use takes that slot (:meth:`Slots.hand_over`: the reservation becomes its
  claim), with no second choice, unless the router finds the endpoint no longer eligible for
  its request (tried already, or gone). Then, and when kicked (no slot) or looking again on
  its timeout, it gives the reservation back (:meth:`Slots.taken`) and the router chooses
  again; a waiter that leaves (deadline, cancellation) with a reservation hands it back too,
  and the router offers that slot again. A waiter that finds nothing after all goes back to
  its place.
- A slot handed out (:meth:`Slots.claim`, :meth:`Slots.hand_over`) stays reserved until an
  attempt starts at that endpoint (:meth:`Slots.consume`, oldest claim first) or the event loop
  has turned twice: an attempt begun in a task of its own (a hedge race) still finds it, and a
  claim whose attempt never started (an error on the way) is given back and offered again.
- Bounded: a queue holds at most ``max_waiting`` requests, ``low`` refused past 70 % of it,
  ``normal`` past 90 % (:func:`agent_reach.core.routing.wait_admits`): then 503 ``overloaded``.
  The router makes it ``--max-inflight``: every waiter is a request admitted and in delivery,
  so the gateway bound's shares refuse first, and a full queue is only a backstop.
- Waiting is bounded by the timeout the router passes in (what is left of the deadline, or
  its recheck interval): one timer a wait, which ends it without cancelling the task; the
  injected ``monotonic`` only paces the log line of refusals.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field

from agent_reach.core.routing import rank_of, wait_admits, wait_limit
from agent_reach.errors import Overloaded
from agent_reach.observability.logs import log
from agent_reach.settings import GatewaySettings

__all__ = ["MAX_WAITING", "Slots", "Waiter"]

# requests one queue (intent) holds at most: the router gives --max-inflight (every waiter is a
# request in delivery); this default is the same setting's
MAX_WAITING = GatewaySettings().max_inflight
RETRY_AFTER_S = 1  # what a request refused at a full queue is told (Retry-After)


def _time_up(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One request waiting for a slot."""

    __slots__ = ("endpoint", "future", "gone", "in_heap", "queue", "rank", "seq", "woken")

    def __init__(self, queue: _Queue, rank: int, seq: int) -> None:
        self.queue = queue
        self.rank = rank
        self.seq = seq
        self.in_heap = True  # its entry is in its queue's heap (one at most)
        self.woken = False  # holds a reservation on ``endpoint``
        self.endpoint: str | None = None
        self.gone = False
        self.future: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _Queue:
    key: Hashable
    intent: str | None  # None: a hinted endpoint's queue
    ids: frozenset[str] | None  # the endpoints a scope keeps (None: every one of the intent)
    heap: list[tuple[int, int, Waiter]] = field(default_factory=list)
    live: int = 0  # waiters not gone (woken ones included)

    def head(self) -> Waiter | None:
        """The first waiter not woken nor gone (stale entries are dropped on the way)."""
        heap = self.heap
        while heap:
            waiter = heap[0][2]
            if not waiter.gone and not waiter.woken:
                return waiter
            heapq.heappop(heap)
            waiter.in_heap = False
        return None

    def pop(self) -> Waiter:
        """Take the head (:meth:`head` found it) out of the heap."""
        waiter = heapq.heappop(self.heap)[2]
        waiter.in_heap = False
        return waiter


class Slots:
    """The wait queues of one router, and the slots reserved: for the waiters woken, and for
    the attempts about to start."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        on_free: Callable[[str], object] = lambda _: None,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self._monotonic = monotonic
        self._on_free = on_free  # a reserved slot was given back unused: offer it again
        self.max_waiting = max_waiting
        # endpoint -> slots held: for woken waiters, and handed out to attempts not yet started
        self.reserved: dict[str, int] = {}
        self._claims: dict[str, deque[int]] = {}  # endpoint -> the claims' tokens, oldest first
        self._tokens = itertools.count()
        self.waiting = 0  # requests waiting now, over every queue
        self.refused = 0  # requests refused at a full queue (503 overloaded), ever
        self.served = 0  # requests that waited and got a slot, ever
        self.wakeups = 0  # waiters woken (with a slot reserved, or kicked), ever
        self._queues: dict[Hashable, _Queue] = {}
        self._by_intent: dict[str, set[Hashable]] = {}
        self._seq = itertools.count()
        self._refusal_logged = -math.inf

    # --- a waiter's life ------------------------------------------------------------------

    def join(
        self,
        key: Hashable,
        priority: str | None,
        *,
        intent: str | None = None,
        ids: Collection[str] | None = None,
    ) -> Waiter:
        """Queue a request under ``key`` (an intent's, with ``ids`` a scope's, or a hinted
        endpoint's with ``intent`` None); Overloaded when that queue is full for its priority."""
        queue = self._queues.get(key)
        if queue is None:
            queue = _Queue(key, intent, None if not ids else frozenset(ids))
            self._queues[key] = queue
            if intent is not None:
                self._by_intent.setdefault(intent, set()).add(key)
        if not wait_admits(queue.live, self.max_waiting, priority):
            self.refused += 1
            self._log_refusal(queue, priority)
            if not queue.live:
                self._drop(queue)
            raise Overloaded(
                f"{queue.live} requests already wait for a free slot at the agents of"
                f" {self._name(queue)} (each at its --max-inflight-per-endpoint bound);"
                f" {priority or 'normal'} priority is refused from"
                f" {wait_limit(self.max_waiting, priority)} waiting",
                retry_after_s=RETRY_AFTER_S,
            )
        waiter = Waiter(queue, rank_of(priority), next(self._seq))
        heapq.heappush(queue.heap, (waiter.rank, waiter.seq, waiter))
        queue.live += 1
        self.waiting += 1
        log(
            logging.DEBUG,
            "route.waiting",
            queue=self._name(queue),
            priority=priority or "normal",
            waiting=queue.live,
        )
        return waiter

    async def wait(self, waiter: Waiter, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` to be woken; True when woken (with a reservation on
        ``waiter.endpoint``, or kicked: ``endpoint`` None)."""
        if waiter.woken:
            return True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter.future = future
        # a plain timer that ends the wait (cheaper than asyncio.timeout, which cancels the
        # task and turns the CancelledError into a TimeoutError)
        timer = loop.call_later(timeout_s if timeout_s > 0.0 else 0.0, _time_up, future)
        try:
            await future
        finally:
            timer.cancel()
            waiter.future = None
        return waiter.woken  # woken as the time ran out: the reservation is still its

    def hand_over(self, waiter: Waiter) -> str:
        """A woken waiter takes the slot reserved for it: the reservation becomes the claim
        :meth:`claim` would make (held until its attempt starts, or two turns of the loop),
        and the waiter leaves, served. Returns the endpoint."""
        endpoint = waiter.endpoint
        assert waiter.woken and endpoint is not None and not waiter.gone
        waiter.woken = False  # the reservation stays, as the claim's
        waiter.endpoint = None
        self.leave(waiter, served=True)
        self._hold(endpoint)
        return endpoint

    def taken(self, waiter: Waiter) -> str | None:
        """A woken waiter gives its reservation back before choosing again; returns the
        endpoint it was woken for (None when it was not woken, or only kicked)."""
        if not waiter.woken:
            return None
        endpoint = waiter.endpoint
        waiter.woken = False
        waiter.endpoint = None
        if endpoint is not None:
            self._unreserve(endpoint)
        return endpoint

    def requeue(self, waiter: Waiter) -> None:
        """A waiter that found nothing after all goes back to its place in line (woken, its
        entry left the heap; one that looked again on its timeout is still there: one entry a
        waiter, however many times it looks)."""
        if waiter.gone or waiter.woken or waiter.in_heap:
            return
        waiter.in_heap = True
        heapq.heappush(waiter.queue.heap, (waiter.rank, waiter.seq, waiter))

    def leave(self, waiter: Waiter, *, served: bool = False) -> str | None:
        """The waiter is done (served, out of time, cancelled); idempotent. Returns the
        endpoint whose reservation it still held (to be offered again), or None."""
        if waiter.gone:
            return None
        released = self.taken(waiter)
        waiter.gone = True
        queue = waiter.queue
        queue.live -= 1
        self.waiting -= 1
        self.served += served
        if not queue.live:
            self._drop(queue)
        elif len(queue.heap) > 2 * queue.live + 16:  # entries of waiters gone meanwhile
            queue.heap = [e for e in queue.heap if not e[2].gone and not e[2].woken]
            heapq.heapify(queue.heap)
        return released

    # --- slots handed out -------------------------------------------------------------------

    def claim(self, endpoint_id: str) -> None:
        """Hold a slot of ``endpoint_id`` for an attempt about to start (module docstring)."""
        self.reserved[endpoint_id] = self.reserved.get(endpoint_id, 0) + 1
        self._hold(endpoint_id)

    def _hold(self, endpoint_id: str) -> None:
        """Make one slot reserved at ``endpoint_id`` a claim: consumed by the next attempt
        there, or given back two turns of the loop from now."""
        token = next(self._tokens)
        self._claims.setdefault(endpoint_id, deque()).append(token)
        loop = asyncio.get_running_loop()
        loop.call_soon(loop.call_soon, self._expire, endpoint_id, token)  # two turns

    def consume(self, endpoint_id: str) -> None:
        """An attempt starts at ``endpoint_id``: the oldest slot held for it becomes its own."""
        claims = self._claims.get(endpoint_id)
        if not claims:
            return
        claims.popleft()
        if not claims:
            del self._claims[endpoint_id]
        self._unreserve(endpoint_id)

    def _expire(self, endpoint_id: str, token: int) -> None:
        claims = self._claims.get(endpoint_id)
        if not claims or token not in claims:
            return  # consumed
        claims.remove(token)
        if not claims:
            del self._claims[endpoint_id]
        self._unreserve(endpoint_id)
        self._on_free(endpoint_id)

    # --- freed slots ------------------------------------------------------------------------

    def offer(
        self,
        endpoint_id: str,
        intents: Iterable[str],
        room: int,
        *,
        routable: bool,
        hintable: bool,
    ) -> int:
        """Wake up to ``room`` waiters that can use a slot of ``endpoint_id``, first in order
        first, each with a slot reserved; returns how many were woken.

        ``intents`` are the endpoint's tags; ``routable``: it may serve intent routing now
        (healthy or degraded); ``hintable``: it may serve its own hint (not down).
        """
        if not self.waiting or room <= 0:
            return 0
        queues: list[_Queue] = []
        if hintable and (hinted := self._queues.get(("hint", endpoint_id))) is not None:
            queues.append(hinted)
        if routable:
            for intent in intents:
                for key in self._by_intent.get(intent, ()):
                    queue = self._queues[key]
                    if queue.ids is None or endpoint_id in queue.ids:
                        queues.append(queue)
        woken = 0
        while woken < room:
            best: Waiter | None = None
            for queue in queues:
                head = queue.head()
                if head is not None and (
                    best is None or (head.rank, head.seq) < (best.rank, best.seq)
                ):
                    best = head
            if best is None:
                break
            best.queue.pop()  # best is its queue's head
            best.woken = True
            best.endpoint = endpoint_id
            self.reserved[endpoint_id] = self.reserved.get(endpoint_id, 0) + 1
            if best.future is not None and not best.future.done():
                best.future.set_result(None)
            woken += 1
        self.wakeups += woken
        return woken

    def kick(self, intents: Iterable[str], endpoint_id: str | None = None) -> int:
        """Wake every waiter of ``intents`` (and of the hint ``endpoint_id``) without a slot,
        to look again (an endpoint went away: those left with no candidate answer at once);
        returns how many were woken."""
        queues = [
            self._queues[key] for intent in intents for key in self._by_intent.get(intent, ())
        ]
        if endpoint_id is not None and (hinted := self._queues.get(("hint", endpoint_id))):
            queues.append(hinted)
        woken = 0
        for queue in queues:
            while (head := queue.head()) is not None:
                queue.pop()
                head.woken = True
                head.endpoint = None
                if head.future is not None and not head.future.done():
                    head.future.set_result(None)
                woken += 1
        self.wakeups += woken
        return woken

    # --- inside -----------------------------------------------------------------------------

    def _unreserve(self, endpoint_id: str) -> None:
        left = self.reserved.get(endpoint_id, 0) - 1
        if left > 0:
            self.reserved[endpoint_id] = left
        else:
            self.reserved.pop(endpoint_id, None)

    def _drop(self, queue: _Queue) -> None:
        self._queues.pop(queue.key, None)
        if queue.intent is not None:
            keys = self._by_intent.get(queue.intent)
            if keys is not None:
                keys.discard(queue.key)
                if not keys:
                    del self._by_intent[queue.intent]

    @staticmethod
    def _name(queue: _Queue) -> str:
        if queue.intent is None:
            return str(queue.key[1]) if isinstance(queue.key, tuple) else str(queue.key)
        return repr(queue.intent)

    def _log_refusal(self, queue: _Queue, priority: str | None) -> None:
        now = self._monotonic()
        if now - self._refusal_logged >= 1.0:
            self._refusal_logged = now
            log(
                logging.WARNING,
                "route.wait_queue_full",
                queue=self._name(queue),
                priority=priority or "normal",
                waiting=queue.live,
                max_waiting=self.max_waiting,
                refused_so_far=self.refused,
            )
