"""Hedged requests: a second attempt to another candidate when the first is slow to answer.

Opt-in per intent, for idempotent work, by the dictionary's ``hedge_after_ms`` (CONTRACT.md
v1.1, "Overload and priority"; docs/routing.md, "Hedging"). The delivery loop
(:mod:`agent_reach.gateway.delivery`) runs each attempt of such a request through
:meth:`Hedging.step`; the agents dedup by ``msg_id``, so a duplicate is harmless.

Invariants:
- A request hedges at most once, never with a ``recipient_hint``, and never to an endpoint it
  already tried (so never to the endpoint of the attempt it races).
- The wait before the hedge is ``hedge_after_ms``, or for ``hedge_after_ms = 0`` the intent's
  measured p95 (:class:`AnswerTimes`; before the intent's first answer there is none, and no
  hedge). A hedge is sent only when that wait ends before the attempt it races would time out
  (that attempt's timeout is already cut to the deadline), and its own timeout is cut to what
  is left of the deadline: a hedge never runs past it.
- A hedge is charged to the retry budget as it is sent; when the budget refuses, none is sent
  and the first attempt runs on alone.
- A hedge goes only to a candidate with a free slot (``--max-inflight-per-endpoint``), and
  that slot is claimed as the hedge is chosen, as :meth:`Router.acquire` claims one: a request
  arriving before the hedge's task has started does not take it too.
- The first answer wins: an ``ok``, or a 4xx (``agent_error``, never retried), of either
  attempt ends the race. The other attempt is then cancelled and awaited before the race
  returns, so its in-flight count is released and its span and trace event (outcome
  ``timeout``, with ``cancelled: true``) are written by then; the attempt that decided is
  listed after it. A retryable failure of one attempt leaves the other to run on; when both
  fail, the later failure goes to the retry rules.
- A cancelled attempt teaches the router only that its endpoint took at least that long
  (:meth:`~agent_reach.gateway.router.Router.attempt_cancelled`): its peak-EWMA cost is raised
  to it, and it is a latency sample only past the slow threshold (a lower bound over it). Without
  it an endpoint that never answers before the hedge would keep its optimistic cost and be
  chosen first again and again, and one that loses every race by seconds would never be slow.
- All waiting goes through the injected clock.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from agent_reach.core.health import P95_WINDOW
from agent_reach.core.model import Outcome
from agent_reach.core.retry import Deadline
from agent_reach.errors import AllAttemptsFailed
from agent_reach.observability.logs import log
from agent_reach.transport.base import Delivery
from agent_reach.wire.answers import Attempt

if TYPE_CHECKING:
    from agent_reach.gateway.metrics import GatewayMetrics
    from agent_reach.gateway.router import RoutePlan, Router
    from agent_reach.gateway.tracing import OpenTrace
    from agent_reach.intents.dictionary import IntentDictionary

__all__ = [
    "AnswerTimes",
    "AttemptNotStarted",
    "Attempter",
    "Hedger",
    "Hedging",
    "Request",
    "hedge_delay_ms",
]

Attempter = Callable[[str, float, list[Attempt], bool], Coroutine[Any, Any, Delivery]]
"""``(endpoint_id, timeout_s, attempts, hedge)`` -> the delivery: one attempt, appended to
``attempts`` (cancelled too) and learnt from by the delivery loop; AgentError for a 4xx;
:class:`AttemptNotStarted` when its endpoint went away before it began."""


class AttemptNotStarted(AllAttemptsFailed):
    """An attempt's endpoint was deregistered before the attempt began: nothing was sent. A
    hedge that meets it is dropped and the attempt it raced runs on alone."""


class Request(Protocol):
    """What hedging reads of a request in delivery (the delivery loop's state of it)."""

    plan: RoutePlan
    deadline: Deadline
    trace_id: str
    opened: OpenTrace


def hedge_delay_ms(hedge_after_ms: int | None, p95_ms: float | None) -> float | None:
    """How long an attempt runs alone before it is hedged: ``hedge_after_ms``, or the intent's
    ``p95_ms`` when that is 0 (None: no hedge, for an entry without the field or an intent with
    no answer measured yet)."""
    if hedge_after_ms is None:
        return None
    if hedge_after_ms > 0:
        return float(hedge_after_ms)
    return p95_ms


class AnswerTimes:
    """How long one intent's last :data:`~agent_reach.core.health.P95_WINDOW` answered attempts
    took to bring their answer (a race: from the first attempt's start), for its p95."""

    __slots__ = ("_order", "_sorted")

    def __init__(self) -> None:
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def add(self, ms: float) -> None:
        """Note one answer that came ``ms`` after its attempt started."""
        if len(self._order) == P95_WINDOW:
            del self._sorted[bisect.bisect_left(self._sorted, self._order.popleft())]
        self._order.append(ms)
        bisect.insort(self._sorted, ms)

    def p95_ms(self) -> float | None:
        """The p95 of the answers noted (None before the first)."""
        kept = self._sorted
        return kept[math.ceil(0.95 * len(kept)) - 1] if kept else None


class Hedger:
    """The gateway's hedging: which requests hedge (their tag's dictionary entry), the answer
    times of the intents that hedge after their p95, and the ``agent_reach_hedges_total``
    counters."""

    def __init__(self, router: Router, metrics: GatewayMetrics, trace: Callable[..., None]) -> None:
        self.router = router
        self.trace = trace  # (trace_id, kind, **data): an event of a request's trace
        hedges = metrics.hedges
        self.sent = hedges.labels("sent")
        self.won = hedges.labels("won")
        self.refused = hedges.labels("refused")
        self._times: dict[str, AnswerTimes] = {}
        self._kept_for: IntentDictionary | None = None  # the dictionary _times is kept for

    def start(self, request: Request, attempt: Attempter) -> Hedging | None:
        """The hedging of ``request``, whose attempts ``attempt`` makes (None: it does not
        hedge: a hinted request, or a tag whose dictionary entry does not ask for it)."""
        plan = request.plan
        if plan.hint is not None:
            return None
        dictionary = self.router.dictionary
        entry = dictionary.entries.get(plan.intent)
        if entry is None or entry.hedge_after_ms is None:
            return None
        times = None
        if entry.hedge_after_ms == 0:
            if dictionary is not self._kept_for:  # a reload: keep the entries that still measure
                self._kept_for = dictionary
                self._times = {
                    tag: kept
                    for tag, kept in self._times.items()
                    if (e := dictionary.entries.get(tag)) is not None and e.hedge_after_ms == 0
                }
            times = self._times.setdefault(plan.intent, AnswerTimes())
        return Hedging(self, request, entry.hedge_after_ms, times, attempt)


class Hedging:
    """One request's hedging, across its attempts: :meth:`step` runs each one."""

    __slots__ = ("_after_ms", "_attempt", "_hedger", "_times", "request", "sent")

    def __init__(
        self,
        hedger: Hedger,
        request: Request,
        after_ms: int,
        times: AnswerTimes | None,
        attempt: Attempter,
    ) -> None:
        self._hedger = hedger
        self.request = request
        self._after_ms = after_ms
        self._times = times  # None: the entry gives its wait (hedge_after_ms > 0)
        self._attempt = attempt
        self.sent = False  # a request hedges at most once

    def _trace(self, kind: str, **data: Any) -> None:
        self._hedger.trace(self.request.trace_id, kind, **data)

    async def step(
        self, target: str, timeout_s: float, tried: dict[str, None], attempts: list[Attempt]
    ) -> tuple[str, Delivery]:
        """One attempt at ``target`` (``timeout_s``, already cut to the deadline), raced by a
        hedge when this request may still send one: the endpoint and the delivery that decided
        the step. ``tried`` gains the hedge's endpoint. Raises what an attempt raises
        (AgentError for a 4xx), the other attempt cancelled first."""
        clock = self._hedger.router.clock
        started = clock.monotonic()
        p95 = self._times.p95_ms() if self._times is not None else None
        delay_ms = None if self.sent else hedge_delay_ms(self._after_ms, p95)
        if delay_ms is None or delay_ms / 1000.0 >= timeout_s:
            delivery = await self._attempt(target, timeout_s, attempts, False)
        else:
            target, delivery = await self._race(target, timeout_s, delay_ms, tried, attempts)
        if delivery.outcome is Outcome.OK and self._times is not None:
            self._times.add((clock.monotonic() - started) * 1000.0)
        return target, delivery

    async def _race(
        self,
        target: str,
        timeout_s: float,
        delay_ms: float,
        tried: dict[str, None],
        attempts: list[Attempt],
    ) -> tuple[str, Delivery]:
        """The attempt at ``target`` against a hedge sent after ``delay_ms`` (module
        docstring)."""
        clock = self._hedger.router.clock
        base = len(attempts)
        first = asyncio.create_task(self._attempt(target, timeout_s, attempts, False))
        racing: dict[asyncio.Task[Delivery], str] = {first: target}
        timer: asyncio.Task[None] | None = asyncio.create_task(clock.sleep(delay_ms / 1000.0))
        decided: str | None = None  # the endpoint whose answer (or 4xx) ended the race
        failed: tuple[str, Delivery] | None = None
        try:
            while racing:
                waiting: set[asyncio.Future[Any]] = {*racing}
                if timer is not None:
                    waiting.add(timer)
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in [t for t in racing if t in done]:  # the first attempt first
                    endpoint_id = racing.pop(task)
                    if (
                        task is not first
                        and not task.cancelled()
                        and isinstance(task.exception(), AttemptNotStarted)
                    ):
                        # its endpoint went away between the choice and the task's start (a
                        # deregistration in between): no hedge after all, the first runs on
                        self._trace(
                            "hedge",
                            racing=target,
                            after_ms=round(delay_ms, 3),
                            sent=False,
                            reason="its endpoint was deregistered before it started",
                            endpoint_id=endpoint_id,
                        )
                        continue
                    decided = endpoint_id  # also when it raises (a 4xx)
                    delivery = task.result()
                    if delivery.outcome is Outcome.OK:
                        if task is not first:
                            self._hedger.won.inc()
                        return endpoint_id, delivery
                    decided, failed = None, (endpoint_id, delivery)
                if timer is not None and timer in done:
                    timer = None
                    hedge = self._hedge(target, delay_ms, tried) if racing else None
                    if hedge is not None:
                        other, hedge_timeout_s = hedge
                        task = asyncio.create_task(
                            self._attempt(other, hedge_timeout_s, attempts, True)
                        )
                        racing[task] = other
            assert failed is not None  # the loop ends when every attempt has ended
            return failed
        finally:
            if timer is not None:
                timer.cancel()
            await self._settle(racing)
            if decided is not None:  # the deciding attempt last, after the cancelled one
                for i in range(len(attempts) - 1, base - 1, -1):
                    if attempts[i].endpoint_id == decided:
                        attempts.append(attempts.pop(i))
                        break

    def _hedge(
        self, target: str, delay_ms: float, tried: dict[str, None]
    ) -> tuple[str, float] | None:
        """The endpoint and timeout of the hedge of the attempt at ``target``, charged to the
        retry budget; None when there is no other eligible candidate, no budget, or too little
        time left for it to answer: less than the endpoint's p95, or, with no history of it,
        than the head start the first attempt had (a hedge of a few milliseconds cannot
        answer, and its timeout would count against an endpoint that was never given time)."""
        router = self._hedger.router
        now = router.clock.monotonic()
        remaining = self.request.deadline.remaining(now)
        other = router.choose(self.request.plan, tried, free_only=True)
        after_ms = round(delay_ms, 3)
        if other is None or other in tried:
            why = "no other eligible candidate"
            self._trace("hedge", racing=target, after_ms=after_ms, sent=False, reason=why)
            return None
        stats = router.stats.get(other)
        p95 = stats.p95_ms() if stats is not None else None
        needed_ms = delay_ms if p95 is None else p95
        if remaining * 1000.0 < needed_ms or remaining <= 0.0:
            why = f"not enough time left ({remaining * 1000.0:.0f} ms, {needed_ms:.0f} needed)"
            self._trace("hedge", racing=target, after_ms=after_ms, sent=False, reason=why)
            return None
        if not router.budget.try_spend(now):
            self._hedger.refused.inc()
            self._trace(
                "hedge", racing=target, after_ms=after_ms, sent=False, reason="retry budget"
            )
            return None
        self.sent = True
        self._hedger.sent.inc()
        router.slots.claim(other)  # its slot, from now to its attempt's start in its own task
        tried[other] = None
        self._trace("hedge", racing=target, after_ms=after_ms, sent=True, endpoint_id=other)
        span = self.request.opened.span
        if span is not None:
            span.retry("hedge", other, delay_ms / 1000.0)
        log(logging.INFO, "route.hedge", from_endpoint=target, to_endpoint=other, after_ms=after_ms)
        return other, min(router.per_try_ms(other) / 1000.0, remaining)

    async def _settle(self, racing: dict[asyncio.Task[Delivery], str]) -> None:
        """Cancel the attempts still racing and wait for them to end (they record themselves
        as cancelled, and what they took: Router.attempt_cancelled)."""
        if not racing:
            return
        for task in racing:
            task.cancel()
        await asyncio.wait(racing)
        for task in racing:
            if not task.cancelled():
                task.exception()  # it ended as the race did: retrieved, and set aside
