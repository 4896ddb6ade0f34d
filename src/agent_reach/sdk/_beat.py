"""The heartbeat line of one agent: register, heartbeat, register again, deregister, on a
thread of its own.

Why a thread: the seed's worst incident was heartbeats queued behind blocked business work, so
that busy agents were declared dead and lost their traffic. Here the heartbeats run on a daemon
thread with its own event loop and its own aiohttp session (its own connection pool): handlers
that block every worker thread, or block the agent's event loop outright, cannot delay them.

Behaviour:
- Heartbeats every ``0.6-0.8 x heartbeat_interval_s`` (the interval the gateway returned at
  registration): a little early and jittered, so agents neither arrive late nor beat in step.
- A heartbeat answered 404 (``endpoint_not_registered``: the gateway restarted, or purged the
  record) registers again at once.
- While the gateway cannot be reached, or answers 5xx, the agent retries with a jittered
  exponential backoff from 0.25 s up to ``retry_max_s`` (and, once registered, never longer
  than the heartbeat interval), logs a warning per failure, and keeps serving.
- :meth:`Lifeline.stop` wakes the thread at once (an event, not a sleep to wait out) and
  deregisters before the thread ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import logging
import random
import threading
from collections.abc import Mapping
from typing import Any

import aiohttp

from agent_reach.errors import AgentReachError, error_from_answer
from agent_reach.logs import log

__all__ = ["Lifeline"]

_JITTER = (0.6, 0.8)
_FIRST_RETRY_S = 0.25


class _Outcome(enum.Enum):
    OK = "ok"
    UNKNOWN = "unknown"  # 404 to a heartbeat: register again now
    FAILED = "failed"  # unreachable, timeout, 5xx: back off and try again
    REFUSED = "refused"  # 4xx to a registration: our mistake, not the gateway's state


class Lifeline:
    """Registration, heartbeats and deregistration of one endpoint, on their own thread.

    ``registration`` is the body of ``POST /v1/register``. :meth:`start` returns a future
    that resolves after the first registration attempt: with None when it succeeded or the
    gateway could not be reached (the thread keeps trying), with the gateway's error when it
    refused the registration (4xx; the thread has then ended). :meth:`stop` returns a future
    that resolves once the agent is deregistered (when ``deregister``) and the thread ended.
    """

    def __init__(
        self,
        gateway: str,
        registration: Mapping[str, Any],
        *,
        request_timeout_s: float = 5.0,
        retry_max_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.gateway = gateway.rstrip("/")
        self.registration = dict(registration)
        self.endpoint_id: str = str(registration["endpoint_id"])
        self.request_timeout_s = request_timeout_s
        self.retry_max_s = retry_max_s
        self.interval = 10.0  # replaced by the gateway's heartbeat_interval_s
        self.registered = False
        self.beats = 0  # heartbeats the gateway accepted
        self._rng = rng or random.Random()
        self._refusal: AgentReachError | None = None
        self._error = ""  # why the last registration or heartbeat failed
        self._registering = False
        self._deregister = True
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._session: aiohttp.ClientSession | None = None
        self._thread: threading.Thread | None = None
        self._first: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()

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
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            # stop() sets ``wake``; the line is then cancelled wherever it is, even in the
            # middle of a call to a gateway that does not answer: stopping never waits it out
            line = asyncio.create_task(self._line())
            woken = asyncio.create_task(wake.wait())
            await asyncio.wait((line, woken), return_when=asyncio.FIRST_COMPLETED)
            line.cancel()
            woken.cancel()
            await asyncio.wait((line, woken))
            error = None if line.cancelled() else line.exception()
            if error is not None:
                raise error
            # a registration cut short may have reached the gateway: deregister to be sure
            if (self.registered or self._registering) and self._deregister:
                await self._deregister_now()

    async def _line(self) -> None:
        outcome = await self._register()
        if outcome is _Outcome.REFUSED:
            assert self._refusal is not None
            self._first.set_exception(self._refusal)
            return
        self._first.set_result(None)
        failures = 0
        while True:
            if outcome is _Outcome.OK:
                failures = 0
                wait = self.interval * self._rng.uniform(*_JITTER)
            elif outcome is _Outcome.UNKNOWN:
                wait = 0.0
            else:
                failures += 1
                wait = self._backoff(failures)
                log(
                    logging.WARNING,
                    "agent.gateway_unavailable",
                    endpoint_id=self.endpoint_id,
                    gateway=self.gateway,
                    doing="heartbeat" if self.registered else "register",
                    error=self._error,
                    failures=failures,
                    retry_in_s=round(wait, 3),
                )
            await asyncio.sleep(wait)
            outcome = await (self._heartbeat() if self.registered else self._register())

    def _backoff(self, failures: int) -> float:
        cap = min(self.retry_max_s, self.interval) if self.registered else self.retry_max_s
        base: float = min(cap, _FIRST_RETRY_S * 2.0 ** min(failures - 1, 16))
        return base * self._rng.uniform(0.5, 1.0)

    async def _post(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        assert self._session is not None
        async with self._session.post(self.gateway + path, json=body) as resp:
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                answer = None
            return resp.status, answer

    async def _register(self) -> _Outcome:
        self._registering = True  # stays set if this call is cancelled: see _main
        try:
            status, answer = await self._post("/v1/register", self.registration)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._registering = False
            self._error = _describe(exc)
            return _Outcome.FAILED
        self._registering = False
        interval = answer.get("heartbeat_interval_s") if isinstance(answer, dict) else None
        if status == 200 and isinstance(interval, int | float) and interval > 0:
            self.interval = float(interval)
            self.registered = True
            log(
                logging.INFO,
                "agent.registered",
                endpoint_id=self.endpoint_id,
                url=self.registration.get("endpoint_url"),
                heartbeat_interval_s=self.interval,
            )
            return _Outcome.OK
        if 400 <= status < 500 and status not in (408, 429):
            self._refusal = error_from_answer(status, answer)
            self._error = f"registration refused ({status}): {answer}"
            log(logging.ERROR, "agent.register_refused", status=status, answer=answer)
            return _Outcome.REFUSED
        self._error = f"registration answered {status}: {answer}"
        return _Outcome.FAILED

    async def _heartbeat(self) -> _Outcome:
        try:
            status, answer = await self._post("/v1/heartbeat", {"endpoint_id": self.endpoint_id})
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._error = _describe(exc)
            return _Outcome.FAILED
        if status == 200:
            self.beats += 1
            return _Outcome.OK
        if status == 404:
            # the gateway does not know us: it restarted (in-memory registry) or purged us
            self.registered = False
            log(logging.WARNING, "agent.reregistering", endpoint_id=self.endpoint_id)
            return _Outcome.UNKNOWN
        self._error = f"heartbeat answered {status}: {answer}"
        return _Outcome.FAILED

    async def _deregister_now(self) -> None:
        try:
            async with asyncio.timeout(min(2.0, self.request_timeout_s)):
                status, answer = await self._post(
                    "/v1/deregister", {"endpoint_id": self.endpoint_id}
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log(logging.WARNING, "agent.deregister_failed", error=_describe(exc))
            return
        self.registered = False
        if status == 200:
            log(logging.INFO, "agent.deregistered", endpoint_id=self.endpoint_id)
        else:
            log(logging.WARNING, "agent.deregister_failed", status=status, answer=answer)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
