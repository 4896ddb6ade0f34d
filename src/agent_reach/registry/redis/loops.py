"""The background loops of the Redis registry, and how they end.

Invariants:

- **Sleeps go through the injected clock** (:class:`~agent_reach.clock.Clock`), never
  :func:`asyncio.sleep` directly.
- **Each iteration catches its own failures**: Redis away (``BackendUnavailable``) marks the
  link lost and backs off (doubling, at most :data:`RETRY_MAX_S`); anything else is logged
  with its traceback and backed off too, so that a bug cannot stop the view from being kept
  up to date. Cancellation always passes.
- **Timing.** Heartbeats are written in one batch at most every ``flush_s``; every gateway
  reads newer ones every ``sync_s``; a full reconcile runs every ``reconcile_s`` and after any
  failure or (re)subscription. A heartbeat is seen elsewhere after at most
  :data:`STALENESS_BOUND_S` (plus a round trip). The flush and sync loops both flush the
  buffer: one flush at a time (the buffer's lock), so an entry is never written twice.
- **A dead subscription is replaced within a bound.** The listener's connection is probed
  (a PING after :data:`LISTEN_IDLE_S` with nothing heard) and given up when a probe goes
  unanswered for the socket timeout (``connect_timeout_s``; see
  :class:`~agent_reach.registry.redis.store.EventStream`), even when the socket stays open
  and silent (a NAT or load balancer that dropped it). The listener then subscribes again on
  a new connection and asks for a reconcile, so a change missed meanwhile reaches this view
  within :data:`LISTEN_IDLE_S` + ``connect_timeout_s`` + 2 x ``sync_s`` of the link dying
  (5.4 s by default), plus a few round trips, instead of at the next periodic reconcile. The
  failure counts as Redis lost (``registry.unavailable``) until the sync loop's next call
  succeeds: this gateway cannot tell a dead subscription from a dying path to Redis.
- **Shutdown.** :meth:`Loops.close` ends the loops even when a cancellation is lost inside
  redis-py (Python 3.11's ``asyncio.wait_for`` drops one that coincides with the awaited
  result): each loop also checks :attr:`Loops.closing`, and close waits a bounded time.
"""

from __future__ import annotations

import asyncio
import logging

from agent_reach.clock import Clock
from agent_reach.errors import BackendUnavailable
from agent_reach.observability.logs import log
from agent_reach.registry.redis.buffer import WriteBuffer
from agent_reach.registry.redis.link import Link
from agent_reach.registry.redis.store import RedisStore
from agent_reach.registry.redis.sync import ViewSync
from agent_reach.registry.redis.versions import Versions

__all__ = [
    "FLUSH_S",
    "LISTEN_IDLE_S",
    "RECONCILE_S",
    "RETRY_MAX_S",
    "STALENESS_BOUND_S",
    "SYNC_S",
    "Loops",
]

FLUSH_S = 0.05  # heartbeats are written in one pipelined batch at most this often
SYNC_S = 0.2  # every gateway reads newer heartbeats this often
RECONCILE_S = 30.0  # full comparison of view and Redis (repairs lost notifications)
STALENESS_BOUND_S = FLUSH_S + SYNC_S  # a heartbeat seen elsewhere after at most this (+ RTT)
RETRY_MAX_S = 2.0  # longest wait between attempts to reach Redis again
CLOSE_WAIT_S = 2.0  # how long close() waits for a background loop to end, per attempt
LISTEN_POLL_S = 1.0  # the listener looks at `closing` at least this often
# the listener PINGs after this long with nothing heard on its connection: far below the idle
# timeouts of NATs and load balancers (minutes), so the probes also keep it from idling out
LISTEN_IDLE_S = 3.0


class Loops:
    """The flush, sync and listen loops of one registry."""

    def __init__(
        self,
        *,
        clock: Clock,
        store: RedisStore,
        versions: Versions,
        buffer: WriteBuffer,
        link: Link,
        view_sync: ViewSync,
        flush_s: float,
        sync_s: float,
        reconcile_s: float,
    ) -> None:
        self._clock, self._store, self._versions = clock, store, versions
        self._buffer, self._link, self._sync = buffer, link, view_sync
        self.flush_s, self.sync_s, self.reconcile_s = flush_s, sync_s, reconcile_s
        self.closing = False
        self.subscribed = asyncio.Event()  # the listener's first subscription was confirmed
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the three loops."""
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="registry-flush"),
            asyncio.create_task(self._sync_loop(), name="registry-sync"),
            asyncio.create_task(self._listen_loop(), name="registry-listen"),
        ]

    async def close(self) -> None:
        """Cancel the loops and wait for them (a bounded time); log any that failed."""
        tasks, self._tasks = self._tasks, []
        self.closing = True  # a loop whose cancellation got lost in a client library ends too
        pending = set(tasks)
        for _ in range(3):
            for task in pending:
                task.cancel()
            if not pending:
                break
            _, pending = await asyncio.wait(pending, timeout=CLOSE_WAIT_S)
        if pending:
            log(
                logging.ERROR, "registry.close_timeout", tasks=sorted(t.get_name() for t in pending)
            )
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log(
                    logging.ERROR,
                    "registry.loop_failed",
                    task=task.get_name(),
                    error=repr(task.exception()),
                )

    def _lost(self, exc: BackendUnavailable) -> None:
        self._link.lost(exc, self._store.now())

    async def _flush_loop(self) -> None:
        wake = self._buffer.wake
        while not self.closing:
            await wake.wait()
            await self._clock.sleep(self.flush_s)  # gather a batch
            wake.clear()
            try:
                await self._buffer.flush(self._store, self._versions, self._store.now)
                self._link.healthy(self._store.now())
            except BackendUnavailable as exc:
                self._lost(exc)
                await self._clock.sleep(min(RETRY_MAX_S, self.sync_s * 4))
                wake.set()
            except Exception:
                log(logging.ERROR, "registry.flush_failed", exc_info=True)
                await self._clock.sleep(RETRY_MAX_S)
                wake.set()
            if self._buffer.beats:
                wake.set()

    async def _sync_loop(self) -> None:
        since_reconcile = 0.0
        wait = self.sync_s
        while not self.closing:
            await self._clock.sleep(wait)
            since_reconcile += wait
            try:
                if self._buffer.writes:
                    await self._buffer.flush(self._store, self._versions, self._store.now)
                if self._link.reconcile_due or since_reconcile >= self.reconcile_s:
                    await self._sync.reconcile()
                    since_reconcile = 0.0
                else:
                    await self._sync.sync()
                wait = self.sync_s
            except BackendUnavailable as exc:
                self._lost(exc)
                wait = min(RETRY_MAX_S, wait * 2)
            except Exception:  # a bug must not stop the view from being kept up to date
                log(logging.ERROR, "registry.sync_failed", exc_info=True)
                wait = min(RETRY_MAX_S, wait * 2)

    async def _listen_loop(self) -> None:
        wait = self.sync_s
        while not self.closing:
            try:
                async with self._store.events(idle_s=LISTEN_IDLE_S) as events:
                    self._link.reconcile_due = True  # whatever was announced before now
                    self.subscribed.set()
                    wait = self.sync_s
                    while not self.closing:
                        data = await events.next(LISTEN_POLL_S)
                        if data is not None:
                            await self._sync.on_event(data)
            except BackendUnavailable as exc:
                self._lost(exc)
            except Exception:
                log(logging.ERROR, "registry.listen_failed", exc_info=True)
            await self._clock.sleep(wait)
            wait = min(RETRY_MAX_S, wait * 2)
