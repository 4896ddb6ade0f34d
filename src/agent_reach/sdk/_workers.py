"""The agent's worker threads for sync handlers: a bounded pool of daemon threads.

Why not :class:`concurrent.futures.ThreadPoolExecutor`: its threads are not daemon threads,
and the interpreter joins them at exit (``concurrent.futures.thread._python_exit``, then
``threading._shutdown``), even after ``shutdown(wait=False)``. One sync handler that never
returns (a blocking call without a timeout) kept the agent's process alive after ``stop()``,
SIGTERM or not, until something killed it. Here a handler still running at exit is abandoned
with the process, as an async one is when its loop closes (``stop()`` has waited its
``shutdown_timeout`` for it by then).

The rest is ThreadPoolExecutor's behaviour, kept: :meth:`Workers.submit` returns a
:class:`~concurrent.futures.Future` (``asyncio.wrap_future`` and done-callbacks work on it,
and a queued one can be cancelled), threads start as work arrives, one only when none is
idle, up to ``max_workers``, and :meth:`Workers.shutdown` cancels what is still queued and
lets each thread end after the run it has.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["Workers"]

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class Workers:
    """Up to ``max_workers`` daemon threads running submitted calls in order of arrival."""

    def __init__(self, max_workers: int, name: str = "agent-reach-worker") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers = max_workers
        self._name = name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # threads waiting for work, as the stdlib's pool
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started (they end only after :meth:`shutdown`)."""
        return len(self._threads)

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on a worker thread: its future."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the agent's workers are shut down")
            self._queue.put((future, fn, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    def shutdown(self) -> None:
        """Cancel the calls still queued; each thread ends after the call it is running (not
        waited for here)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    work = self._queue.get_nowait()
                except queue.Empty:
                    break
                if work is not None:
                    work[0].cancel()
            for _ in self._threads:
                self._queue.put(None)

    def _work(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            future, fn, args = work
            del work
            result: Any = None
            error: BaseException | None = None
            ran = future.set_running_or_notify_cancel()  # False: cancelled while queued
            if ran:
                try:
                    result = fn(*args)
                except BaseException as exc:
                    error = exc
            del fn, args  # nothing of a finished call held while idle
            self._idle.release()  # before its caller hears: a next call finds this thread idle
            if error is not None:
                future.set_exception(error)
            elif ran:
                future.set_result(result)
            del future, result, error
