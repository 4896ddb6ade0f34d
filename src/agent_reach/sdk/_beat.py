"""The heartbeat line of one agent: register, heartbeat, register again, deregister.

:class:`HeartbeatLine` decides; a :class:`~agent_reach.sdk.client.ReachClient` makes the calls
(typed answers, typed errors, failover across gateways), and an injected
:class:`~agent_reach.clock.Clock` does every wait, so the whole line runs on any event loop, with
:class:`agent_reach.testing.FakeClock` in tests. :class:`~agent_reach.sdk._lifeline.Lifeline`
runs it on a thread of its own. The schedule itself is pure (:mod:`._schedule`).

Behaviour:
- Heartbeats every ``0.6-0.8 x heartbeat_interval_s`` (the interval the gateway returned at
  registration), counted from the start of the previous call: a little early and jittered, so
  agents neither arrive late nor beat in step. A heartbeat waits for its answer until 0.9 x the
  interval after the previous call started (at least 0.25 s; with one gateway too), so that a
  timed-out one is tried again before the gateway counts the agent degraded.
- A heartbeat answered 404 (``EndpointNotRegistered``: the gateway restarted, or purged the
  record) registers again at once.
- While no gateway can be reached, or one answers 5xx, the line retries with a jittered
  exponential backoff from 0.25 s up to ``retry_max_s`` (and, once registered, never longer
  than the heartbeat interval), logs a warning per failure, and the agent keeps serving.
- Anything else a call raises (a bug, or an answer no branch foresaw) is caught too, logged as
  ``agent.lifeline_error`` (with the traceback, at most once a minute, ``suppressed`` counting
  the others) and backed off as a failure: the line ends only when it is cancelled or a first
  registration is refused, never while the agent serves (a ``RecursionError`` once ended it
  for good while the agent went on serving and reporting itself registered).

With several gateways (sharing one registry), the client makes each call through the current
one, and through the next when it cannot connect (each move logged as ``agent.gateway_failover``
with ``failed`` = the call). When the current gateway connects but gives no answer in time, the
line registers at once through the others (an idempotent upsert, which counts as a heartbeat),
each gateway at most once a round; only when none can be reached does it back off. To keep
heartbeats within the interval across a move, making a connection to any gateway but the last
one left may take at most ``connect_timeout_s`` and a fifth of the interval (at least 0.1 s; the
last one may take the rest of the call's time), and a heartbeat waits for
its answer at most 0.15 x the interval (at least 0.25 s): the rest of the interval is left for
registering elsewhere (with one gateway, a registration keeps ``request_timeout_s``, and a
heartbeat the bound above: until 0.9 x the interval after the previous call). An answer,
even 5xx, is not a reason to move: a registry that is down behind one gateway is down behind
all of them.

In token mode (docs/security.md) the client is given the agent's enrollment token and keeps the
endpoint token each registration answers with, and the renewals heartbeats bring; an endpoint
token refused (401/403: expired while the agent was paused, or the id taken by another
registration meanwhile) is dropped by the client, and the line registers again at once with
the enrollment token. A registration refused because the id is still held by a live earlier
registration (``reason: endpoint_held``, e.g. this agent restarted after a crash) is retried
with the backoff until that record is down, not raised.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_reach.clock import Clock
from agent_reach.errors import (
    AgentReachError,
    EndpointNotRegistered,
    Forbidden,
    GatewayUnavailable,
    Unauthorized,
)
from agent_reach.observability.logs import Throttle, log
from agent_reach.sdk._failover import Failover, describe, never_sent
from agent_reach.sdk._schedule import (
    DEREGISTER_WITHIN_S,
    Outcome,
    beat_timeout,
    call_bounds,
    next_wait,
    sleep_for,
)
from agent_reach.settings import nats_gateway
from agent_reach.wire.bodies import RegisterBody

if TYPE_CHECKING:
    from agent_reach.sdk.client import ReachClient

__all__ = ["HeartbeatLine", "failover_logger"]

# agent.lifeline_error lines: one a minute at most (the first at once, with its traceback)
ERROR_LOG_EVERY_S = 60.0


class HeartbeatLine:
    """Registration, heartbeats and deregistration of ``registration``'s endpoint through
    ``client`` (whose calls are this line's only I/O), waiting through ``clock``.

    :meth:`run` registers, reports the first attempt's refusal (or None) and then keeps the
    line until cancelled; :meth:`deregister` ends it at the gateway. State for the agent:
    ``registered``, ``interval`` (the gateway's ``heartbeat_interval_s``), ``beats`` (heartbeats
    accepted), ``registering`` (a registration was started and has not ended: it may have
    reached the gateway).
    """

    def __init__(
        self,
        client: ReachClient,
        registration: RegisterBody,
        *,
        clock: Clock,
        rng: random.Random | None = None,
        request_timeout_s: float = 5.0,
        retry_max_s: float = 5.0,
        connect_timeout_s: float = 1.0,
    ) -> None:
        self.client = client
        self.registration = registration
        self.endpoint_id = registration.endpoint_id
        self.clock = clock
        self.rng = rng or random.Random()
        self.request_timeout_s = request_timeout_s
        self.retry_max_s = retry_max_s
        self.connect_timeout_s = connect_timeout_s
        self.interval = 10.0  # replaced by the gateway's heartbeat_interval_s
        self.registered = False
        self.registering = False
        self.beats = 0
        self._error = ""  # why the last call failed, for the logs
        self._refusal: AgentReachError | None = None
        # a gateway that connected but did not answer (url, error, call), until the line
        # is through another one: then that move is logged
        self._left: tuple[str, str, str] | None = None
        self._tried: list[str] = []  # the gateways the last call that reached none tried
        self._errors = Throttle(ERROR_LOG_EVERY_S, monotonic=clock.monotonic)
        self._bound_calls()

    @property
    def _several(self) -> bool:
        # several NATS servers are one NATS system: the queue group moves between gateways
        gateways = self.client.gateways
        return len(gateways) > 1 and nats_gateway(gateways) is None

    def _bound_calls(self) -> None:
        self._beat_s, connect = call_bounds(
            self.interval,
            several=self._several,
            request_timeout_s=self.request_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
        )
        self.client.connect_timeout_s = connect

    async def run(self, first: Callable[[AgentReachError | None], None]) -> None:
        """Register, call ``first`` with the refusal of that first attempt (None: registered,
        or no gateway could be reached), and, unless it was refused, keep the line until
        cancelled."""
        started = self.clock.monotonic()  # when the last call started: waits count from it
        outcome = await self._guarded(self._register_anywhere, "register")
        if outcome is Outcome.REFUSED:
            first(self._refusal)
            return
        first(None)
        failures = 0
        while True:
            if outcome is Outcome.OK:
                failures = 0
            elif outcome is not Outcome.UNKNOWN:
                failures += 1
            wait = next_wait(
                outcome,
                failures=failures,
                interval=self.interval,
                registered=self.registered,
                retry_max_s=self.retry_max_s,
                rng=self.rng,
            )
            # from the last call's start: a slow answer does not push the next beat back
            wait = sleep_for(wait, started=started, now=self.clock.monotonic())
            if outcome in (Outcome.FAILED, Outcome.REFUSED):
                log(
                    logging.WARNING,
                    # refused (4xx, e.g. an enrollment token that expired): not the gateway's
                    # availability, and said so; the line keeps trying (a new policy or token
                    # may let it in)
                    "agent.registration_refused"
                    if outcome is Outcome.REFUSED
                    else "agent.gateway_unavailable",
                    endpoint_id=self.endpoint_id,
                    gateway=self.client.gateway,
                    doing="heartbeat" if self.registered else "register",
                    error=self._error,
                    failures=failures,
                    retry_in_s=round(wait, 3),
                )
            await self.clock.sleep(wait)
            previous, started = started, self.clock.monotonic()
            if self.registered:
                # answered by 0.9 x the interval after the last call started, or given up:
                # time is left to try again before the gateway counts the agent degraded
                timeout_s = beat_timeout(
                    self._beat_s, interval=self.interval, since=started - previous
                )
                beat = functools.partial(self._heartbeat, timeout_s)
                outcome = await self._guarded(beat, "heartbeat")
                if outcome is not Outcome.UNREACHABLE:
                    continue
            # registering elsewhere at once is this interval's heartbeat
            outcome = await self._guarded(self._register_anywhere, "register")

    async def _guarded(self, call: Callable[[], Awaitable[Outcome]], doing: str) -> Outcome:
        """``call()``'s outcome, or BROKEN when it raised anything but cancellation: the
        calls catch every error of ours, so this is a bug or an answer no branch foresaw,
        logged (throttled) and then backed off like any failure."""
        try:
            return await call()
        except Exception as exc:
            self._error = describe(exc)
            self._errors.log(
                logging.ERROR,
                "agent.lifeline_error",
                exc_info=exc,
                endpoint_id=self.endpoint_id,
                gateway=self.client.gateway,
                doing=doing,
                error=self._error,
            )
            return Outcome.BROKEN

    async def _register_anywhere(self) -> Outcome:
        """Register; while the gateway tried connected but did not answer, again at once
        through the next (the client tries it last now), each gateway once. FAILED when none
        answered."""
        tried: set[str] = set()
        for _ in self.client.gateways:
            outcome = await self._register()
            if outcome is not Outcome.UNREACHABLE:
                return outcome
            tried.update(self._tried)
            if not self._several or tried >= set(self.client.gateways):
                break
        return Outcome.FAILED

    async def _register(self) -> Outcome:
        client, body = self.client, self.registration
        had_token = client.endpoint_token(self.endpoint_id) is not None
        self.registering = True  # stays set if this call is cancelled: see Lifeline
        try:
            answer = await client.register(
                body.endpoint_id,
                body.capabilities,
                body.endpoint_url,
                body.description,
                timeout_s=self.request_timeout_s,
            )
        except AgentReachError as exc:
            self.registering = False
            return self._register_failed(exc, had_token)
        self.registering = False
        if not answer.heartbeat_interval_s > 0:
            self._error = f"registration answered interval {answer.heartbeat_interval_s}"
            return Outcome.FAILED
        self.interval = answer.heartbeat_interval_s
        self.registered = True
        self._bound_calls()
        log(
            logging.INFO,
            "agent.registered",
            endpoint_id=self.endpoint_id,
            url=body.endpoint_url,
            gateway=client.gateway,
            heartbeat_interval_s=self.interval,
        )
        self._through()
        return Outcome.OK

    def _register_failed(self, exc: AgentReachError, had_token: bool) -> Outcome:
        status = exc.http_status
        if isinstance(exc, Unauthorized | Forbidden) and had_token:
            # our endpoint token is no longer good (expired, or the id was taken meanwhile):
            # the client dropped it; register again with the enrollment token
            self.registered = False
            self._error = f"endpoint token refused ({status}): {exc.detail}"
            log(logging.WARNING, "agent.endpoint_token_refused", status=status, error=exc.detail)
            return Outcome.UNKNOWN
        if isinstance(exc, Forbidden) and exc.fields.get("reason") == "endpoint_held":
            self._error = f"registration refused for now ({status}): {exc.detail}"
            log(
                logging.WARNING,
                "agent.endpoint_held",
                endpoint_id=self.endpoint_id,
                gateway=self.client.gateway,
            )
            return Outcome.FAILED
        if _unreachable(exc):
            return self._unreachable(exc, "register")
        if status is None or (400 <= status < 500 and status not in (408, 429)):
            # a 4xx, or a body the wire type refused before sending (an endpoint_url no HTTP
            # client can dial): a mistake that trying again will not mend
            self._refusal = exc
            self._error = f"registration refused ({status}): {exc.detail}"
            log(
                logging.ERROR,
                "agent.register_refused",
                status=status,
                error=exc.code,
                detail=exc.detail,
                gateway=self.client.gateway,
            )
            return Outcome.REFUSED
        self._error = f"registration answered {status}: {exc.code}: {exc.detail}"
        return Outcome.FAILED

    async def _heartbeat(self, timeout_s: float) -> Outcome:
        client = self.client
        had_token = client.endpoint_token(self.endpoint_id) is not None
        try:
            await client.heartbeat(self.endpoint_id, timeout_s=timeout_s)
        except EndpointNotRegistered:
            # the gateway does not know us: it restarted (in-memory registry) or purged us
            self.registered = False
            log(
                logging.WARNING,
                "agent.reregistering",
                endpoint_id=self.endpoint_id,
                gateway=client.gateway,
            )
            self._through()
            return Outcome.UNKNOWN
        except (Unauthorized, Forbidden) as exc:
            if not had_token:
                self._error = f"heartbeat answered {exc.http_status}: {exc.detail}"
                return Outcome.FAILED
            # the endpoint token is no longer good: the client dropped it; register again
            # with the enrollment token
            self.registered = False
            log(
                logging.WARNING,
                "agent.endpoint_token_refused",
                status=exc.http_status,
                error=exc.detail,
            )
            return Outcome.UNKNOWN
        except AgentReachError as exc:
            if _unreachable(exc):
                return self._unreachable(exc, "heartbeat")
            self._error = f"heartbeat answered {exc.http_status}: {exc.code}: {exc.detail}"
            return Outcome.FAILED
        self.beats += 1
        self._through()
        return Outcome.OK

    def _unreachable(self, exc: AgentReachError, call: str) -> Outcome:
        """No answer from any gateway tried (``exc``): UNREACHABLE when one of them connected
        but did not answer and another may, else FAILED."""
        cause = exc.__cause__
        self._error = exc.detail if cause is None else f"{exc.detail} ({describe(cause)})"
        tried = exc.fields.get("gateways")
        self._tried = [str(url) for url in tried] if isinstance(tried, list) else []
        if not self._several or not self._tried:
            return Outcome.FAILED
        if isinstance(cause, TimeoutError) and not never_sent(cause) and self._left is None:
            # the last one tried connected and did not answer: the client made no move from
            # it, so the line logs the one it makes
            self._left = (self._tried[-1], self._error, call)
        return Outcome.UNREACHABLE

    def _through(self) -> None:
        """A call was answered: if the line had left a gateway that did not answer, log the
        move to this one."""
        left, self._left = self._left, None
        if left is None or left[0] == self.client.gateway:
            return
        moved: dict[str, Any] = {"from": left[0], "to": self.client.gateway}
        log(
            logging.WARNING,
            "agent.gateway_failover",
            endpoint_id=self.endpoint_id,
            **moved,
            error=left[1],
            failed=left[2],
        )

    async def deregister(self) -> None:
        """Deregister through the current gateway, or the next ones when it cannot be reached,
        within 2 s in all (or ``request_timeout_s``, when shorter)."""
        client = self.client
        try:
            await client.deregister(
                self.endpoint_id, timeout_s=min(DEREGISTER_WITHIN_S, self.request_timeout_s)
            )
        except AgentReachError as exc:
            if exc.http_status is not None:  # answered: whatever it was, we are not registered
                self.registered = False
            log(
                logging.WARNING,
                "agent.deregister_failed",
                endpoint_id=self.endpoint_id,
                status=exc.http_status,
                error=f"{exc.code}: {exc.detail}",
            )
            return
        self.registered = False
        log(
            logging.INFO, "agent.deregistered", endpoint_id=self.endpoint_id, gateway=client.gateway
        )


def failover_logger(endpoint_id: str) -> Callable[[Failover], None]:
    """The ``on_failover`` of a line's client: each move logged as ``agent.gateway_failover``,
    with ``failed`` = the call that could not be made (``register``, ``heartbeat``,
    ``deregister``)."""

    def logged(move: Failover) -> None:
        moved: dict[str, Any] = {"from": move.source, "to": move.target}
        log(
            logging.WARNING,
            "agent.gateway_failover",
            endpoint_id=endpoint_id,
            **moved,
            error=move.error,
            failed=move.path.rsplit("/", 1)[-1],
        )

    return logged


def _unreachable(exc: AgentReachError) -> bool:
    """No gateway answered (as opposed to an answer, even one not of the contract's shape)."""
    return isinstance(exc, GatewayUnavailable) and exc.http_status is None
