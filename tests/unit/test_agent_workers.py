"""The agent's worker threads for sync handlers (sdk/_workers.py): bounded, reused, daemon
threads, queued calls cancelled at shutdown. Threads are real; every wait is bounded."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future

import pytest

from agent_reach.sdk._workers import Workers

WAIT_S = 5.0


def test_calls_run_on_daemon_threads_and_give_their_results_and_errors() -> None:
    workers = Workers(2)
    try:
        assert workers.submit(lambda a, b: a + b, 2, 3).result(WAIT_S) == 5
        failed = workers.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failed.result(WAIT_S)
        thread = workers.submit(threading.current_thread).result(WAIT_S)
        assert (thread.name, thread.daemon) == ("agent-reach-worker_0", True)  # exit won't wait
    finally:
        workers.shutdown()


def test_an_idle_thread_is_reused_and_busy_ones_grow_the_pool_up_to_its_bound() -> None:
    workers = Workers(3)
    release = threading.Event()
    try:
        for n in range(5):  # one after another: the idle thread takes each
            assert workers.submit(lambda n=n: n).result(WAIT_S) == n
        assert workers.threads == 1
        started = [threading.Event() for _ in range(5)]

        def hold(i: int) -> int:
            started[i].set()
            release.wait(WAIT_S)
            return i

        held = [workers.submit(hold, i) for i in range(5)]
        assert all(started[i].wait(WAIT_S) for i in range(3))
        assert workers.threads == 3  # never more than max_workers
        assert not started[3].is_set() and not started[4].is_set()  # queued, in order
        release.set()
        assert [f.result(WAIT_S) for f in held] == [0, 1, 2, 3, 4]
        assert workers.threads == 3
    finally:
        release.set()
        workers.shutdown()


def test_shutdown_cancels_queued_calls_and_refuses_new_ones_without_waiting() -> None:
    workers = Workers(1)
    entered, release = threading.Event(), threading.Event()

    def hold() -> str:
        entered.set()
        release.wait(WAIT_S)
        return "done"

    running = workers.submit(hold)
    assert entered.wait(WAIT_S)
    queued: Future[str] = workers.submit(lambda: "never")
    workers.shutdown()  # returns at once: the running call is not waited for
    assert queued.cancelled()
    with pytest.raises(CancelledError):
        queued.result(0)
    with pytest.raises(RuntimeError, match="shut down"):
        workers.submit(lambda: None)
    release.set()
    assert running.result(WAIT_S) == "done"  # the running call ended as it would


def test_a_cancelled_queued_call_never_runs() -> None:
    workers = Workers(1)
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []
    try:
        workers.submit(lambda: (entered.set(), release.wait(WAIT_S)))
        assert entered.wait(WAIT_S)
        queued = workers.submit(ran.append, "queued")
        assert queued.cancel()
        after = workers.submit(ran.append, "after")
        release.set()
        after.result(WAIT_S)
        assert ran == ["after"]
    finally:
        release.set()
        workers.shutdown()


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Workers(0)
