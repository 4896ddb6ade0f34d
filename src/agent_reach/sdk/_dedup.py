"""Run a delivery's handler once per message, however often the message arrives.

The gateway may deliver the same ``msg_id`` twice: after a lost answer (the first run finished,
its answer did not come back in time) or while the first run is still going (the gateway timed
the attempt out and retried the same agent). :class:`RunOnce` answers both from one run:

- a finished run's answer is kept in :class:`RecentResults`, a bounded LRU with a time to live,
  when the caller says it is final (successes and deliberate rejections; not crashes, which a
  retry should run again);
- a run still going is joined: the second delivery awaits the same task;
- a key may carry a fingerprint of what it names (a delivery's payload): the same key with
  another fingerprint is refused (:class:`Conflict`), not answered with the other one's result.

Invariants: at most one run per key is in flight; a run is never cancelled by the delivery that
started it going away (it runs in its own task, awaited through :func:`asyncio.shield`), so its
answer lands in the cache for the retry; :meth:`RunOnce.close` cancels the runs and waits for
them no longer than it is told (a run that swallows its cancellation cannot hold shutdown for
ever); the cache never holds more than ``max_entries`` entries or ``max_bytes`` bytes of
answers and their keys, and never answers with an entry past its TTL.
State is in memory, per process: agents behind a load balancer, or restarted, do not share it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

__all__ = ["Conflict", "RecentResults", "RunOnce", "Sized"]

Key = Hashable
How = Literal["ran", "joined", "cached"]


class Sized(Protocol):
    """A result that knows how many bytes it holds (for the cache's byte bound)."""

    @property
    def size(self) -> int:
        """Bytes held."""
        ...


R = TypeVar("R", bound=Sized)


@dataclass(slots=True)
class _Entry(Generic[R]):
    value: R
    expires_at: float
    size: int  # the value's bytes and its key's
    fingerprint: Hashable = None


def _no_bytes(key: Key) -> int:
    return 0


class Conflict(Exception):
    """A key came again with another fingerprint than the one its run or result has."""


class RecentResults(Generic[R]):
    """Answers of recent runs by key: LRU eviction past ``max_entries`` or ``max_bytes``, and
    entries older than ``ttl_s`` are never returned. ``now`` is passed in (no clock reads).

    An entry's bytes are its value's ``size`` plus ``key_bytes(key)``: keys come from callers
    (a ``msg_id`` is theirs to choose), so a bound that counted only the answers would let
    large keys hold memory it never sees."""

    def __init__(
        self,
        max_entries: int = 1024,
        ttl_s: float = 600.0,
        max_bytes: int = 64 << 20,
        key_bytes: Callable[[Key], int] = _no_bytes,
    ):
        if max_entries < 0 or ttl_s < 0 or max_bytes < 0:
            raise ValueError("max_entries, ttl_s and max_bytes must not be negative")
        self.max_entries, self.ttl_s, self.max_bytes = max_entries, ttl_s, max_bytes
        self._key_bytes = key_bytes
        self._entries: OrderedDict[Key, _Entry[R]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes held by the cached results and their keys."""
        return self._bytes

    def get(self, key: Key, now: float, fingerprint: Hashable = None) -> R | None:
        """The result kept for ``key``, if any and not expired (and mark it recently used);
        :class:`Conflict` when it was kept with another ``fingerprint``."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now >= entry.expires_at:
            self._drop(key)
            return None
        if entry.fingerprint != fingerprint:
            raise Conflict(key)
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: Key, value: R, now: float, fingerprint: Hashable = None) -> None:
        """Keep ``value`` for ``key`` until ``now + ttl_s``, evicting the least recently used.

        A result larger than ``max_bytes`` with its key (or any, with a zero bound) is not
        kept.
        """
        if key in self._entries:
            self._drop(key)
        size = value.size + self._key_bytes(key)
        if size > self.max_bytes or self.max_entries == 0 or self.ttl_s == 0:
            return
        self._entries[key] = _Entry(value, now + self.ttl_s, size, fingerprint)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.size


class RunOnce(Generic[R]):
    """One run per key at a time, and finished final results answered from the cache."""

    def __init__(
        self,
        cache: RecentResults[R],
        is_final: Callable[[R], bool],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self._is_final = is_final
        self._now = now
        self._running: dict[Key, asyncio.Task[R]] = {}
        self._prints: dict[Key, Hashable] = {}  # the fingerprints of the runs in flight

    @property
    def running(self) -> int:
        """Runs in flight."""
        return len(self._running)

    def begin(
        self, key: Key, start: Callable[[], Awaitable[R]], fingerprint: Hashable = None
    ) -> tuple[Awaitable[R], How]:
        """What to await for ``key``'s result, and where it comes from: the cache, the run in
        flight (joined), or a new run of ``start()`` (ran). Known at once, so that a repeat can
        be logged when it arrives. Cancelling the await does not cancel the run.
        :class:`Conflict` when the result or the run of ``key`` has another ``fingerprint``.
        """
        loop = asyncio.get_running_loop()
        hit = self.cache.get(key, self._now(), fingerprint)
        if hit is not None:
            done = loop.create_future()
            done.set_result(hit)
            return done, "cached"
        task = self._running.get(key)
        how: How = "joined"
        if task is not None and self._prints.get(key) != fingerprint:
            raise Conflict(key)
        if task is None:
            task = loop.create_task(self._first(key, start, fingerprint))
            self._running[key] = task
            self._prints[key] = fingerprint
            # a callback, not a finally: a task cancelled before it started runs no finally
            task.add_done_callback(functools.partial(self._forget, key))
            how = "ran"
        return asyncio.shield(task), how

    async def run(
        self, key: Key, start: Callable[[], Awaitable[R]], fingerprint: Hashable = None
    ) -> tuple[R, How]:
        """:meth:`begin`, awaited: the result and where it came from."""
        result, how = self.begin(key, start, fingerprint)
        return await result, how

    async def _first(self, key: Key, start: Callable[[], Awaitable[R]], fingerprint: Hashable) -> R:
        result = await start()
        if self._is_final(result):  # while still running: no gap between
            self.cache.put(key, result, self._now(), fingerprint)
        return result

    def _forget(self, key: Key, task: asyncio.Task[R]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
            self._prints.pop(key, None)

    async def close(self, timeout_s: float) -> list[Key]:
        """Cancel the runs in flight and wait up to ``timeout_s`` for them to end (at
        shutdown); the keys of those still going then (a handler that swallows its
        cancellation), left to run on unawaited, so that shutdown never hangs on one."""
        running = list(self._running.items())
        for _, task in running:
            task.cancel()
        left: list[Key] = []
        if running:
            _, pending = await asyncio.wait([task for _, task in running], timeout=timeout_s)
            left = [key for key, task in running if task in pending]
        for key, task in running:
            self._forget(key, task)
        return left
