"""The agent's heartbeat line on a thread of its own: :class:`Lifeline`.

Why a thread: the seed's worst incident was heartbeats queued behind blocked business work, so
that busy agents were declared dead and lost their traffic. Here the line
(:class:`~agent_reach.sdk._beat.HeartbeatLine`) runs on a daemon thread with its own event
loop and its own :class:`~agent_reach.sdk.client.ReachClient`, made on that loop (so its own
aiohttp session and connection pool): handlers that block every worker thread, or block the
agent's event loop outright, cannot delay it. Its clock's ``sleep`` runs on that loop too
(:class:`~agent_reach.clock.SystemClock`'s does: it sleeps on whichever loop awaits it).

:meth:`Lifeline.stop` wakes the thread at once (an event, not a sleep to wait out), cancels the
line wherever it is (even in the middle of a call to a gateway that does not answer), and
deregisters before the thread ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
from collections.abc import Sequence

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import AgentReachError
from agent_reach.observability.logs import log
from agent_reach.sdk._beat import HeartbeatLine, failover_logger
from agent_reach.sdk._failover import CONNECT_TIMEOUT_S, COOLOFF_S
from agent_reach.sdk.client import ReachClient
from agent_reach.wire.bodies import RegisterBody

__all__ = ["Lifeline"]


class Lifeline:
    """Registration, heartbeats and deregistration of one endpoint, on their own thread.

    ``gateways`` are the URLs (sharing a registry) in the order to try them; ``registration``
    is the body of ``POST /v1/register``; ``token`` the enrollment token (token mode).
    :meth:`start` returns a future that resolves after the first registration attempt (on each
    gateway in turn, until one answers): with None when it succeeded or no gateway could be
    reached (the thread keeps trying), with the error when the registration was refused (4xx;
    the thread has then ended). :meth:`stop` returns a future that resolves once the agent is
    deregistered (when ``deregister``) and the thread ended.
    """

    def __init__(
        self,
        gateways: Sequence[str],
        registration: RegisterBody,
        *,
        request_timeout_s: float = 5.0,
        retry_max_s: float = 5.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        cooloff_s: float = COOLOFF_S,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        token: str | None = None,
    ) -> None:
        self.gateways = tuple(gateways)
        self.registration = registration
        self.endpoint_id = registration.endpoint_id
        self._options = {
            "request_timeout_s": request_timeout_s,
            "retry_max_s": retry_max_s,
            "connect_timeout_s": connect_timeout_s,
        }
        self._cooloff_s = cooloff_s
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self._token = token
        self._line: HeartbeatLine | None = None  # made on the thread, with its client
        self._deregister = True
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def gateway(self) -> str:
        """The current gateway: the last one that answered (the first one, before any)."""
        line = self._line
        return line.client.gateway if line is not None else self.gateways[0]

    @property
    def registered(self) -> bool:
        """Whether the gateway has the endpoint registered, as far as the line knows."""
        line = self._line
        return line is not None and line.registered

    @property
    def interval(self) -> float | None:
        """The gateway's ``heartbeat_interval_s``, once registered."""
        line = self._line
        return line.interval if line is not None and line.registered else None

    @property
    def beats(self) -> int:
        """Heartbeats the gateway accepted."""
        line = self._line
        return line.beats if line is not None else 0

    @property
    def endpoint_token(self) -> str | None:
        """Token mode: the endpoint token the line holds (None before, or in open mode)."""
        line = self._line
        return line.client.endpoint_token(self.endpoint_id) if line is not None else None

    def start(self) -> concurrent.futures.Future[None]:
        """Start the thread; the future resolves after the first registration attempt."""
        if self._thread is not None:
            raise RuntimeError("a Lifeline starts once")
        self._thread = threading.Thread(
            target=self._thread_main, name=f"agent-reach-heartbeat {self.endpoint_id}", daemon=True
        )
        self._thread.start()
        return self._first

    def stop(self, *, deregister: bool = True) -> concurrent.futures.Future[None]:
        """Wake the thread now, deregister (when asked) and end it; safe to call twice."""
        self._deregister = deregister
        self._stopping.set()
        loop = self._loop
        if loop is not None:
            # RuntimeError: the loop is already closed, so the thread has ended
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_up)
        if self._thread is None and not self._done.done():
            self._done.set_result(None)
        return self._done

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _first_attempt(self, refusal: AgentReachError | None) -> None:
        if refusal is None:
            self._first.set_result(None)
        else:
            self._first.set_exception(refusal)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # a bug here must not pass silently: the agent would go stale
            log(logging.ERROR, "agent.lifeline_crashed", error=repr(exc), exc_info=True)
            if not self._first.done():
                self._first.set_exception(exc)
        finally:
            if not self._first.done():
                self._first.set_result(None)
            self._done.set_result(None)

    async def _main(self) -> None:
        wake = self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._stopping.is_set():
            wake.set()
        client = ReachClient(
            self.gateways,
            token=self._token,
            timeout_s=self._options["request_timeout_s"],
            connect_timeout_s=self._options["connect_timeout_s"],
            cooloff_s=self._cooloff_s,
            clock=self._clock,
            on_failover=failover_logger(self.endpoint_id),
        )
        async with client:
            line = HeartbeatLine(
                client, self.registration, clock=self._clock, rng=self._rng, **self._options
            )
            self._line = line
            # stop() sets ``wake``; the line is then cancelled wherever it is, even in the
            # middle of a call to a gateway that does not answer: stopping never waits it out
            running = asyncio.create_task(line.run(self._first_attempt))
            woken = asyncio.create_task(wake.wait())
            await asyncio.wait((running, woken), return_when=asyncio.FIRST_COMPLETED)
            running.cancel()
            woken.cancel()
            await asyncio.wait((running, woken))
            error = None if running.cancelled() else running.exception()
            if error is not None:
                raise error
            # a registration cut short may have reached the gateway: deregister to be sure
            if (line.registered or line.registering) and self._deregister:
                await line.deregister()
