"""The blocking facade of the client SDK: :class:`SyncReachClient`.

It holds one :class:`~agent_reach.sdk.client.ReachClient` on a private event loop in a daemon
thread and submits every call there: no logic of its own, so there is one implementation of
every call, the async one. Also importable from :mod:`agent_reach.sdk.client` and
:mod:`agent_reach`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from agent_reach.sdk._wire import EMPTY
from agent_reach.wire.answers import (
    AgentInfo,
    IssuedToken,
    Registration,
    Reply,
    RouteExplanation,
    Trace,
)

if TYPE_CHECKING:
    from agent_reach.sdk.client import ReachClient

__all__ = ["SyncReachClient"]

T = TypeVar("T")


class SyncReachClient:
    """The blocking facade of :class:`~agent_reach.sdk.client.ReachClient`, for scripts and
    threads; it takes the same arguments (``nats://`` gateways included: the NATS connection is
    made on the private loop, at the first call).

    It owns a private event loop in a daemon thread; every method submits the async call there and
    waits for it. Safe to share between threads. ``close()`` (or ``with``) stops the loop; a call
    still in flight then raises RuntimeError, as does a call made after it, or one made on the
    private loop itself (an ``on_failover`` callback), which could never be answered. A client
    dropped without ``close()`` is closed when it is collected (its pool closed, its thread
    ended), so that a forgotten close in a request handler does not leave a thread each time.
    """

    def __init__(self, gateway: str | Sequence[str] | None = None, **options: Any) -> None:
        # imported here, not at the top: client.py imports this module to re-export the class
        from agent_reach.sdk.client import ReachClient

        # made first: a bad gateway URL raises before any thread is started
        self.client: ReachClient = ReachClient(gateway, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=_serve, args=(self._loop,), name="agent-reach-client", daemon=True
        )
        self._lock = threading.Lock()  # a call is submitted, or the client closed, not both
        self._closed = False
        self._stopped = threading.Event()  # set once close() has stopped the loop
        self._calls: set[concurrent.futures.Future[Any]] = set()  # in flight, to cancel
        self._thread.start()
        # neither holds self: the thread runs the loop, the finalizer closes what it was given
        abandoned = weakref.finalize(self, _abandoned, self._loop, self.client)
        abandoned.atexit = False  # at exit the daemon thread just ends

    @property
    def gateway(self) -> str:
        """:attr:`ReachClient.gateway`: the current gateway."""
        return self.client.gateway

    @property
    def gateways(self) -> tuple[str, ...]:
        """:attr:`ReachClient.gateways`: every gateway, in the order given."""
        return self.client.gateways

    def endpoint_token(self, endpoint_id: str) -> str | None:
        """:meth:`ReachClient.endpoint_token`."""
        return self.client.endpoint_token(endpoint_id)

    def _own_loop(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "a SyncReachClient cannot be called from its own loop (an on_failover callback):"
                " the call would wait for the loop it blocks"
            )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self._own_loop()
        except RuntimeError:
            coro.close()
            raise
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("this SyncReachClient is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
            self._calls.add(future)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if not self._closed:
                raise
            raise RuntimeError("this SyncReachClient was closed during the call") from None
        finally:
            with self._lock:
                self._calls.discard(future)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the calls in flight, close the pool and stop the private loop
        (idempotent)."""
        self._own_loop()
        with self._lock:
            closing = not self._closed
            self._closed = True
            calls = list(self._calls)
        if not closing:  # another thread closes it: done once the loop is stopped
            self._stopped.wait(15.0)
            return
        for call in calls:  # their tasks are cancelled on the loop before the close below
            call.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()
            self._stopped.set()

    def send(self, intent: str | None, payload: Any = EMPTY, **options: Any) -> Reply:
        """:meth:`ReachClient.send`, blocking."""
        return self._run(self.client.send(intent, payload, **options))

    def agents(self, **filters: Any) -> list[AgentInfo]:
        """:meth:`ReachClient.agents` (``intent``, ``status``, ``page_size``), blocking."""
        return self._run(self.client.agents(**filters))

    def agent(self, endpoint_id: str) -> AgentInfo:
        """:meth:`ReachClient.agent`, blocking."""
        return self._run(self.client.agent(endpoint_id))

    def explain(self, intent: str | None, **options: Any) -> RouteExplanation:
        """:meth:`ReachClient.explain`, blocking."""
        return self._run(self.client.explain(intent, **options))

    def trace(self, trace_id: str) -> Trace:
        """:meth:`ReachClient.trace`, blocking."""
        return self._run(self.client.trace(trace_id))

    def register(
        self,
        endpoint_id: str,
        capabilities: list[str],
        endpoint_url: str,
        description: str = "",
        *,
        timeout_s: float | None = None,
    ) -> Registration:
        """:meth:`ReachClient.register`, blocking."""
        return self._run(
            self.client.register(
                endpoint_id, capabilities, endpoint_url, description, timeout_s=timeout_s
            )
        )

    def heartbeat(self, endpoint_id: str, *, timeout_s: float | None = None) -> str:
        """:meth:`ReachClient.heartbeat`, blocking."""
        return self._run(self.client.heartbeat(endpoint_id, timeout_s=timeout_s))

    def deregister(self, endpoint_id: str, *, timeout_s: float | None = None) -> None:
        """:meth:`ReachClient.deregister`, blocking."""
        self._run(self.client.deregister(endpoint_id, timeout_s=timeout_s))

    def issue_token(self, kind: Literal["enroll", "client"], **options: Any) -> IssuedToken:
        """:meth:`ReachClient.issue_token`, blocking."""
        return self._run(self.client.issue_token(kind, **options))

    def healthz(self) -> bool:
        """:meth:`ReachClient.healthz`, blocking."""
        return self._run(self.client.healthz())

    def metrics(self) -> str:
        """:meth:`ReachClient.metrics`, blocking."""
        return self._run(self.client.metrics())


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The private loop's thread: run it until stopped, then close it (idempotent: close()
    closes it too, after joining)."""
    try:
        loop.run_forever()
    finally:
        loop.close()


def _abandoned(loop: asyncio.AbstractEventLoop, client: ReachClient) -> None:
    """A client collected without ``close()``: close its pool on its loop, then stop the loop
    (the thread then closes it and ends)."""
    if loop.is_closed() or not loop.is_running():
        return

    async def close_then_stop() -> None:
        try:
            await client.close()
        finally:
            loop.stop()

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        asyncio.run_coroutine_threadsafe(close_then_stop(), loop)
