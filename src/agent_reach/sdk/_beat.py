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

With several gateways (sharing one registry), the line registers and heartbeats through the
current one. When a call cannot reach it (connection refused or reset, DNS, connect or answer
timeout), the line moves to the next gateway at once and registers there (an idempotent upsert,
which counts as a heartbeat), trying each in turn (:class:`._failover.GatewayRing`: the ones
that failed in the last few seconds last); only when none can be reached does it back off. To
keep heartbeats within the interval across a failover, making a connection may take at most
``connect_timeout_s`` and a fifth of the interval (at least 0.1 s), and a heartbeat waits for
its answer at most 0.15 x the interval (at least 0.25 s): the rest of the interval is left for
registering elsewhere (with one gateway, every call keeps ``request_timeout_s``). An answer,
even 5xx, is not a reason to move: a registry that is down behind one gateway is down behind
all of them.

In token mode (docs/security.md) the line registers with the agent's enrollment ``token`` and
keeps the endpoint token the gateway answers with; heartbeats, re-registrations and the
deregistration present that one, and a heartbeat answer that carries a renewed token replaces
it. An endpoint token refused (401/403: expired while the agent was paused, or the id taken by
another registration meanwhile) is dropped and the line registers again with the enrollment
token. A registration refused because the id is still held by a live earlier registration
(``reason: endpoint_held``, e.g. this agent restarted after a crash) is retried with the
backoff until that record is down, not raised.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import logging
import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import AgentReachError, error_from_answer
from agent_reach.observability.logs import log
from agent_reach.sdk._failover import CONNECT_TIMEOUT_S, COOLOFF_S, GatewayRing, describe

__all__ = ["Lifeline"]

_JITTER = (0.6, 0.8)
_FIRST_RETRY_S = 0.25
# with several gateways: the part of the interval a heartbeat may wait for its answer, and the
# least it is given (a busy gateway is not a dead one)
_BEAT_WAIT = 0.15
_BEAT_WAIT_MIN_S = 0.25
_CONNECT_MIN_S = 0.1


class _Outcome(enum.Enum):
    OK = "ok"
    UNKNOWN = "unknown"  # 404 to a heartbeat: register again now
    FAILED = "failed"  # no gateway reachable, or 5xx: back off and try again
    UNREACHABLE = "unreachable"  # this gateway: refused, reset, timeout... try the next one
    REFUSED = "refused"  # 4xx to a registration: our mistake, not the gateway's state


class Lifeline:
    """Registration, heartbeats and deregistration of one endpoint, on their own thread.

    ``gateway`` is one URL or several (sharing a registry), in the order to try them.
    ``registration`` is the body of ``POST /v1/register``. :meth:`start` returns a future
    that resolves after the first registration attempt (on each gateway in turn, until one
    answers): with None when it succeeded or no gateway could be reached (the thread keeps
    trying), with the gateway's error when it refused the registration (4xx; the thread has
    then ended). :meth:`stop` returns a future that resolves once the agent is deregistered
    (when ``deregister``) and the thread ended.
    """

    def __init__(
        self,
        gateway: str | Sequence[str],
        registration: Mapping[str, Any],
        *,
        request_timeout_s: float = 5.0,
        retry_max_s: float = 5.0,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        cooloff_s: float = COOLOFF_S,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        token: str | None = None,
    ) -> None:
        urls = (gateway,) if isinstance(gateway, str) else tuple(gateway)
        self._enroll_token = token
        self.endpoint_token: str | None = None  # token mode: from the gateway's answers
        self._ring = GatewayRing([url.rstrip("/") for url in urls], cooloff_s=cooloff_s)
        self._clock = clock or SystemClock()
        self.connect_timeout_s = connect_timeout_s
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

    @property
    def gateway(self) -> str:
        """The current gateway: the last one that answered (the first one, before any)."""
        return self._ring.current

    @property
    def gateways(self) -> tuple[str, ...]:
        """Every gateway of this line, in the order given."""
        return self._ring.urls

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
        outcome = await self._register_anywhere()
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
                    # refused (4xx, e.g. an enrollment token that expired): not the gateway's
                    # availability, and said so; the line keeps trying (a new policy or token
                    # may let it in)
                    "agent.registration_refused"
                    if outcome is _Outcome.REFUSED
                    else "agent.gateway_unavailable",
                    endpoint_id=self.endpoint_id,
                    gateway=self.gateway,
                    doing="heartbeat" if self.registered else "register",
                    error=self._error,
                    failures=failures,
                    retry_in_s=round(wait, 3),
                )
            await asyncio.sleep(wait)
            if not self.registered:
                outcome = await self._register_anywhere()
                continue
            outcome = await self._heartbeat()
            if outcome is _Outcome.UNREACHABLE:
                # fail over at once: registering elsewhere is this interval's heartbeat
                failed = self.gateway
                self._ring.failed(failed, self._clock.monotonic())
                others = [url for url in self._ring.order(self._clock.monotonic()) if url != failed]
                outcome = await self._register_anywhere(others, failed_over_from=failed)

    async def _register_anywhere(
        self, order: Sequence[str] | None = None, *, failed_over_from: str | None = None
    ) -> _Outcome:
        """Register through each gateway of ``order`` (default: all, in the ring's order) until
        one answers; a gateway that cannot be reached is marked failed. FAILED when none could
        be reached."""
        if order is None:
            order = self._ring.order(self._clock.monotonic())
        previous, failed = failed_over_from, "heartbeat"
        for url in order:
            if previous is not None:
                self._log_failover(previous, url, failed)
            outcome = await self._register(url)
            if outcome is not _Outcome.UNREACHABLE:
                return outcome
            self._ring.failed(url, self._clock.monotonic())
            previous, failed = url, "register"
        return _Outcome.FAILED

    def _log_failover(self, source: str, target: str, failed: str) -> None:
        """Log a move from ``source`` (where ``failed``, a call, could not be made) to
        ``target``."""
        moved: dict[str, Any] = {"from": source, "to": target}
        log(
            logging.WARNING,
            "agent.gateway_failover",
            endpoint_id=self.endpoint_id,
            **moved,
            error=self._error,
            failed=failed,
        )

    def _backoff(self, failures: int) -> float:
        cap = min(self.retry_max_s, self.interval) if self.registered else self.retry_max_s
        base: float = min(cap, _FIRST_RETRY_S * 2.0 ** min(failures - 1, 16))
        return base * self._rng.uniform(0.5, 1.0)

    def _timeout(self, total_s: float) -> aiohttp.ClientTimeout:
        if len(self._ring.urls) == 1:  # nowhere else to go: the whole time for connecting too
            return aiohttp.ClientTimeout(total=total_s)
        connect = min(self.connect_timeout_s, max(self.interval / 5, _CONNECT_MIN_S), total_s)
        return aiohttp.ClientTimeout(total=total_s, sock_connect=connect)

    async def _post(
        self,
        url: str,
        path: str,
        body: Mapping[str, Any],
        total_s: float | None = None,
        token: str | None = None,
    ) -> tuple[int, Any]:
        assert self._session is not None
        timeout = self._timeout(self.request_timeout_s if total_s is None else total_s)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with self._session.post(
            url + path, json=body, timeout=timeout, headers=headers
        ) as resp:
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                answer = None
            return resp.status, answer

    def _take_token(self, answer: Any) -> None:
        token = answer.get("token") if isinstance(answer, dict) else None
        if isinstance(token, str) and token:
            self.endpoint_token = token

    async def _register(self, url: str) -> _Outcome:
        self._registering = True  # stays set if this call is cancelled: see _main
        presented = self.endpoint_token or self._enroll_token
        try:
            status, answer = await self._post(
                url, "/v1/register", self.registration, token=presented
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._registering = False
            self._error = describe(exc)
            return _Outcome.UNREACHABLE
        self._registering = False
        interval = answer.get("heartbeat_interval_s") if isinstance(answer, dict) else None
        if status == 200 and isinstance(interval, int | float) and interval > 0:
            self._take_token(answer)
            self._ring.worked(url)
            self.interval = float(interval)
            self.registered = True
            log(
                logging.INFO,
                "agent.registered",
                endpoint_id=self.endpoint_id,
                url=self.registration.get("endpoint_url"),
                gateway=url,
                heartbeat_interval_s=self.interval,
            )
            return _Outcome.OK
        refused = status in (401, 403)
        if refused and self.endpoint_token is not None and presented == self.endpoint_token:
            # our endpoint token is no longer good (expired, or the id was taken meanwhile):
            # register again with the enrollment token
            self.endpoint_token = None
            self.registered = False
            self._error = f"endpoint token refused ({status}): {answer}"
            log(logging.WARNING, "agent.endpoint_token_refused", status=status, answer=answer)
            return _Outcome.UNKNOWN
        if status == 403 and isinstance(answer, dict) and answer.get("reason") == "endpoint_held":
            self._error = f"registration refused for now ({status}): {answer.get('detail')}"
            log(logging.WARNING, "agent.endpoint_held", endpoint_id=self.endpoint_id, gateway=url)
            return _Outcome.FAILED
        if 400 <= status < 500 and status not in (408, 429):
            self._refusal = error_from_answer(status, answer)
            self._error = f"registration refused ({status}): {answer}"
            log(logging.ERROR, "agent.register_refused", status=status, answer=answer, gateway=url)
            return _Outcome.REFUSED
        self._error = f"registration answered {status}: {answer}"
        return _Outcome.FAILED

    async def _heartbeat(self) -> _Outcome:
        url = self.gateway
        # with somewhere else to go, a heartbeat leaves most of the interval for going there
        wait = None
        if len(self._ring.urls) > 1:
            wait = min(self.request_timeout_s, max(_BEAT_WAIT * self.interval, _BEAT_WAIT_MIN_S))
        try:
            status, answer = await self._post(
                url, "/v1/heartbeat", {"endpoint_id": self.endpoint_id}, wait, self.endpoint_token
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._error = describe(exc)
            # with one gateway there is nowhere to go: back off and beat again
            return _Outcome.UNREACHABLE if len(self._ring.urls) > 1 else _Outcome.FAILED
        if status == 200:
            self.beats += 1
            self._take_token(answer)  # a renewed endpoint token, when the old one ages
            return _Outcome.OK
        if status in (401, 403) and self.endpoint_token is not None:
            # the endpoint token is no longer good: register again with the enrollment token
            self.endpoint_token = None
            self.registered = False
            log(logging.WARNING, "agent.endpoint_token_refused", status=status, answer=answer)
            return _Outcome.UNKNOWN
        if status == 404:
            # the gateway does not know us: it restarted (in-memory registry) or purged us
            self.registered = False
            log(logging.WARNING, "agent.reregistering", endpoint_id=self.endpoint_id, gateway=url)
            return _Outcome.UNKNOWN
        self._error = f"heartbeat answered {status}: {answer}"
        return _Outcome.FAILED

    async def _deregister_now(self) -> None:
        """Deregister through the current gateway, or the next ones when it cannot be reached,
        within 2 s in all."""
        order = [self.gateway, *(u for u in self._ring.urls if u != self.gateway)]
        try:
            async with asyncio.timeout(min(2.0, self.request_timeout_s)):
                for index, url in enumerate(order):
                    try:
                        status, answer = await self._post(
                            url,
                            "/v1/deregister",
                            {"endpoint_id": self.endpoint_id},
                            token=self.endpoint_token,
                        )
                    except aiohttp.ClientError as exc:
                        self._error = describe(exc)
                        if index + 1 == len(order):
                            raise
                        self._log_failover(url, order[index + 1], "deregister")
                        continue
                    break
        except (aiohttp.ClientError, TimeoutError) as exc:
            log(logging.WARNING, "agent.deregister_failed", error=describe(exc))
            return
        self.registered = False
        if status == 200:
            log(logging.INFO, "agent.deregistered", endpoint_id=self.endpoint_id, gateway=url)
        else:
            log(logging.WARNING, "agent.deregister_failed", status=status, answer=answer)
