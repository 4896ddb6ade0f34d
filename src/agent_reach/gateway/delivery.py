"""Delivery of one reach request: route, attempt, retry or fail over, answer within the deadline.

Invariants:
- One :class:`Deadline` per request, made from the time the request was received; every attempt
  timeout and every backoff wait fits in what remains of it, so the answer is never late.
- A retry goes to an untried eligible endpoint when there is one (no wait), else to the same
  endpoint after a jittered backoff; it starts only when its per-try timeout fits in what is left.
- 4xx answers are never retried. Retries that reached an agent are charged to the retry budget.
- An intent whose dictionary entry sets ``hedge_after_ms`` hedges slow attempts (`gateway.hedge`).
- All waiting goes through the injected clock.
- Every delivery carries a W3C ``traceparent`` (rules: `observability.tracecontext`); the
  OpenTelemetry spans (`observability.spans`) hang off ``self.otel``, which is None while
  export is off: then each hook is one ``is not None`` test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from agent_reach.auth.keys import KeyDirectoryError
from agent_reach.core.model import EndpointRecord, Outcome
from agent_reach.core.retry import Deadline, backoff_s
from agent_reach.core.rounding import round3
from agent_reach.errors import (
    AgentError,
    AgentReachError,
    AllAttemptsFailed,
    DeadlineExceeded,
    InternalError,
    NoCapableAgent,
    Overloaded,
)
from agent_reach.gateway.destination import FORWARDED, destination
from agent_reach.gateway.forward import Forwarder
from agent_reach.gateway.hedge import AttemptNotStarted, Hedger
from agent_reach.gateway.matching import Match, match_by_meaning
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.router import RoutePlan, Router, RouteScope
from agent_reach.gateway.traces import NO_READER, TEXT_KEPT, Reader, TraceStore
from agent_reach.gateway.tracing import OpenTrace, open_trace, span_answer
from agent_reach.observability.logs import log
from agent_reach.observability.otel import gateway_tracer
from agent_reach.transport.base import Delivery, Transport
from agent_reach.transport.mux import TransportMux
from agent_reach.wire.answers import Attempt, Reply
from agent_reach.wire.bodies import DeliveryBody, SendBody, encode

if TYPE_CHECKING:
    from agent_reach.auth.tokens import TokenService
    from agent_reach.observability.spans import GatewayTracer

__all__ = ["Reacher"]

_TRACE_CANDIDATES = 16  # candidates listed by name in a trace's route event
# whose request the trace events written now belong to (Reacher.send sets it; the tasks a
# request starts, its hedges, inherit it)
_READER: ContextVar[Reader] = ContextVar("agent_reach_trace_reader", default=NO_READER)
# a sleep ends later than asked (timer granularity, a busy loop): a retry's wait shortened to
# leave room for its try leaves this much more, so that the try still fits when it wakes
WAKE_SLACK_S = 0.025
RELAY_TIMEOUT_S = 5.0  # an A2A GetTask/CancelTask relayed to the agent that owns the task


@dataclass(slots=True)
class _Run:
    """One request's delivery state across its attempts."""

    plan: RoutePlan
    deadline: Deadline
    timeout_ms: int
    msg_id: str
    trace_id: str
    payload: bytes
    opened: OpenTrace
    assertion: Callable[[EndpointRecord, float], str] | None
    match_header: str = ""  # X-Reach-Match
    extra: Mapping[str, str] | None = None  # headers an edge adds to every attempt
    retries_allowed: int = 0
    same_count: int = 0  # retries of an endpoint already tried
    priority: str = "normal"  # who goes first when an endpoint's slots are all taken
    started: int = 0  # attempts begun (X-Reach-Attempt: a hedge may run beside another)


class Reacher:
    """Runs the delivery loop of a send over the router and a transport."""

    def __init__(
        self,
        router: Router,
        transport: Transport,
        metrics: GatewayMetrics,
        traces: TraceStore,
        *,
        wall: Callable[[], float] = time.time,
        tracer: GatewayTracer | None = None,
        signer: TokenService | None = None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self.router = router
        self.transport = transport
        self._match_counters: dict[str, Any] = {}
        self.metrics = metrics
        self.traces = traces
        self.clock = router.clock
        self.settings = router.settings
        self._wall = wall
        # OpenTelemetry spans (None: off, the default: observability.otel says when it is on)
        self.otel = tracer if tracer is not None else gateway_tracer()
        # token mode: each delivery carries an assertion signed by the gateway
        self.signer = signer
        # federation (--directory): requests no local agent can serve go to other domains
        self.forwarder = forwarder
        self.hedger = Hedger(router, metrics, self._trace)  # intents whose entry hedges

    def _trace(self, trace_id: str, kind: str, **data: Any) -> None:
        self.traces.add(trace_id, self._wall(), kind, data, _READER.get())

    def open_trace(self, body: SendBody, msg_id: str, traceparent: str | None) -> OpenTrace:
        """The request's trace, opened before anything else runs (the service binds its id):
        :func:`agent_reach.gateway.tracing.open_trace`."""
        timeout_ms = body.timeout_ms or self.settings.default_timeout_ms
        return open_trace(self.otel, body, msg_id, timeout_ms, traceparent)

    async def send(
        self,
        body: SendBody,
        opened: OpenTrace,
        received_at: float,
        scope: RouteScope | None = None,
        *,
        admit: Callable[[str], tuple[str | None, RouteScope | None]] | None = None,
        reachable: Callable[[str], bool] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        origin: str | None = None,
    ) -> Reply:
        """:meth:`_send`, its trace events marked as this request's (its sender, its origin):
        who may read them is decided per request (gateway/traces.py)."""
        reader = _READER.set((body.sender, origin))
        try:
            return await self._send(
                body,
                opened,
                received_at,
                scope,
                admit=admit,
                reachable=reachable,
                extra_headers=extra_headers,
                origin=origin,
            )
        finally:
            _READER.reset(reader)

    async def _send(
        self,
        body: SendBody,
        opened: OpenTrace,
        received_at: float,
        scope: RouteScope | None,
        *,
        admit: Callable[[str], tuple[str | None, RouteScope | None]] | None,
        reachable: Callable[[str], bool] | None,
        extra_headers: Mapping[str, str] | None,
        origin: str | None,
    ) -> Reply:
        """Deliver ``body`` (its msg_id and trace_id filled in); raise an AgentReachError
        carrying msg_id, trace_id and attempts. Every ending, a fault of ours included (an
        InternalError, logged with its traceback), is counted, traced and logged.

        ``received_at`` is the monotonic time the request arrived: the deadline counts from it.
        Token mode: ``scope`` keeps the candidates the policy lets this sender reach with the
        requested intent; a request matched to another tag (alias, fallback) is judged again
        by ``admit(tag)`` (the sender and the scope for that tag), and a fallback chooses only
        among the tags ``reachable`` accepts. ``origin``: the domain a forwarded request comes
        from (federation: it is served here or refused, never forwarded again).
        """
        assert body.msg_id is not None
        msg_id, trace_id, span = body.msg_id, opened.trace_id, opened.span
        timeout_ms = opened.timeout_ms
        attempts: list[Attempt] = []
        intent_label = "_unroutable"
        try:
            self._trace(
                trace_id,
                "received",
                msg_id=msg_id,
                intent=body.intent,
                intent_text=None if body.intent_text is None else body.intent_text[:TEXT_KEPT],
                sender=body.sender,
                recipient_hint=body.recipient_hint,
                priority=body.priority,
                timeout_ms=timeout_ms,
                **({} if origin is None else {"origin": origin}),
            )
            deadline = Deadline(
                received_at + max(0.0, timeout_ms - self.settings.answer_margin_ms) / 1000.0
            )
            if span is not None:
                span.planning()
            routed = await destination(
                self.router,
                self.forwarder,
                body,
                deadline,
                scope,
                admit,
                origin,
                lambda elsewhere: self._match_by_meaning(body, deadline, reachable, elsewhere),
            )
            match, tag = routed.match, routed.tag
            # a registered tag, so that callers cannot grow the metrics' label set at will
            intent_label = tag if routed.forward is None else FORWARDED
            self._matched(match)
            if routed.forward is not None:
                assert self.forwarder is not None
                routed.forward.trace = lambda kind, **data: self._trace(trace_id, kind, **data)
                routed.forward.traceparent = opened.parent
                routed.forward.span = opened.span
                domains = self.forwarder.domains_for(tag, routed.forward.domain)
                self._trace(
                    trace_id,
                    "route",
                    chosen=f"@{domains[0]}" if domains else None,
                    match=match.event(),
                    forward=True,
                    local=None if routed.forward.local is None else routed.forward.local.code,
                    domains=domains,
                )
                endpoint_id, answer = await self.forwarder.forward(routed.forward, attempts)
            else:
                assert routed.plan is not None
                run = self._run(body, routed.plan, match, deadline, opened, extra_headers)
                endpoint_id, answer = await self._attempts(run, attempts)
        except AgentReachError as exc:
            self._failed(body, opened, exc, attempts, intent_label, received_at)
            raise
        except Exception as exc:  # a fault of ours: still answered, counted, traced, logged
            fault = InternalError(f"the gateway failed delivering this request: {exc!r}")
            log(logging.ERROR, "reach.internal_error", msg_id=msg_id, exc_info=True)
            self._failed(body, opened, fault, attempts, intent_label, received_at)
            raise fault from exc
        except BaseException:  # cancelled (the caller went away): the span still ends
            opened.done = True
            if span is not None:
                span.end()
            raise
        opened.done = True
        elapsed = round3((self.clock.monotonic() - received_at) * 1000.0)
        self._finish(intent_label, "ok", elapsed)
        self._trace(trace_id, "answer", ok=True, endpoint_id=endpoint_id, latency_ms=elapsed)
        self.traces.request_done(self._wall(), trace_id, msg_id, tag, "ok", attempts, elapsed)
        if span is not None:
            span.answered("ok", span_answer(trace_id, endpoint_id, attempts))
            span.end()
        log(
            logging.INFO,
            "reach.completed",
            msg_id=msg_id,
            intent=tag,
            endpoint_id=endpoint_id,
            attempts=len(attempts),
            latency_ms=elapsed,
        )
        return Reply(msg_id, trace_id, tag, endpoint_id, answer, attempts, elapsed, match.info())

    def _run(
        self,
        body: SendBody,
        plan: RoutePlan,
        match: Match,
        deadline: Deadline,
        opened: OpenTrace,
        extra_headers: Mapping[str, str] | None,
    ) -> _Run:
        """What the attempts at this domain's endpoints of ``plan`` deliver, and how (the
        delivery body encoded once, the assertion's signer)."""
        assert body.msg_id is not None
        msg_id, trace_id, timeout_ms = body.msg_id, opened.trace_id, opened.timeout_ms
        payload = encode(
            DeliveryBody(
                msg_id=msg_id,
                trace_id=trace_id,
                sender=body.sender,
                recipient_hint=body.recipient_hint,
                intent=plan.intent,
                payload=body.payload,
                priority=body.priority,
                timeout_ms=timeout_ms,
                requested_intent=body.intent,
                intent_text=body.intent_text,
            )
        )
        assertion = None
        if self.signer is not None:
            assertion = self._assertion(self.signer, body, plan.intent, msg_id, payload)
        return _Run(
            plan,
            deadline,
            timeout_ms,
            msg_id,
            trace_id,
            payload,
            opened,
            assertion,
            match.header(),
            extra_headers,
            priority=body.priority,
        )

    async def _match_by_meaning(
        self,
        body: SendBody,
        deadline: Deadline,
        reachable: Callable[[str], bool] | None,
        elsewhere: Callable[[str], bool] | None = None,
    ) -> Match:
        """The fallback step, within the request's deadline like the rest; ``elsewhere``:
        the tags another domain serves (federation), taken when no local one is near enough."""
        try:
            async with asyncio.timeout(deadline.remaining(self.clock.monotonic())):
                return await match_by_meaning(
                    self.router,
                    body.intent,
                    body.intent_text,
                    fallback=body.fallback,
                    reachable=reachable,
                    elsewhere=elsewhere,
                )
        except TimeoutError:
            timeout_ms = body.timeout_ms or self.settings.default_timeout_ms
            raise DeadlineExceeded(
                f"the match of the request's words did not finish within {timeout_ms} ms"
            ) from None

    def _matched(self, match: Match) -> None:
        """Count the match; a deprecated tag still routes, with a log line and a count."""
        counter = self._match_counters.get(match.method)
        if counter is None:  # a few methods: their children kept (labels() costs ~1 µs)
            counter = self._match_counters[match.method] = self.metrics.matches.labels(match.method)
        counter.inc()
        entry = self.router.dictionary.entries.get(match.tag)
        if entry is not None and entry.deprecated:
            self.metrics.deprecated_requests.inc()
            log(logging.INFO, "intent.deprecated", tag=match.tag, replaced_by=entry.replaced_by)

    def _failed(
        self,
        body: SendBody,
        opened: OpenTrace,
        exc: AgentReachError,
        attempts: list[Attempt],
        intent_label: str,
        received_at: float,
    ) -> None:
        """Record a request that ends in ``exc``: its ids on the error, the metrics, the
        trace's answer event, the span and the ``reach.failed`` line."""
        msg_id, trace_id, span = body.msg_id, opened.trace_id, opened.span
        exc.fields.update(msg_id=msg_id, trace_id=trace_id, attempts=attempts)
        elapsed = (self.clock.monotonic() - received_at) * 1000.0
        self._finish(intent_label, exc.code, elapsed)
        if isinstance(exc, NoCapableAgent) and exc.fields.get("suggestions"):
            self.metrics.refused_with_suggestions.inc()
        self._trace(
            trace_id,
            "answer",
            ok=False,
            error=exc.code,
            detail=exc.detail[:TEXT_KEPT],
            latency_ms=round3(elapsed),
        )
        self.traces.request_done(
            self._wall(), trace_id, msg_id or "", body.intent or "", exc.code, attempts, elapsed
        )
        opened.done = True
        if span is not None:
            last = attempts[-1].endpoint_id if attempts else None
            span.answered(exc.code, span_answer(trace_id, last, attempts), exc.detail)
            span.end()
        log(
            logging.INFO,
            "reach.failed",
            msg_id=msg_id,
            intent=body.intent,
            error=exc.code,
            detail=exc.detail,
            attempts=len(attempts),
            latency_ms=round3(elapsed),
        )

    def _assertion(
        self, signer: TokenService, body: SendBody, intent: str, msg_id: str, payload: bytes
    ) -> Callable[[EndpointRecord, float], str]:
        """What signs this request's deliveries: (recipient's record, seconds left) -> assertion."""

        def sign(recipient: EndpointRecord, remaining_s: float) -> str:
            try:
                return signer.sign_delivery(
                    sender=body.sender,
                    recipient=recipient.endpoint_id,
                    owner=recipient.owner,
                    intent=intent,
                    msg_id=msg_id,
                    body=payload,
                    expires_at=self._wall() + remaining_s,
                )
            except KeyDirectoryError as exc:  # every key retired: deliver nothing unsigned
                raise InternalError(f"cannot sign the delivery: {exc.detail}") from None

        return sign

    def _finish(self, intent: str, outcome: str, elapsed_ms: float) -> None:
        self.metrics.request_done(intent, outcome, elapsed_ms / 1000.0)

    async def relay(
        self,
        record: EndpointRecord,
        method: str,
        params: Mapping[str, Any],
        traceparent: str | None,
        timeout_s: float = RELAY_TIMEOUT_S,
    ) -> Any:
        """One A2A call (``GetTask``, ``CancelTask``) to the A2A agent of ``record``, once, no
        retry: the agent's result. AgentError for its error answer or one the gateway cannot
        use; AllAttemptsFailed when it could not be reached in ``timeout_s``."""
        transport = self.transport
        if isinstance(transport, TransportMux):
            transport = transport.transport_for(record.endpoint_url) or transport
        call = getattr(transport, "call", None)
        if call is None:
            raise AgentError(f"{record.endpoint_id} cannot be asked {method}: not an A2A agent")
        headers = {"traceparent": traceparent} if traceparent else {}
        got = await call(record.endpoint_url, method, params, headers, timeout_s)
        if got.outcome is Outcome.OK:
            return msgspec.json.decode(got.body)
        # the agent's JSON-RPC error, a 4xx-like one or its own fault (-32603, -32006: the
        # transport says SERVER_ERROR and keeps the error object): passed on as it gave it
        if got.outcome is Outcome.AGENT_ERROR or (got.outcome is Outcome.SERVER_ERROR and got.body):
            rpc_error = None
            if got.body:
                try:
                    rpc_error = msgspec.json.decode(got.body)
                except (msgspec.DecodeError, RecursionError):
                    rpc_error = None
            code = rpc_error.get("code") if isinstance(rpc_error, dict) else None
            if (
                isinstance(code, int)
                and not isinstance(code, bool)
                # a 5xx's body that only looks like one ({"code": 500, ...} of a framework) is
                # not the agent's JSON-RPC error: those codes are negative
                and (got.outcome is Outcome.AGENT_ERROR or code < 0)
            ):
                # the agent's own JSON-RPC error (task not found, not cancelable): passed on,
                # as a JSON-RPC error object (a code, a message that is a string, its data)
                assert isinstance(rpc_error, dict)
                message = rpc_error.get("message")
                relayed: dict[str, Any] = {
                    "code": code,
                    "message": message if isinstance(message, str) else got.detail,
                }
                if "data" in rpc_error:
                    relayed["data"] = rpc_error["data"]
                raise AgentError(f"{record.endpoint_id}: {got.detail}", rpc_error=relayed)
            if got.outcome is Outcome.AGENT_ERROR:
                raise AgentError(f"{record.endpoint_id}: {got.detail}")
        raise AllAttemptsFailed(f"{record.endpoint_id} did not answer {method}: {got.detail}")

    async def _attempts(self, run: _Run, attempts: list[Attempt]) -> tuple[str, msgspec.Raw]:
        """The attempts of one request, until one answers or the rules say stop."""
        router = self.router
        clock = self.clock
        plan = run.plan
        target = router.choose(plan)
        if target is None:  # plan() found eligible candidates, so this is a race with a removal
            raise AllAttemptsFailed("no eligible candidate is left")
        per_try = router.per_try_ms(target)
        run.retries_allowed = router.max_retries(run.timeout_ms, per_try)
        router.budget.record_request(clock.monotonic())
        self._route_event(run, target, per_try)
        hedging = self.hedger.start(run, partial(self._attempt, run))  # None: no hedging
        tried: dict[str, None] = {}
        wait = 0.0
        previous = target  # the endpoint of the attempt a retry follows
        while True:
            if wait > 0:
                await clock.sleep(wait)
            # a free slot (--max-inflight-per-endpoint): the target's, another's, or the first
            # one freed, in priority order (Overloaded past the wait queue, DeadlineExceeded)
            asked = clock.monotonic()
            until = run.deadline
            if attempts:  # a retry waits for a slot only while its whole try still fits
                until = Deadline(run.deadline.expires_at - per_try / 1000.0)
            try:
                got = await router.acquire(plan, tried, run.priority, until, prefer=target)
            except DeadlineExceeded as exc:
                if not attempts:
                    raise
                raise AllAttemptsFailed(
                    f"{len(attempts)} attempt(s) failed; no slot was freed while another attempt"
                    f" could still fit in the deadline ({per_try:.0f} ms per try)"
                ) from exc
            except Overloaded as exc:
                if not _delivered(attempts):
                    raise  # nothing reached an agent: overloaded, come back later
                # a retry refused a place in the wait queue after an attempt reached an agent:
                # `overloaded` promises that nothing was delivered (the caller could take the
                # request for untouched and send it again as new work)
                raise AllAttemptsFailed(
                    f"{len(attempts)} attempt(s) failed; no retry: {exc.detail}"
                ) from exc
            if got is None:
                raise AllAttemptsFailed("no eligible candidate is left")
            if got != target and attempts and got in tried and target not in tried:
                # a failover that waited for a slot, and the slot freed first was at an endpoint
                # this request tried: a retry of the same endpoint after all, which waits its
                # backoff first (the wait for the slot counted), then asks for a slot again
                # (the one handed over goes back by itself, two turns on)
                run.same_count += 1
                per_try = router.per_try_ms(got)
                now = clock.monotonic()
                wait = backoff_s(run.same_count, per_try, router.rng.random()) - (now - asked)
                if wait > 0:
                    if wait > run.deadline.remaining(now) - per_try / 1000.0 - WAKE_SLACK_S:
                        raise AllAttemptsFailed(
                            f"{len(attempts)} attempt(s) failed; the time left is not enough"
                            f" for a retry of {got} after its backoff ({per_try:.0f} ms per try)"
                        )
                    target = got
                    continue
                wait = 0.0
            if got != target:
                target, per_try = got, router.per_try_ms(got)
            remaining = run.deadline.remaining(clock.monotonic())
            if attempts and remaining < per_try / 1000.0:  # a retry that waited for its slot
                # (the slot it was handed is given back by itself, two loop turns on)
                raise AllAttemptsFailed(
                    f"{len(attempts)} attempt(s) failed; after waiting for a free slot"
                    f" {remaining * 1000:.0f} ms are left, not enough for another attempt"
                    f" ({per_try:.0f} ms per try)"
                )
            attempt_timeout = min(per_try / 1000.0, remaining)
            if attempt_timeout <= 0:
                raise DeadlineExceeded(f"deadline of {run.timeout_ms} ms ran out")
            if attempts:  # a retry, counted once it has its slot and its time
                self._retried(run, tried, previous, target, wait)
            tried.pop(target, None)
            tried[target] = None  # keeps the last tried endpoint last
            if hedging is None:
                delivery = await self._attempt(run, target, attempt_timeout, attempts)
            else:  # raced by a hedge when it is slow: the endpoint that decided, its delivery
                target, delivery = await hedging.step(target, attempt_timeout, tried, attempts)
            if delivery.outcome is Outcome.OK:
                assert delivery.body is not None
                return target, msgspec.Raw(delivery.body)
            previous = target
            target, per_try, wait = self._next(run, delivery, tried, len(attempts))

    def _route_event(self, run: _Run, target: str, per_try: float) -> None:
        """The trace's route event (and the span's) for the first target."""
        plan = run.plan
        event = {
            "chosen": target,
            "match": plan.match.event(),
            "per_try_timeout_ms": per_try,
            "max_retries": run.retries_allowed,
        }
        self._tier_summary(plan, event)
        self.traces.add(run.trace_id, self._wall(), "route", event, _READER.get())
        span = run.opened.span
        if span is not None:
            t = plan.tiers
            span.route(
                {
                    "agent_reach.endpoint_id": target,
                    "agent_reach.candidates": 1 if t is None else len(t.healthy) + len(t.degraded),
                    "agent_reach.per_try_timeout_ms": per_try,
                    "agent_reach.max_retries": run.retries_allowed,
                    "agent_reach.recipient_hint": plan.hint,
                    "agent_reach.match": plan.match.method,
                }
            )

    async def _attempt(
        self, run: _Run, target: str, timeout_s: float, attempts: list[Attempt], hedge: bool = False
    ) -> Delivery:
        """One delivery to ``target`` (a hedge: ``hedge``), learnt from (stats, metrics, trace)
        and appended to ``attempts``, cancelled too; raises AgentError for a 4xx (not retried)."""
        router = self.router
        clock = self.clock
        record = router.registry.get(target)
        if record is None:
            raise AttemptNotStarted(f"{target} was deregistered during the request")
        run.started += 1
        n = run.started
        hedged = {"hedge": True} if hedge else {}  # in the trace's events, as in the answer
        headers = {
            "X-Reach-Trace-Id": run.trace_id,
            "X-Reach-Msg-Id": run.msg_id,
            "X-Reach-Attempt": str(n),
            "X-Reach-Deadline-Ms": str(int(timeout_s * 1000)),
            "X-Reach-Match": run.match_header,
            "traceparent": run.opened.parent,
        }
        if run.assertion is not None:
            headers["X-Reach-Assertion"] = run.assertion(record, timeout_s)
        if run.extra:
            headers.update(run.extra)
        span = run.opened.span
        attempt_span = None
        if span is not None:
            attempt_span = span.attempt(
                run.trace_id,
                {
                    "agent_reach.attempt": n,
                    "agent_reach.endpoint_id": target,
                    "url.full": record.endpoint_url,
                    "agent_reach.hedge": hedge or None,
                },
            )
            headers["traceparent"] = attempt_span.traceparent
        stats = router.attempt_started(target)
        started = clock.monotonic()
        try:
            delivery = await self.transport.deliver(
                record.endpoint_url, run.payload, headers, timeout_s
            )
        except BaseException as exc:  # cancelled: a hedge race was decided, or the caller left
            took_ms = (clock.monotonic() - started) * 1000.0
            router.attempt_cancelled(target, stats, took_ms)
            took = round3(took_ms)
            if attempt_span is not None:
                attempt_span.end("cancelled", took)
            if isinstance(exc, asyncio.CancelledError):
                # the contract's outcomes have no "cancelled": it did not answer in time (the
                # other attempt of the race, or the caller, went first); the trace says why
                attempts.append(Attempt(target, Outcome.TIMEOUT.value, took, hedge=hedge))
                self.metrics.attempt_done(run.plan.intent, Outcome.TIMEOUT.value, took_ms / 1000.0)
                self._trace(run.trace_id, "attempt", attempt=n, endpoint_id=target,
                            outcome=Outcome.TIMEOUT.value, cancelled=True, latency_ms=took,
                            detail="cancelled: the race or the request ended first",
                            **hedged)  # fmt: skip
            raise
        latency_ms = (clock.monotonic() - started) * 1000.0
        outcome = delivery.outcome.value
        p95 = stats.p95_ms() if delivery.outcome is Outcome.TIMEOUT else None
        if p95 is not None and timeout_s * 1000.0 < p95:  # given less than it usually takes
            router.attempt_cut_short(target, stats, latency_ms)
        else:
            router.attempt_finished(
                target,
                stats,
                delivery.outcome,
                latency_ms,
                reached=delivery.reached,
                eject=delivery.eject,
                blameless=delivery.blameless,
            )
        # after the router's books are closed: a span that raised would leave them open (the
        # endpoint's in-flight count up for good)
        if attempt_span is not None:
            attempt_span.end(outcome, latency_ms, delivery.status, delivery.detail)
        rounded = round3(latency_ms)
        attempts.append(Attempt(target, outcome, rounded, hedge=hedge))
        if delivery.resent:
            self.metrics.resends.inc()
        self.metrics.attempt_done(run.plan.intent, outcome, latency_ms / 1000.0)
        self._trace(
            run.trace_id,
            "attempt",
            attempt=n,
            endpoint_id=target,
            outcome=outcome,
            status=delivery.status,
            latency_ms=rounded,
            detail=delivery.detail,
            **hedged,
        )
        if delivery.agent_ms is not None:
            # the agent's own hop, as it reported it (Server-Timing, sent by the agent SDK)
            self._trace(
                run.trace_id,
                "agent",
                attempt=n,
                endpoint_id=target,
                handle_ms=delivery.agent_ms,
                answered_from=delivery.agent_note or "handler",
            )
        if delivery.outcome is Outcome.OK:
            return delivery
        log(
            logging.WARNING,
            "reach.attempt_failed",
            endpoint_id=target,
            attempt=n,
            outcome=outcome,
            detail=delivery.detail,
            latency_ms=rounded,
        )
        if delivery.outcome is Outcome.AGENT_ERROR:
            raise AgentError(
                f"{target}: {delivery.detail} (not retried)",
                agent_status=delivery.status,
                agent_answer=_json_or_none(delivery.body),
            )
        return delivery

    def _next(
        self, run: _Run, delivery: Delivery, tried: dict[str, None], n: int
    ) -> tuple[str, float, float]:
        """After a retryable failure (timeout, connect_error, server_error): the next target,
        its per-try timeout and the wait before it; raises when the rules say stop."""
        router = self.router
        now = self.clock.monotonic()
        remaining = run.deadline.remaining(now)
        timeout_ms = run.timeout_ms
        if remaining <= 0.001:
            raise DeadlineExceeded(f"deadline of {timeout_ms} ms ran out after {n} attempt(s)")
        if n > run.retries_allowed:
            raise AllAttemptsFailed(
                f"{n} attempt(s) failed; the {timeout_ms} ms deadline allows "
                f"{run.retries_allowed} retr{'y' if run.retries_allowed == 1 else 'ies'}"
            )
        target = router.choose(run.plan, tried)
        if target is None:
            raise AllAttemptsFailed(f"{n} attempt(s) failed and no other candidate is eligible")
        per_try = router.per_try_ms(target)
        again = target in tried  # a retry of an endpoint already tried waits; failover not
        wait = shortest = 0.0
        if again:
            run.same_count += 1
            wait = backoff_s(run.same_count, per_try, router.rng.random())
            shortest = backoff_s(run.same_count, per_try, 0.0)
        room = remaining - per_try / 1000.0  # what a wait may take and still fit the try
        if again:  # a wait cut to the room exactly would wake with less than the try's time
            room -= WAKE_SLACK_S
        if shortest > room:
            raise AllAttemptsFailed(
                f"{n} attempt(s) failed; {remaining * 1000:.0f} ms left of the {timeout_ms} ms "
                f"deadline is not enough for another attempt ({per_try:.0f} ms per try)"
            )
        wait = min(wait, room)
        # the budget is spent as the retry is decided: one then refused at the wait queue (or
        # out of time after waiting for a slot) keeps it spent, though retries_total (counted
        # by _retried, once the retry has its slot) leaves it out
        if delivery.reached and not router.budget.try_spend(now):
            self.metrics.retry_budget_exhausted.inc()
            raise AllAttemptsFailed(f"{n} attempt(s) failed and the retry budget is used up")
        return target, per_try, wait

    def _retried(
        self, run: _Run, tried: dict[str, None], previous: str, target: str, wait: float
    ) -> None:
        """Count and log the retry about to start at ``target`` (after ``wait`` s; the failed
        attempt was at ``previous``), now that
        :meth:`Router.acquire` gave it a slot: the endpoint it goes to may not be the one
        :meth:`_next` chose, and a retry refused at the wait queue is not one."""
        kind = "same_endpoint" if target in tried else "failover"
        self.metrics.retries.labels(kind).inc()
        span = run.opened.span
        if span is not None:
            span.retry(kind, target, wait)
        if kind == "failover":
            log(logging.INFO, "route.failover", from_endpoint=previous, to_endpoint=target)

    def _tier_summary(self, plan: RoutePlan, out: dict[str, Any]) -> None:
        """The route event's view of the candidates, added to ``out``."""
        if plan.tiers is None:
            out["recipient_hint"] = plan.hint
            return
        t = plan.tiers
        out["healthy"] = len(t.healthy)
        out["degraded"] = len(t.degraded)
        out["unavailable"] = t.unavailable
        if len(t.healthy) + len(t.degraded) <= _TRACE_CANDIDATES:
            out["candidates"] = {"healthy": list(t.healthy), "degraded": list(t.degraded)}


def _json_or_none(body: bytes | None) -> msgspec.Raw | None:
    if not body:
        return None
    try:
        msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    return msgspec.Raw(body)


def _delivered(attempts: list[Attempt]) -> bool:
    """Whether any of ``attempts`` may have reached its agent: all but a connection refused
    or never made (``connect_error``: nothing was sent)."""
    return any(a.outcome != Outcome.CONNECT_ERROR for a in attempts)
