"""Fallback matching: a precomputed index of the known tags, and the route-time lookup.

A :class:`FallbackMatcher` builds a :class:`MatchIndex` from the tags the gateway knows (the
dictionary's and every registered one) and the texts that describe them; a lookup,
:meth:`MatchIndex.match`, gives the best tags for a caller's words (or a tag it asked for) with
calibrated confidences. Both may be slow (an embedding model), so neither runs on the event
loop: :class:`MatchIndexHolder` runs builds and lookups in worker threads.

Invariants:
- The router awaits :meth:`MatchIndexHolder.lookup` and never builds. A change of the known
  tags or their texts schedules one build (changes during a build are taken by one more build
  after it); a build started before a later change never replaces the index of that change.
- Builds of changes that keep coming (registrations churning) start at least
  :data:`BUILD_GAP_S` apart: at most two a second, each taking every change since the last.
  A change after a quiet spell is built at once.
- Builds see a snapshot: the known tags and their texts are read on the event loop and handed
  to the worker thread as plain values (the registry's view is not thread-safe), the texts
  :data:`SNAPSHOT_SLICE_S` at a time with the loop left to others :data:`SNAPSHOT_PAUSE_S`
  between (a read of 50,000 tags is 50-90 ms of the loop over 0.3-0.4 s); a change meanwhile
  is taken by the next build.
- The matcher's work runs at a lower CPU priority than the event loop (Linux, those threads
  only): lookups in a pool of ``max_running`` threads of the holder's own, each build in a
  daemon thread of its own, and numpy's BLAS works on those threads only (not on a pool of
  its own at the loop's priority). How much nicer (:func:`thread_nice`): a matcher whose heavy
  work runs outside the GIL (the bundled model's C engine) runs both at :data:`GIL_FREE_NICE`,
  the lowest; any other, :data:`LOOKUP_NICE` and :data:`BUILD_NICE`, since a thread starved
  of CPU while it holds the GIL would hold the loop too. A flood of new
  sentences (each an embedding, ~15 ms of a core) or a big build (an embedding of each of
  50,000 new tags is minutes of a core) takes what the loop leaves, rather than the core its
  requests need, and a gateway stopping does not wait for a build. On a machine that other
  busy processes share, lookups slow down first: exact and alias routing do not.
- Until the first build finishes the index is empty: no fallback match, only exact and alias
  ones. A failing build is logged and the previous index stays in force.
- A lookup's cost does not grow with the requests in flight: at most ``max_running`` run at
  once (the model's work is CPU-bound: more would only queue in threads; by default one core
  fewer than the process may use, 1 to 4: :func:`default_running`), at most
  ``max_waiting`` wait for them; past that a lookup is refused with
  :class:`~agent_reach.errors.Overloaded` at once. Answers are cached (bounded, keyed by the
  caller's words; dropped when a new index comes).
- An uncached lookup made while the latest change is not yet in force waits until the index
  of that change is (woken at each new index, not at the end of a run of builds), at most
  until ``fresh_wait_s`` (1.5 s) after that change, so that a tag registered a moment ago is
  found; past that it uses the index in force. Under churn it waits for the next build that
  takes its change, not for the churn to end. It does not wait at all when that build
  cannot be in force by then, going by how long the last build took (and the one running
  so far: a build still running, then the churn gap, then the build of the change): with
  builds of minutes (50,000 new tags) or churn behind a long build, lookups go on with the
  index in force rather than each wait 1.5 s for nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from agent_reach.errors import Overloaded
from agent_reach.observability.logs import Throttle, log

__all__ = [
    "EMPTY_INDEX",
    "MAX_RUNNING",
    "FallbackMatcher",
    "MatchIndex",
    "MatchIndexHolder",
    "Scored",
    "TagTexts",
    "default_running",
    "distinct",
    "thread_nice",
]

# the texts describing a tag (a dictionary's description and examples; agents' descriptions)
TagTexts = Callable[[str], Sequence[str]]
# a lookup's answer: (tag, calibrated confidence), best first
Scored = list[tuple[str, float]]

LOOKUP_K = 4  # tags a lookup keeps: the best, and runners-up for the trace and suggestions
MAX_RUNNING = 4  # lookups at once, at most, by default (default_running)
# between two builds at least, when changes keep coming. A build embeds the new texts (~15 ms
# of a core each), and even at the lowest niceness that delays the loop's wake-ups on busy
# cores (measured on Linux 6.18's EEVDF scheduler; SCHED_IDLE would not, but F10 says why it
# is not used): under scenario 15's churn (~450 registrations a second) the legitimate p99 was
# 2.6-5.3 ms with builds 0.1 s apart, 2.0-2.5 ms 0.5 s apart, 2.1-2.8 ms with no matcher
# (docs/reliability.md, F14). A lookup still waits for a due build (fresh_wait_s), gap included.
BUILD_GAP_S = 0.5
# a build reads the known tags' texts on the loop (the registry is not for threads), for at
# most this long before it lets the loop run: 2,000 tags at a time were up to 2-3 ms of the
# loop each at 50,000 tags, after a set of the known tags (~4 ms), and legitimate requests
# waited behind each step (docs/reliability.md, F15; benchmarks/snapshot_bench.py)
SNAPSHOT_SLICE_S = 0.0005
# and then leaves the loop to others this long: a request takes several turns of the loop
# (its read, the agent's answer, its write), and with slices back to back each of its turns
# could meet one (F16). Paced so, a read takes at most a fifth of the loop, a request meets
# about one slice, and 50,000 tags take 0.3-0.4 s
SNAPSHOT_PAUSE_S = 0.002
SNAPSHOT_CHECK = 16  # tags read between looks at the clock (~0.7 µs each at 50,000 tags)
# how much nicer than the loop the matcher's threads run (Linux): a build, background work,
# gets about a tenth of a core others want; a lookup, which a request waits for, a quarter
BUILD_NICE = 10
LOOKUP_NICE = 5
# both, for a matcher whose heavy work leaves the GIL (``releases_gil``): the lowest niceness
# short of SCHED_IDLE (which a thread holding the GIL now and then must not have). Scenario
# 15's flood of new sentences at 50,000 tags (docs/reliability.md, F12): the legitimate p99
# 2.4x and 3.0x the quiet one at 5 and 10, 1.26x and 1.44x at 19
GIL_FREE_NICE = 19

_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)
# what a build puts through one C call at a time (a dict of them, a sort): ~0.3 ms each
DISTINCT_CHUNK = 2048


class MatchIndex(Protocol):
    """What a matcher built from the known tags; looked up at route time, off the loop."""

    def match(self, intent: str | None, text: str | None, k: int = LOOKUP_K) -> Scored:
        """The best ``k`` known tags for the caller's words ``text`` (or, when ``text`` is
        None, the tag ``intent`` read as words), best first, each with its calibrated
        confidence in ``[0, 1]``: matches at or above 0.8 go to the right tag at least 97 % of
        the time on held-out data (CONTRACT.md v1.1, "Matching"). May block (an embedding);
        must be thread-safe."""
        ...


class FallbackMatcher(Protocol):
    """Builds the index fallback matches are looked up in."""

    name: str  # the match method it reports: "semantic" or "lexical"
    # optional, read with getattr: ``releases_gil = True`` when its builds' and lookups' heavy
    # work runs outside the GIL (a C engine), so its threads may run at the lowest priority

    def build(self, known: Collection[str], texts: TagTexts) -> MatchIndex:
        """The index of the tags ``known``; ``texts(tag)`` gives the texts describing one.
        May block for seconds (embedding every text): it runs in a worker thread. Must not
        keep a reference to ``known``."""
        ...


class _EmptyIndex:
    def match(self, intent: str | None, text: str | None, k: int = LOOKUP_K) -> Scored:
        return []


EMPTY_INDEX: MatchIndex = _EmptyIndex()


class MatchIndexHolder:
    """The current index of one matcher (None: fallback off), rebuilt when :meth:`changed`
    says the known tags or their texts changed, and looked up with :meth:`lookup`.

    ``known`` and ``texts`` read the gateway's current tags and texts on the event loop;
    ``on_swap`` runs after a new index is in force.
    """

    def __init__(
        self,
        matcher: FallbackMatcher | None,
        known: Callable[[], Collection[str]],
        texts: TagTexts,
        on_swap: Callable[[], None] = lambda: None,
        *,
        max_running: int | None = None,
        max_waiting: int = 64,
        cache_size: int = 4096,
        fresh_wait_s: float = 1.5,
    ) -> None:
        self.matcher = matcher
        self.index: MatchIndex = EMPTY_INDEX
        self._known = known
        self._texts = texts
        self._on_swap = on_swap
        self._version = 0  # bumped by every change
        self._built = -1 if matcher is not None else 0  # the version of the index in force
        self._task: asyncio.Task[None] | None = None
        self._changed_at = -math.inf  # loop time of the latest change
        self._ended_at = -math.inf  # loop time the last build ended
        self._building: int | None = None  # the version of the build running (None: none)
        self._build_started = -math.inf  # loop time the build running started
        self._took = 0.0  # how long the last build took (0: none yet, the hopeful guess)
        self._swapped: asyncio.Future[None] | None = None  # done at the next new index
        running = max_running if max_running is not None else default_running()
        if matcher is not None:
            _one_blas_thread()  # here, in the thread that made the gateway: see the function
        lookup_nice, self._build_nice = (
            thread_nice(matcher) if matcher is not None else (LOOKUP_NICE, BUILD_NICE)
        )
        self._running = asyncio.Semaphore(running)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            running,
            thread_name_prefix="agent-reach-match",
            initializer=_below_the_loop,
            initargs=(lookup_nice,),
        )
        self._max_waiting = max_waiting
        self._waiting = 0
        self._cache: OrderedDict[tuple[str | None, str | None], Scored] = OrderedDict()
        self._cache_size = cache_size
        self.refused = 0  # lookups refused with max_waiting waiting (a metric)
        self.evicted = 0  # answers dropped from the full cache (a metric)
        self.fresh_wait_s = fresh_wait_s
        self._faults = Throttle()  # a broken matcher fails every lookup: a line a second at most
        self._closed = False

    @property
    def method(self) -> str | None:
        """The match method of this holder's matcher (None: fallback off)."""
        return None if self.matcher is None else self.matcher.name

    # --- building ----------------------------------------------------------------------------

    def changed(self) -> None:
        """The known tags (or their texts) changed: schedule a rebuild (soon, on the loop)."""
        if self.matcher is None:
            return
        self._version += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: the first wait() builds
            return
        self._changed_at = loop.time()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._build_until_current(), name="agent-reach-index")

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Until the index of the latest change is in force (start-up, tests), or
        ``timeout_s`` passed (the build goes on); whether it is. When a build failed, the
        previous index stays (logged) and this returns."""
        if self.matcher is None or self._built == self._version:
            return True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._build_until_current())
        await asyncio.wait([self._task], timeout=timeout_s)
        return self._built == self._version

    async def _build_until_current(self) -> None:
        matcher = self.matcher
        assert matcher is not None
        loop = asyncio.get_running_loop()
        while self._built < self._version:
            gap = self._ended_at + BUILD_GAP_S - loop.time()
            if gap > 0:  # a build right after a build: not back to back (churn)
                await asyncio.sleep(gap)
            version = self._version
            # the build counts from here, its paced snapshot included (~0.4 s at 50,000 tags):
            # _ready_at's estimate of when a change is in force must not leave it out
            self._building, self._build_started = version, loop.time()
            try:
                known = tuple(self._known())
                texts: dict[str, tuple[str, ...]] = {}
                # timed by perf_counter: uvloop's loop.time() moves once a millisecond
                until = time.perf_counter() + SNAPSHOT_SLICE_S
                for start in range(0, len(known), SNAPSHOT_CHECK):  # read here, on the loop
                    if time.perf_counter() >= until:
                        await asyncio.sleep(SNAPSHOT_PAUSE_S)
                        until = time.perf_counter() + SNAPSHOT_SLICE_S
                    texts.update(
                        (tag, tuple(self._texts(tag)))
                        for tag in known[start : start + SNAPSHOT_CHECK]
                    )
                index = await _in_background(self._build_nice, matcher.build, known, _lookup(texts))
            except asyncio.CancelledError:
                raise
            except Exception:  # the old index stays; the next change tries again
                log(logging.ERROR, "intents.index_failed", matcher=matcher.name, exc_info=True)
                return
            finally:
                self._building = None
            self._ended_at = loop.time()
            self._took = self._ended_at - self._build_started
            if version >= self._built:
                self.index, self._built = index, version
                self._cache.clear()
                swapped, self._swapped = self._swapped, None
                if swapped is not None and not swapped.done():
                    swapped.set_result(None)  # the lookups waiting for a change (lookup())
                self._on_swap()
                log(logging.DEBUG, "intents.index_built", matcher=matcher.name, tags=len(known))

    async def _fresh(self, want: int) -> None:
        """Until the index of version ``want`` (the latest change, an agent that just
        registered) is in force, rather than miss the tags it brings; at most until
        ``fresh_wait_s`` after that change (not for a long build), or until builds stop."""
        task = self._task
        if self._built >= want or task is None or task.done():
            return
        loop = asyncio.get_running_loop()
        deadline = self._changed_at + self.fresh_wait_s
        while self._built < want and not task.done():
            now = loop.time()
            left = deadline - now
            if left <= 0 or self._ready_at(want, now) > deadline:
                return  # (a wait that cannot end in the index of want is not begun)
            if self._swapped is None:
                self._swapped = loop.create_future()
            await asyncio.wait(
                [self._swapped, task], timeout=left, return_when=asyncio.FIRST_COMPLETED
            )

    def _ready_at(self, want: int, now: float) -> float:
        """When the index of version ``want`` is likely in force, going by how long the last
        build took (and the one running, if longer so far): a build of ``want`` or later
        running ends then; else the next build starts after it, a gap after the last."""
        took = self._took
        if self._building is None:  # waiting out the gap (or not begun)
            return max(now, self._ended_at + BUILD_GAP_S) + took
        took = max(took, now - self._build_started)
        ends = self._build_started + took
        if self._building >= want:
            return ends
        return ends + BUILD_GAP_S + took

    def _release(self, future: asyncio.Future[Scored]) -> None:
        self._running.release()
        _retrieve(future)

    def close(self) -> None:
        """Cancel a build in progress (its thread runs on, unwaited) and end the lookups'
        threads once their lookups are done; later lookups are refused (overloaded)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- looking up --------------------------------------------------------------------------

    async def lookup(self, intent: str | None, text: str | None) -> Scored:
        """The index's best tags for ``text`` (or ``intent``), from the cache or a worker
        thread; [] while there is no index. Overloaded when ``max_waiting`` lookups wait."""
        if self.matcher is None:
            return []
        key = (intent if text is None else None, text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        if self._closed:  # the pool is gone: the gateway is shutting down
            raise Overloaded("the gateway is shutting down", retry_after_s=1)
        if self._waiting >= self._max_waiting:
            self.refused += 1
            raise Overloaded(
                f"{self._waiting} fallback matches are waiting for the matcher", retry_after_s=1
            )
        self._waiting += 1
        try:
            await self._fresh(self._version)
            index = self.index
            await self._running.acquire()
            try:
                running = asyncio.get_running_loop().run_in_executor(
                    self._pool, index.match, key[0], key[1], LOOKUP_K
                )
            except BaseException:
                self._running.release()
                raise
            # the slot is held until the thread is done, even when this lookup is cancelled
            # (its caller gone): at most max_running model runs at once, whatever happens
            running.add_done_callback(self._release)
            try:
                scored = await asyncio.shield(running)
            except Exception as exc:  # the matcher's fault (a plugged-in embedder's, say)
                self._faults.log(
                    logging.ERROR, "intents.lookup_failed", exc_info=exc, matcher=self.method
                )
                raise Overloaded(
                    "the fallback matcher failed (logged); try again", retry_after_s=1
                ) from exc
        finally:
            self._waiting -= 1
        if index is self.index:  # an answer of an index replaced meanwhile is not kept
            self._cache[key] = scored
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
                self.evicted += 1
        return scored


def distinct(items: Iterable[_K]) -> list[_K]:
    """``items`` without repeats, first seen first: ``list(dict.fromkeys(items))`` made
    :data:`DISTINCT_CHUNK` at a time. A build runs in a thread beside the event loop, and one
    ``dict.fromkeys`` of 50,000 tags is a single 6-8 ms call that holds the GIL, the loop
    waiting all along (docs/reliability.md, F16)."""
    every = items if isinstance(items, list | tuple) else list(items)
    seen: dict[_K, None] = {}
    for start in range(0, len(every), DISTINCT_CHUNK):
        seen.update(dict.fromkeys(every[start : start + DISTINCT_CHUNK]))
    return list(seen)


def default_running() -> int:
    """Lookups that may run at once by default: one core fewer than this process may use, 1 to
    :data:`MAX_RUNNING` (a fresh sentence is ~13 ms of a core: on two cores, two at once took
    both, and a flood of them lifted the other requests' p99 2.3x, against 1.2x with one)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 2
    return max(1, min(MAX_RUNNING, cores - 1))


def thread_nice(matcher: FallbackMatcher) -> tuple[int, int]:
    """How much nicer than the loop ``matcher``'s (lookup, build) threads run."""
    if getattr(matcher, "releases_gil", False):
        return GIL_FREE_NICE, GIL_FREE_NICE
    return LOOKUP_NICE, BUILD_NICE


def _below_the_loop(nicer: int) -> None:
    """Set up a matcher thread: ``nicer`` than the loop, its numpy arithmetic on itself."""
    _lower_priority(nicer)
    _one_blas_thread()


_blas_lock = threading.Lock()
_blas: Any = None  # threadpoolctl's controller of the BLAS numpy loaded, made at the first use


def _one_blas_thread() -> None:
    """Keep numpy's BLAS (a matrix product of a lookup or a build) on the calling thread.

    numpy's OpenBLAS runs a big product on a pool of threads of its own, one per core, made at
    the loop's priority (they inherit the niceness of the thread that loaded numpy) and kept
    spinning a while after each product: a 50,000-tag lookup in a thread 5 nicer took 6.4 ms
    of that thread and as much again of an OpenBLAS thread at the loop's priority, on the
    other core (12.7 ms of CPU for 6.6 ms of wall time). One thread: 12.0 ms, all of it nice.
    threadpoolctl finds the BLAS numpy loaded (OpenBLAS, MKL, BLIS) and sets its thread
    count. With the pthreads build numpy ships that is process-wide (the loop does no BLAS
    work), and threadpoolctl lets only one live thread set it: the holder's maker, on the
    loop's thread (a matcher thread's call is then a no-op). With an OpenMP build it is per
    thread, hence the call in each matcher thread too. Without numpy or threadpoolctl (the
    lexical matcher) there is nothing to limit."""
    global _blas
    if "numpy" not in sys.modules:  # no numpy (the lexical matcher): no BLAS of it to limit
        return
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return
    with _blas_lock:
        if _blas is None:  # it reads every loaded library: ~5 ms of Python, once per process
            _blas = ThreadpoolController()  # (under churn, every build paid it)
        _blas.limit(limits=1, user_api="blas")  # ~0.05 ms


def _lower_priority(nicer: int) -> None:
    """Make the calling thread ``nicer`` than it was (Linux, where a thread has a niceness of
    its own)."""
    if sys.platform == "linux":  # (elsewhere the call would renice the whole process)
        # not permitted here: it runs at the usual priority
        with contextlib.suppress(OSError):
            me = threading.get_native_id()
            os.setpriority(
                os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nicer)
            )


def _in_background(nicer: int, fn: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
    """``fn(*args)`` in a daemon thread of its own, ``nicer`` than the loop; its outcome in
    the returned future (a cancelled future: the outcome is dropped, the thread runs to its
    end)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(outcome: _T | None, fault: BaseException | None) -> None:
        if future.done():
            return
        if fault is not None:
            future.set_exception(fault)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]

    def run() -> None:
        _below_the_loop(nicer)
        try:
            outcome, fault = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task, which logs it
            outcome, fault = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, outcome, fault)

    threading.Thread(target=run, name="agent-reach-index", daemon=True).start()
    return future


def _retrieve(future: asyncio.Future[Scored]) -> None:
    """Read a finished lookup's exception, so an abandoned one is not reported as unretrieved
    (its caller, cancelled, got nothing; the exception was a matcher's fault, logged there)."""
    if not future.cancelled():
        future.exception()


def _lookup(texts: dict[str, tuple[str, ...]]) -> TagTexts:
    def of(tag: str) -> Sequence[str]:
        return texts.get(tag, ())

    return of
