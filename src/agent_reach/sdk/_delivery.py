"""The contract's delivery endpoint, with no transport: body bytes and headers in, an
:class:`Answer` (status and JSON bytes) out.

Both ways of serving an agent, its own aiohttp server and the ASGI app mounted into someone
else's, read the body (capped) and call :meth:`Dispatcher.deliver`; everything else lives here:
parsing, the handler table, the request context, trace-id binding (the body's ``trace_id``, else
``X-Reach-Trace-Id``, else the W3C ``traceparent``'s trace-id), the ``traceparent`` that reaches
made while the handler runs carry on, the ``agent_reach.handle`` span when OpenTelemetry export is
on (`observability.otel`), dedup by ``msg_id``, running sync handlers on the agent's bounded
thread pool, and the error table:

==========================  ======  ===================================================
what                        status  body
==========================  ======  ===================================================
handler returned a value    200     the value as JSON
handler raised ``Reject``   4xx     ``{"ok": false, "error": code, "detail": ...}`` (final)
an onward reach refused     424     ``unauthorized`` / ``forbidden`` (final: token mode)
handler raised anything     500     ``handler_failed`` (retryable, not cached)
past ``max_inflight`` runs  503     ``backend_unavailable`` at once (retryable, not cached)
deadline passed, not run    503     ``backend_unavailable`` (retryable, not cached)
answer is not JSON          500     ``bad_answer`` (retryable; cached: the handler ran)
body not JSON / bad shape   400/422 ``invalid_request`` naming the field
``msg_id`` over 128 chars   422     ``invalid_request`` naming ``msg_id`` (body or header)
``msg_id`` reused           422     ``invalid_request`` naming ``msg_id`` (the same msg_id,
                                    intent and sender asking other work: other payload
                                    bytes, ``intent_text`` or ``requested_intent``)
body over the size limit    413     ``payload_too_large`` (decided by the adapter)
intent not handled here     404     ``unknown_intent``
not a POST                  405     ``method_not_allowed`` (decided by the adapter)
==========================  ======  ===================================================

A run is begun for its callers, and a handler never starts once all of them have gone: a sync
run picked up by a worker, or an async one about to start, after the latest deadline
(``X-Reach-Deadline-Ms``, from its arrival) of the deliveries that began or joined it is not
run but answered 503 (under overload, runs queued behind busy workers would otherwise start
after their callers left, so that the agent worked only for callers that had gone). A run with
a delivery that set no deadline is always run.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hashlib
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    Forbidden,
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
    Unauthorized,
)
from agent_reach.observability.logs import TRACE_ID, Throttle, log
from agent_reach.observability.otel import agent_tracer
from agent_reach.observability.tracecontext import TRACEPARENT, TraceParent, parse_traceparent
from agent_reach.sdk._dedup import Conflict, RecentResults, RunOnce
from agent_reach.sdk._workers import Workers
from agent_reach.sdk.context import Match, ReachContext, Reject
from agent_reach.wire.ids import new_id
from agent_reach.wire.status import status_for

if TYPE_CHECKING:
    from agent_reach.observability.spans import AgentTracer, HandleSpan
    from agent_reach.sdk._assertions import DeliveryVerifier
    from agent_reach.sdk.agent import Agent

__all__ = [
    "DEFAULT_WORKERS",
    "INFLIGHT_FLOOR",
    "INFLIGHT_PER_WORKER",
    "MAX_MSG_ID",
    "Answer",
    "Dispatcher",
    "Handler",
    "error_answer",
    "from_error",
    "not_allowed",
    "too_large",
]

Handler = Callable[[Any, ReachContext], Any]
# the standard library's default for I/O-bound pools: handlers mostly wait on other services
DEFAULT_WORKERS = min(32, (os.cpu_count() or 1) + 4)
# max_inflight's default: max(INFLIGHT_PER_WORKER x workers, INFLIGHT_FLOOR) runs in hand. The
# floor is the gateway's default --max-inflight-per-endpoint: one gateway on its defaults is
# never refused for its own live attempts, only for runs whose callers have gone (or for other
# gateways' attempts); past 4 x workers, sync runs wait three rounds of the pool at most.
INFLIGHT_PER_WORKER = 4
INFLIGHT_FLOOR = 64
_encode = msgspec.json.Encoder().encode
# the longest msg_id the gateway sends (agent_reach.wire.bodies.Token: 128 visible ASCII
# characters); a longer one is refused, so that no caller keys the dedup memory with megabytes
MAX_MSG_ID = 128


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer of the delivery endpoint: status and JSON body.

    ``handle_ms`` is how long the handler ran, ``reused`` how a repeated ``msg_id`` was
    answered (``cached``/``joined``; empty for a run of its own): both go back to the gateway in
    a ``Server-Timing`` header, which records them in the request's trace (the agent's hop).
    ``kept``: remembered for a repeat though a 5xx (the handler ran to its end: ``bad_answer``).
    """

    status: int
    body: bytes
    handle_ms: float | None = None
    reused: str = ""
    kept: bool = False

    @property
    def size(self) -> int:
        """Bytes held (for the dedup cache's bound)."""
        return len(self.body)

    def server_timing(self) -> str | None:
        """The ``Server-Timing`` header value, e.g. ``handle;dur=12.3;desc="cached"``."""
        if self.handle_ms is None:
            return None
        desc = f';desc="{self.reused}"' if self.reused else ""
        return f"handle;dur={self.handle_ms:.3f}{desc}"


def error_answer(status: int, code: str, detail: str, **fields: Any) -> Answer:
    """The contract's error shape ``{"ok": false, "error": code, "detail": detail, ...}``."""
    return Answer(status, _encode({"ok": False, "error": code, "detail": detail, **fields}))


def from_error(exc: AgentReachError) -> Answer:
    """The error answer of one of our errors (its code and fields; the status from the one
    table of :mod:`agent_reach.wire.status`)."""
    return Answer(status_for(exc), _encode(exc.to_body()))


def too_large(limit: int) -> Answer:
    """413 ``payload_too_large`` for a body over ``limit`` bytes."""
    return from_error(PayloadTooLarge(f"delivery body over {limit} bytes"))


def not_allowed(method: str) -> Answer:
    """405 ``method_not_allowed``: deliveries are POSTed."""
    return from_error(MethodNotAllowed(f"{method} is not allowed here; deliveries are POSTed"))


@dataclass(slots=True)
class _Waited:
    """Until when someone waits for a run's answer, on the dispatcher's clock: the latest
    deadline of the deliveries that began or joined the run (None: one of them set none).
    Extended on the event loop, read by the worker thread that picks the run up."""

    until: float | None

    def extend(self, deadline_at: float | None) -> None:
        """A delivery with ``deadline_at`` (None: none) waits for the run too."""
        if self.until is not None:
            self.until = None if deadline_at is None else max(self.until, deadline_at)

    def passed(self, now: float) -> bool:
        """Whether every caller of the run has gone by ``now``."""
        return self.until is not None and now >= self.until


class _DeadlinePassed(Exception):
    """Raised instead of starting a handler whose callers have all gone (never leaves here)."""


_NULL = msgspec.Raw(b"null")  # a delivery's payload when none is given


class _Delivery(msgspec.Struct):
    """What the gateway POSTs (fields this SDK does not use are ignored)."""

    intent: str
    msg_id: str | None = None
    trace_id: str | None = None
    sender: str | None = None
    payload: msgspec.Raw = _NULL  # kept as bytes: a repeat's are compared (dedup), then decoded
    priority: str = "normal"
    requested_intent: str | None = None
    intent_text: str | None = None


_decoder = msgspec.json.Decoder(_Delivery)
_payload_decoder = msgspec.json.Decoder()


def _decode(body: bytes) -> tuple[_Delivery, Any]:
    """The delivery and its payload, decoded."""
    try:
        d = _decoder.decode(body)
        return d, _payload_decoder.decode(d.payload)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = text.rsplit(" - at `$.", 1)[1].rstrip("`") if " - at `$." in text else None
        if field is None and "required field `" in text:
            field = text.rsplit("required field `", 1)[1].rstrip("`")
        raise InvalidRequest(text, field=field) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", malformed=True) from None
    except RecursionError:
        raise InvalidRequest("body is nested too deeply", malformed=True) from None


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name, "").strip()
    ok = value.isascii() and value.isdigit() and len(value) < 12  # "²".isdigit() is True
    return int(value) if ok else None


def _key_bytes(key: Hashable) -> int:
    # a dedup key (msg_id, intent, sender): the sender is the caller's to choose as well
    parts = key if isinstance(key, tuple) else (key,)
    return sum(len(part.encode()) for part in parts if isinstance(part, str))


def _is_final(answer: Answer) -> bool:
    # successes and deliberate rejections; a crash (5xx) should run again when retried, but not
    # a handler that ran to its end and answered something not JSON (it would do its work again)
    return answer.status < 500 or answer.kept


class Dispatcher:
    """Turns one delivery into one answer; see the module docstring for the error table.

    ``handlers`` is read at each delivery (the agent's table, filled by ``@agent.handle``).
    Sync handlers run on a pool of ``workers`` threads made on first use, with the request's
    contextvars (the trace id) copied in; async handlers run on the caller's event loop.
    ``tracer`` makes the OpenTelemetry spans; by default `observability.otel.agent_tracer`
    decides from the environment (None: off).

    Runs in hand (``in_hand``) are handler runs begun and not ended, whether or not their
    caller still waits (a run outlives its caller: dedup shields it, and a sync handler's
    thread cannot be stopped). Past ``max_inflight`` of them (default: the larger of 4 x
    ``workers`` and 64) a delivery that would begin a run is answered 503
    ``backend_unavailable`` at once, so that the gateway retries (on another agent when it
    can) rather than queue behind this one's backlog; one joining a run in hand or answered
    from the dedup memory is not refused. So neither the worker pool's queue nor the runs left
    behind by callers that gave up grow without bound.
    """

    def __init__(
        self,
        endpoint_id: str,
        handlers: Mapping[str, Handler],
        *,
        workers: int = DEFAULT_WORKERS,
        dedup_size: int = 10_000,
        dedup_ttl_s: float = 600.0,
        dedup_max_bytes: int = 64 << 20,
        owner: Agent | None = None,
        now: Callable[[], float] = time.monotonic,
        tracer: AgentTracer | None = None,
        verifier: DeliveryVerifier | None = None,
        max_inflight: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if max_inflight is not None and max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        self.endpoint_id = endpoint_id
        self.handlers = handlers
        self.workers = workers
        self.max_inflight = (
            max(INFLIGHT_PER_WORKER * workers, INFLIGHT_FLOOR)
            if max_inflight is None
            else max_inflight
        )
        self.busy_answers = 0  # deliveries refused with 503 for want of room
        self.late_answers = 0  # runs answered 503 unrun: their deadline had passed
        # runs in hand: key -> until when their callers wait
        self._in_hand: dict[int, _Waited] = {}
        # runs in flight by dedup key: a repeat that joins one extends its wait
        self._waited: dict[tuple[str, str, str | None], _Waited] = {}
        # agent.deadline_passed and agent.msg_id_reused: 1 a second each
        self._lines = Throttle(1.0, monotonic=now)
        self._run_keys = itertools.count()
        # a sync run ends on its worker thread (or wherever its future is cancelled)
        self._in_hand_lock = threading.Lock()
        self._owner = owner
        self._now = now
        self.once: RunOnce[Answer] = RunOnce(
            RecentResults(dedup_size, dedup_ttl_s, dedup_max_bytes, _key_bytes), _is_final, now
        )
        self._pool: Workers | None = None
        self.otel = tracer if tracer is not None else agent_tracer(endpoint_id)
        self.verifier = verifier  # token mode: deliveries must carry the gateway's signature

    async def deliver(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """Answer one delivery. ``headers`` is looked up by lower-case name."""
        arrived = self._now()
        try:
            d, payload = _decode(body)
        except InvalidRequest as exc:
            # the body names no trace id that can be read: the header's, cut short (anyone who
            # reaches the agent's port sends it)
            said = headers.get("x-reach-trace-id")
            fields: dict[str, Any] = {"detail": exc.detail}
            if said is not None:
                fields["trace_id"] = said[:MAX_MSG_ID]
            log(logging.INFO, "agent.invalid_request", **fields)
            return from_error(exc)
        received = parse_traceparent(headers.get("traceparent"))
        trace_id = (
            d.trace_id
            or headers.get("x-reach-trace-id")
            or (received.trace_id if received is not None else None)
            or new_id("trace")
        )
        msg_id = d.msg_id or headers.get("x-reach-msg-id") or ""
        if len(msg_id) > MAX_MSG_ID:
            log(
                logging.INFO,
                "agent.invalid_request",
                detail="msg_id too long",
                size=len(msg_id),
                trace_id=trace_id[:MAX_MSG_ID],
            )
            return from_error(
                InvalidRequest(f"msg_id is over {MAX_MSG_ID} characters", field="msg_id")
            )
        attempt = _header_int(headers, "x-reach-attempt") or 1
        if self.verifier is not None:
            refusal = await self.verifier.check(
                body, headers, intent=d.intent, msg_id=msg_id, sender=d.sender
            )
            if refusal is not None:
                status, why = refusal
                log(
                    logging.WARNING,
                    "agent.delivery_refused",
                    endpoint_id=self.endpoint_id,
                    msg_id=msg_id,
                    intent=d.intent,
                    why=why,
                    trace_id=trace_id,
                )
                code = "unauthorized" if status == 401 else "unavailable"
                return error_answer(status, code, why)
        token = TRACE_ID.set(trace_id)
        try:
            if self.otel is None:
                # reaches made meanwhile pass the traceparent on as it came
                onward = TRACEPARENT.set(received.header if received is not None else None)
                try:
                    return await self._answer(
                        d, payload, trace_id, msg_id, attempt, headers, arrived, received, None
                    )
                finally:
                    TRACEPARENT.reset(onward)
            span = self.otel.handle(
                received,
                trace_id,
                {
                    "agent_reach.intent": d.intent,
                    "agent_reach.msg_id": msg_id,
                    "agent_reach.trace_id": trace_id,
                    "agent_reach.attempt": attempt,
                    "agent_reach.sender": d.sender,
                },
            )
            onward = TRACEPARENT.set(span.traceparent)  # reaches made meanwhile: its children
            try:
                with span:  # current while the handler runs: its own spans are children
                    answer = await self._answer(
                        d, payload, trace_id, msg_id, attempt, headers, arrived, received, span
                    )
                    span.answered(answer.status, answer.body)
                return answer
            finally:
                TRACEPARENT.reset(onward)
        finally:
            TRACE_ID.reset(token)

    async def _answer(
        self,
        d: _Delivery,
        payload: Any,
        trace_id: str,
        msg_id: str,
        attempt: int,
        headers: Mapping[str, str],
        arrived: float,
        received: TraceParent | None,
        span: HandleSpan | None,
    ) -> Answer:
        handler = self.handlers.get(d.intent)
        if handler is None:
            log(logging.INFO, "agent.unknown_intent", intent=d.intent, msg_id=msg_id)
            return error_answer(
                404, "unknown_intent", f"{self.endpoint_id} does not handle {d.intent!r}"
            )
        deadline_ms = _header_int(headers, "x-reach-deadline-ms")
        ctx = ReachContext(
            msg_id=msg_id,
            trace_id=trace_id,
            intent=d.intent,
            sender=d.sender,
            priority=d.priority,
            attempt=attempt,
            deadline_ms=deadline_ms,
            deadline_at=None if deadline_ms is None else arrived + deadline_ms / 1000.0,
            endpoint_id=self.endpoint_id,
            traceparent=received.header if received is not None else None,
            verified=self.verifier is not None,
            match=Match.parse(headers.get("x-reach-match")),
            requested_intent=d.requested_intent,
            intent_text=d.intent_text,
            origin=headers.get("x-reach-origin") or None,
            _agent=self._owner,
            _span=span,
        )
        log(
            logging.INFO,
            "agent.request",
            endpoint_id=self.endpoint_id,
            intent=d.intent,
            msg_id=msg_id,
            attempt=ctx.attempt,
            deadline_ms=deadline_ms,
        )
        waited = _Waited(ctx.deadline_at)
        if not msg_id:  # nothing to recognise a repeat by
            return await self._call(handler, payload, ctx, waited)
        # the sender is part of the key: another caller reusing a msg_id (its own idempotency
        # key, or one it guessed) never gets this caller's answer
        key = (msg_id, d.intent, d.sender)
        start = functools.partial(self._call, handler, payload, ctx, waited, key)
        # what the request asks: the payload's bytes and the words beside it (an A2A text
        # message's are in intent_text, its payload {}), so that a msg_id reused for other work
        # is refused, not answered with the first run's result (a gateway's retries resend them)
        digest = hashlib.blake2b(d.payload, digest_size=16)
        for text in (d.intent_text, d.requested_intent):
            digest.update(b"\x00" if text is None else b"\x01" + text.encode() + b"\x00")
        fingerprint = digest.digest()
        try:
            result, how = self.once.begin(key, start, fingerprint)
        except Conflict:
            self._lines.log(
                logging.WARNING,
                "agent.msg_id_reused",
                endpoint_id=self.endpoint_id,
                msg_id=msg_id,
                intent=d.intent,
                sender=d.sender,
            )
            return from_error(
                InvalidRequest(
                    f"msg_id {msg_id!r} was already used with another payload or intent_text:"
                    " a msg_id names one request (its retries resend the same); new work needs"
                    " a new msg_id",
                    field="msg_id",
                )
            )
        if how == "ran":
            self._waited[key] = waited  # before the run's task starts: it has not had a turn
            return await result
        joined = self._waited.get(key) if how == "joined" else None
        if joined is not None:  # a retry waits for the run still queued: it must not be dropped
            joined.extend(ctx.deadline_at)
        log(
            logging.INFO,
            "agent.duplicate",
            msg_id=msg_id,
            intent=d.intent,
            attempt=ctx.attempt,
            answered_from=how,  # "cached": a finished run; "joined": one in flight
        )
        if span is not None:
            span.note("duplicate", how)
        return dataclasses.replace(await result, reused=how)

    @property
    def in_hand(self) -> int:
        """Handler runs begun and not ended (their callers may have gone)."""
        return len(self._in_hand)

    def _begin_run(self, waited: _Waited) -> int | None:
        """A place for a run (its key, for :meth:`_end_run`), or None past the bound."""
        with self._in_hand_lock:
            if len(self._in_hand) >= self.max_inflight:
                return None
            key = next(self._run_keys)
            self._in_hand[key] = waited
            return key

    def _end_run(self, key: int, _: object = None) -> None:
        with self._in_hand_lock:
            del self._in_hand[key]

    def _thread_done(self, key: int, future: Future[Any]) -> None:
        """A sync run's thread returned: its run ends, unless what it returned is awaitable (a
        sync callable wrapping async work: ``lambda p, ctx: work(p)``), which is the run now and
        ends when awaited (:meth:`_run`), so that the work counts against ``max_inflight``."""
        failed = future.cancelled() or future.exception() is not None
        if failed or not inspect.isawaitable(future.result()):
            self._end_run(key)

    def _abandoned(self, key: int, future: Future[Any]) -> None:
        """The await of a sync run's thread was cancelled (the delivery went, or close()):
        an awaitable it returns is never awaited, so its run ends here, and a coroutine is
        closed (not left to warn that it was never awaited)."""
        if future.cancelled() or future.exception() is not None:
            return
        result = future.result()
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            self._end_run(key)

    def _busy(self, ctx: ReachContext) -> Answer:
        return self.refuse(
            f"{self.endpoint_id} has {self.max_inflight} runs in hand",
            self.max_inflight,
            endpoint_id=self.endpoint_id,
            intent=ctx.intent,
            msg_id=ctx.msg_id,
        )

    def _late(self) -> int:
        """Runs in hand whose deadline (their deliveries' latest) has passed (a hint of
        hangs)."""
        now = self._now()
        with self._in_hand_lock:
            return sum(1 for waited in self._in_hand.values() if waited.passed(now))

    def refuse(self, detail: str, bound: int, **fields: Any) -> Answer:
        """503 ``backend_unavailable`` for a delivery refused at ``bound`` for want of room
        (here, or by a transport before it reached the dispatcher), counted in
        ``busy_answers`` and logged as ``agent.busy`` the first time and then one in a
        thousand, with how many runs in hand are ``late``."""
        self.busy_answers += 1
        refused = self.busy_answers
        if refused == 1 or refused % 1000 == 0:  # no flood of lines
            log(
                logging.WARNING,
                "agent.busy",
                refused=refused,
                max_inflight=bound,
                late=self._late(),
                **fields,
            )
        return from_error(BackendUnavailable(detail))

    def _too_late(self, ctx: ReachContext) -> Answer:
        """503 ``backend_unavailable`` for a run not started because its callers had gone
        (not final: a retry of the message runs), logged as ``agent.deadline_passed`` at
        most once a second."""
        self.late_answers += 1
        self._lines.log(
            logging.WARNING,
            "agent.deadline_passed",
            endpoint_id=self.endpoint_id,
            intent=ctx.intent,
            msg_id=ctx.msg_id,
            deadline_ms=ctx.deadline_ms,
            late_answers=self.late_answers,
        )
        return from_error(
            BackendUnavailable(
                f"the deadline of the delivery ({ctx.deadline_ms} ms) passed before"
                f" {self.endpoint_id} could start its handler: not run"
            )
        )

    async def _call(
        self,
        handler: Handler,
        payload: Any,
        ctx: ReachContext,
        waited: _Waited,
        dedup_key: tuple[str, str, str | None] | None = None,
    ) -> Answer:
        try:
            key = self._begin_run(waited)
            if key is None:
                return self._busy(ctx)
            started = self._now()
            answer = await self._run(handler, payload, ctx, waited, key)
            handle_ms = round((self._now() - started) * 1000.0, 3)
            return dataclasses.replace(answer, handle_ms=handle_ms)
        finally:
            if dedup_key is not None and self._waited.get(dedup_key) is waited:
                del self._waited[dedup_key]

    def _in_time(self, handler: Handler, payload: Any, ctx: ReachContext, waited: _Waited) -> Any:
        """On the worker thread that picked the run up: the handler's result, unless its
        callers have all gone while it waited for a worker."""
        if waited.passed(self._now()):
            raise _DeadlinePassed
        return handler(payload, ctx)

    async def _run(
        self, handler: Handler, payload: Any, ctx: ReachContext, waited: _Waited, key: int
    ) -> Answer:
        """Run the handler (the run in hand ``key``, begun by the caller: ended here, or for a
        sync handler when its thread returns or its queued future is cancelled), unless its
        callers have all gone by the time it would start."""
        started = self._now()
        try:
            if inspect.iscoroutinefunction(handler):
                try:
                    if waited.passed(started):
                        raise _DeadlinePassed
                    result = await handler(payload, ctx)
                finally:
                    self._end_run(key)
            else:
                run = contextvars.copy_context().run  # the trace id, into the worker thread
                try:
                    future = self._executor().submit(
                        run, self._in_time, handler, payload, ctx, waited
                    )
                except BaseException:
                    self._end_run(key)
                    raise
                # when the thread returns, not when this await is cancelled: a run whose
                # caller gave up still holds its worker
                future.add_done_callback(functools.partial(self._thread_done, key))
                try:
                    result = await asyncio.wrap_future(future)
                except asyncio.CancelledError:
                    future.add_done_callback(functools.partial(self._abandoned, key))
                    raise
                if inspect.isawaitable(result):
                    try:
                        result = await result
                    finally:
                        self._end_run(key)
        except _DeadlinePassed:
            return self._too_late(ctx)
        except Reject as exc:
            log(
                logging.INFO,
                "agent.rejected",
                intent=ctx.intent,
                msg_id=ctx.msg_id,
                status=exc.status,
                error=exc.code,
                detail=exc.detail,
            )
            return error_answer(exc.status, exc.code, exc.detail)
        except (Unauthorized, Forbidden) as exc:
            # an onward reach the gateway refused (token mode): final for this request, so not
            # a 500, which the gateway would retry (running the handler's work again to be
            # refused again)
            log(
                logging.WARNING,
                "agent.onward_refused",
                intent=ctx.intent,
                msg_id=ctx.msg_id,
                error=exc.code,
                detail=exc.detail,
            )
            return error_answer(424, exc.code, f"an onward reach was refused: {exc.detail}")
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this run is being cancelled (the agent stopping): not the handler's
            # the handler's own: a task or job it waited on was cancelled (a sync handler's
            # concurrent.futures.CancelledError comes out of its future as this one). Passed
            # on, the delivery would end with no answer at all (a dropped connection, no reply)
            return self._handler_failed(ctx, exc)
        except Exception as exc:
            return self._handler_failed(ctx, exc)
        except SystemExit as exc:
            if inspect.iscoroutinefunction(handler):
                # on the loop's thread it may be the program's own (a signal handler's
                # sys.exit()): not the handler's to turn into an answer
                raise
            # a sync handler's sys.exit() (argparse's or click's error exit), from its worker
            # thread, where no signal handler runs: it would end the agent's event loop
            return self._handler_failed(ctx, exc)
        try:
            body = _encode(result)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            log(logging.ERROR, "agent.bad_answer", intent=ctx.intent, error=str(exc))
            detail = f"the handler's answer is not JSON: {exc}"
            return dataclasses.replace(error_answer(500, "bad_answer", detail), kept=True)
        log(
            logging.INFO,
            "agent.answered",
            intent=ctx.intent,
            msg_id=ctx.msg_id,
            status=200,
            handler_ms=round((self._now() - started) * 1000.0, 3),
        )
        return Answer(200, body)

    @staticmethod
    def _handler_failed(ctx: ReachContext, exc: BaseException) -> Answer:
        log(
            logging.ERROR,
            "agent.handler_failed",
            intent=ctx.intent,
            msg_id=ctx.msg_id,
            error=f"{type(exc).__name__}: {exc}",
            exc_info=exc,
        )
        return error_answer(500, "handler_failed", f"{type(exc).__name__}: {exc}")

    def _executor(self) -> Workers:
        if self._pool is None:  # daemon threads: a handler that never returns cannot hold exit
            self._pool = Workers(self.workers)
        return self._pool

    async def close(self, timeout_s: float = 5.0) -> None:
        """Cancel handler runs still going, wait up to ``timeout_s`` for them to end, and let
        the pool go (sync handlers already running cannot be interrupted: their threads end
        when they return). Runs that outlast the wait (an async handler that swallows its
        cancellation) are logged as ``agent.runs_abandoned`` and left behind."""
        left = await self.once.close(timeout_s)
        if left:
            log(
                logging.WARNING,
                "agent.runs_abandoned",
                endpoint_id=self.endpoint_id,
                runs=len(left),
                msg_ids=sorted({str(key[0]) for key in left if isinstance(key, tuple)})[:20],
                waited_s=timeout_s,
            )
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
