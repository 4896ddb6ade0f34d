"""Forwarding a request to another domain's gateway (CONTRACT.md v1.1, "Federation").

A peer gateway is a target like an agent: the forward goes out through the transport mux
(``POST {gateway_url}/v1/send``), the passive check applies (a refused connection marks the
peer unreachable until a probe answers), and a failover after an attempt that reached the
other domain is charged to the retry budget.

Invariants:
- One deadline: each forward gets what is left of the caller's (less the measured round trip,
  so that the answer is back in time), or, when another domain could still be tried after it,
  its per-try timeout (``max(1.5 x p95, 2000 ms)`` of the forwards to that domain) if shorter.
- The forwarded request keeps ``msg_id``, ``trace_id`` and ``sender``, routes on the exact tag
  the other domain offers (``fallback`` false: it must not guess again), and carries
  ``X-Reach-Origin`` and ``X-Reach-Hops: 1``; the receiving gateway never forwards it further.
- The answer names the remote endpoint ``agent://NAME@DOMAIN``; each forward is one entry of
  ``attempts`` with its ``domain``.
- A domain that refuses (nothing routable there after all, a loop, its policy, overload) is a
  failed attempt that reached no agent: the next domain is tried, and when none is left the
  last refusal is the answer (the caller learns why; another domain's ``Retry-After`` at most
  :data:`MAX_PEER_RETRY_AFTER_S`), or ``all_attempts_failed`` when an attempt reached agents
  there. Every failover after a forward that another domain's gateway answered (a refusal
  too: it cost that gateway work) is charged to the retry budget, so a federation that sheds
  load is not asked by every caller for every domain; once the budget is used up, the last
  refusal is the answer. A failover after a connection that could not be made is free.
- A 200 whose body is not a send answer is ``agent_error``, not forwarded again (the other
  domain said the work was done). A domain whose gateway leaves forwards without an answer
  of the contract is tried last (:mod:`agent_reach.federation.peers`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from agent_reach.clock import Clock
from agent_reach.core.model import Outcome
from agent_reach.core.names import is_endpoint_id, split_domain
from agent_reach.core.retry import Deadline, RetryBudget, per_try_timeout_ms
from agent_reach.core.rounding import round3
from agent_reach.errors import (
    AgentError,
    AgentReachError,
    AllAttemptsFailed,
    DeadlineExceeded,
    NoAvailableAgent,
    NoCapableAgent,
    Overloaded,
    error_from_answer,
)
from agent_reach.federation.peers import DEMOTED_S, FAIL_AFTER, Peer, Peers
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.observability.logs import log
from agent_reach.transport.base import Transport
from agent_reach.wire.answers import Attempt
from agent_reach.wire.bodies import SendBody

if TYPE_CHECKING:
    from agent_reach.observability.spans import ReceiveSpan

__all__ = ["HOPS_HEADER", "ORIGIN_HEADER", "ForwardRequest", "Forwarder"]

ORIGIN_HEADER = "X-Reach-Origin"
# a forward that timed out this close to the deadline ran it out (the other gateway answers
# its deadline_exceeded FORWARD_SLACK_MS and a round trip before this one's cut)
DEADLINE_SLACK_S = 0.075
HOPS_HEADER = "X-Reach-Hops"
_NOT_OURS = "not a contract answer"
FORWARD_SLACK_MS = 25  # a forward's timeout_ms is this much (and the round trip) under its cut
MAX_PEER_RETRY_AFTER_S = 60.0  # the most of another domain's Retry-After passed on
# a domain's refusals passed on to the caller when no other domain could serve
_REFUSALS = frozenset(
    {
        "no_capable_agent",
        "no_available_agent",
        "recipient_not_found",
        "recipient_incapable",
        "loop_detected",
        "forbidden",
        # the body, re-encoded for the forward, is over the other gateway's limit: said as it
        # is (the caller learns why), where a server_error said nothing
        "payload_too_large",
    }
)


class _Reply(msgspec.Struct):
    endpoint_id: str
    result: msgspec.Raw
    attempts: list[dict[str, Any]] = msgspec.field(default_factory=list)


class _Refusal(msgspec.Struct):
    error: str
    detail: str = ""
    attempts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    agent_status: int | None = None
    agent_answer: msgspec.Raw | None = None
    retry_after_s: float | None = None


_reply = msgspec.json.Decoder(_Reply)
_refusal = msgspec.json.Decoder(_Refusal)
_encode = msgspec.json.Encoder().encode


@dataclass(slots=True)
class ForwardRequest:
    """One request on its way to other domains."""

    body: SendBody  # msg_id, trace_id and sender filled in
    tag: str  # the exact tag the other domain offers
    deadline: Deadline
    timeout_ms: int
    trace: Callable[..., None]  # (kind, **fields) -> the request's trace
    traceparent: str  # what a forward carries while OpenTelemetry is off ("" while on)
    hint: str | None = None  # agent://NAME at that domain
    domain: str | None = None  # the hint's domain: only there
    local: AgentReachError | None = None  # why it was not served at home
    span: ReceiveSpan | None = None  # the request's server span (OpenTelemetry on)


class Forwarder:
    """Sends requests to other domains' gateways over the transport mux."""

    def __init__(
        self,
        domain: str,
        peers: Peers,
        transport: Transport,
        budget: RetryBudget,
        metrics: GatewayMetrics,
        clock: Clock,
        headers: Callable[[], Mapping[str, str]],
    ) -> None:
        self.domain = domain
        self.peers = peers
        self.transport = transport
        self.budget = budget
        self.metrics = metrics
        self.clock = clock
        self._headers = headers

    def offers(self, tag: str, exclude: str | None = None) -> bool:
        """Whether some other domain (not ``exclude``) has a routable endpoint for ``tag``
        in a fresh summary, its gateway reachable or not."""
        now = self.clock.monotonic()
        return any(
            p.domain != exclude and self.peers.fresh(p, now) and p.routable(tag) is not None
            for p in self.peers.all()
        )

    def domains_for(self, tag: str, domain: str | None = None, limit: int = 16) -> list[str]:
        """The domains a forward of ``tag`` would try now, in order (the trace's route)."""
        if domain is not None:
            return [domain]
        now = self.clock.monotonic()
        return [p.domain for p in self.peers.candidates(tag, now)[:limit]]

    def _unreachable(self, tag: str) -> NoAvailableAgent | None:
        """The refusal when the domains offering ``tag`` are all unreachable now."""
        now = self.clock.monotonic()
        cut = [
            p
            for p in self.peers.all()
            if p.unreachable and self.peers.fresh(p, now) and p.routable(tag) is not None
        ]
        if not cut:
            return None
        why = "; ".join(f"{p.domain}: {p.unreachable}" for p in cut[:3])
        return NoAvailableAgent(f"the domains that offer {tag!r} are unreachable now ({why})")

    def _targets(self, fw: ForwardRequest, tried: list[str]) -> list[Peer]:
        now = self.clock.monotonic()
        if fw.domain is None:
            return self.peers.candidates(fw.tag, now, exclude=tried)
        if fw.domain in tried:
            return []
        peer = self.peers.get(fw.domain)
        if peer is None:
            raise NoAvailableAgent(
                f"{fw.hint}@{fw.domain}: no summary of domain {fw.domain!r} has reached this"
                " gateway (is it in the federation?)"
            )
        if not self.peers.fresh(peer, now):
            raise NoAvailableAgent(
                f"domain {fw.domain!r}'s summary is {peer.age_s(now):.1f} s old: stale, unused"
            )
        if peer.unreachable:
            raise NoAvailableAgent(f"domain {fw.domain!r} is unreachable: {peer.unreachable}")
        return [peer]

    async def forward(self, fw: ForwardRequest, attempts: list[Attempt]) -> tuple[str, msgspec.Raw]:
        """Forward ``fw`` until a domain answers; (the remote endpoint id, its result)."""
        tried: list[str] = []
        refusal: AgentReachError | None = None
        reached_any = False  # a forward reached agents of the other domain
        # the last forward was answered by the other domain's gateway (it cost it work), or
        # reached its agents: the failover after it is charged; after one whose connection
        # could not be made it is free, whatever the forwards before it cost
        costly_last = False
        self.budget.record_request(self.clock.monotonic())
        while True:
            targets = self._targets(fw, tried)
            if not targets:
                break
            peer = targets[0]
            now = self.clock.monotonic()
            remaining = fw.deadline.remaining(now)
            if remaining <= 0.001:
                raise DeadlineExceeded(
                    f"deadline of {fw.timeout_ms} ms ran out after {len(tried)} forward(s)"
                )
            attempt_s = remaining
            if len(targets) > 1:  # another could follow: this one gets its per-try timeout
                attempt_s = min(remaining, per_try_timeout_ms(peer.stats.p95_ms()) / 1000.0)
            if tried and costly_last and not self.budget.try_spend(now):
                self.metrics.retry_budget_exhausted.inc()
                if refusal is not None and not reached_any:
                    raise refusal
                raise AllAttemptsFailed(
                    f"{len(tried)} forward(s) failed and the retry budget is used up"
                )
            if tried:
                self.metrics.retries.labels("failover").inc()
                if fw.span is not None:
                    fw.span.retry("failover", f"@{peer.domain}", 0.0)
                log(logging.INFO, "route.failover", from_domain=tried[-1], to_domain=peer.domain)
            tried.append(peer.domain)
            answer, reached, refusal_now, costly = await self._one(fw, peer, attempt_s, attempts)
            if answer is not None:
                return answer
            reached_any = reached_any or reached
            costly_last = reached or costly
            if refusal_now is not None:
                refusal = refusal_now
        if not tried:
            cut = self._unreachable(fw.tag)
            if cut is not None:
                raise cut
            if fw.local is not None:
                raise fw.local
            raise NoCapableAgent(f"no domain offers intent {fw.tag!r}")
        if refusal is not None and not reached_any:
            raise refusal
        last = attempts[-1].outcome if attempts else None
        left = fw.deadline.remaining(self.clock.monotonic())
        # the deadline ran out in the last forward: at this gateway (its timeout) or at the
        # other (its deadline_exceeded comes FORWARD_SLACK_MS and a round trip before ours)
        if left <= 0.001 or (last == Outcome.TIMEOUT.value and left <= DEADLINE_SLACK_S):
            raise DeadlineExceeded(
                f"deadline of {fw.timeout_ms} ms ran out after {len(tried)} forward(s)"
                f" ({', '.join(tried)})"
            )
        raise AllAttemptsFailed(
            f"{len(tried)} forward(s) failed ({', '.join(tried)}) and no other domain offers"
            f" {fw.tag!r}"
        )

    async def _one(
        self, fw: ForwardRequest, peer: Peer, attempt_s: float, attempts: list[Attempt]
    ) -> tuple[tuple[str, msgspec.Raw] | None, bool, AgentReachError | None, bool]:
        """One forward: (the answer or None, whether it reached agents, the domain's
        refusal, whether it cost the other gateway work: any HTTP answer, of the contract or
        not)."""
        domain = peer.domain
        body = fw.body
        rtt_ms = peer.rtt_ms if peer.rtt_ms is not None else 1.0
        # the other gateway answers deadline_exceeded a few ms before the timeout it is given:
        # the slack keeps that answer ahead of this gateway's own cut, so that a domain whose
        # agents are slow is not taken for one whose gateway does not answer
        timeout_ms = max(1, int(attempt_s * 1000.0 - rtt_ms - FORWARD_SLACK_MS))
        payload = _encode(
            {
                "msg_id": body.msg_id,
                "trace_id": body.trace_id,
                "sender": body.sender,
                "recipient_hint": fw.hint,
                "intent": fw.tag,
                "intent_text": body.intent_text,
                "fallback": False,
                "payload": body.payload,
                "priority": body.priority,
                "timeout_ms": timeout_ms,
            }
        )
        headers = {
            **self._headers(),
            ORIGIN_HEADER: self.domain,
            HOPS_HEADER: "1",
            "X-Reach-Trace-Id": body.trace_id or "",
        }
        url = f"{peer.summary.gateway_url}/v1/send"
        attempt_span = None
        if fw.span is not None:  # a client span per forward, as per delivery attempt
            attempt_span = fw.span.attempt(
                body.trace_id or "",
                {
                    "agent_reach.attempt": len(attempts) + 1,
                    "agent_reach.domain": domain,
                    "url.full": url,
                },
            )
            headers["traceparent"] = attempt_span.traceparent
        elif fw.traceparent:
            headers["traceparent"] = fw.traceparent
        stats = peer.stats
        stats.inflight += 1
        started = self.clock.monotonic()
        try:
            delivery = await self.transport.deliver(url, payload, headers, attempt_s)
        except BaseException:  # cancelled (the caller left)
            if attempt_span is not None:
                attempt_span.end("cancelled", (self.clock.monotonic() - started) * 1000.0)
            raise
        finally:
            stats.inflight -= 1
        now = self.clock.monotonic()
        latency_ms = (now - started) * 1000.0
        outcome, reached, error = delivery.outcome, delivery.reached, ""
        endpoint_id = f"@{domain}"
        refusal: AgentReachError | None = None
        answer: _Reply | None = None
        answered = True  # by the other domain's gateway, in the contract's terms
        if delivery.outcome is Outcome.AGENT_ERROR and (
            delivery.status is None or delivery.body is None or delivery.status < 400
        ):
            # nothing usable came back though the other domain may have done the work (its
            # answer was over this gateway's cap; a 2xx that is not JSON, compressed; a 3xx):
            # not forwarded again, as an agent's would not be
            answered = delivery.status is None  # over the cap: an answer of ours, too long
            outcome, error = Outcome.AGENT_ERROR, delivery.detail
            refusal = AgentError(f"{domain}: {delivery.detail} (not forwarded again)")
        elif delivery.status is not None and delivery.body is not None:
            if 200 <= delivery.status < 300:
                try:
                    answer = _reply.decode(delivery.body)
                    outcome = Outcome.OK
                except (msgspec.DecodeError, msgspec.ValidationError):
                    # a 2xx is the other side's word that the work was done (a 202 or 204 of
                    # a proxy in front of it too): not forwarded again, as an agent's answer
                    # that cannot be read is not retried
                    answered = False
                    error = f"its {delivery.status} answer is not a send answer"
                    outcome = Outcome.AGENT_ERROR
                    refusal = AgentError(f"{domain}: {error} (not forwarded again)")
            else:
                outcome, reached, error, refusal, endpoint_id = self._refused(
                    domain, delivery.status, delivery.body
                )
                answered = not error.endswith(_NOT_OURS)
        else:
            answered = False  # no HTTP answer: refused, reset, or none within the timeout
        self._answered(domain, answered, outcome, now)
        if answer is not None:
            endpoint_id = _remote_id(answer.endpoint_id, domain)
            stats.observe(latency_ms, now)
        elif outcome is Outcome.CONNECT_ERROR:
            stats.penalize(2000.0, now)
            if delivery.eject:
                self.peers.refused(domain, delivery.detail)
                log(
                    logging.WARNING,
                    "federation.peer_ejected",
                    domain=domain,
                    detail=delivery.detail,
                )
        elif outcome is Outcome.TIMEOUT:
            stats.observe(latency_ms, now, answered=False, penalty_ms=2000.0)
        rounded = round3(latency_ms)
        if attempt_span is not None:
            attempt_span.end(outcome.value, latency_ms, delivery.status, error or delivery.detail)
        attempts.append(Attempt(endpoint_id, outcome.value, rounded, domain))
        self.metrics.forwarded(domain, outcome.value)
        fw.trace(
            "attempt",
            attempt=len(attempts),
            endpoint_id=endpoint_id,
            domain=domain,
            outcome=outcome.value,
            status=delivery.status,
            latency_ms=rounded,
            timeout_ms=timeout_ms,
            detail=error or delivery.detail,
            remote_attempts=None if answer is None else len(answer.attempts),
        )
        if answer is not None:
            return (endpoint_id, answer.result), True, None, True
        log(
            logging.WARNING,
            "reach.forward_failed",
            domain=domain,
            outcome=outcome.value,
            detail=error or delivery.detail,
            latency_ms=rounded,
        )
        if outcome is Outcome.AGENT_ERROR and isinstance(refusal, AgentError):
            raise refusal
        return None, reached, refusal, delivery.status is not None

    def _answered(self, domain: str, answered: bool, outcome: Outcome, now: float) -> None:
        """Count an answer of the contract from the domain's gateway, or a forward it left
        without one (a refused connection is the passive check's, not counted here): past
        :data:`~agent_reach.federation.peers.FAIL_AFTER` in a row it is tried last."""
        if answered:
            if self.peers.forward_answered(domain):
                log(logging.INFO, "federation.peer_answers", domain=domain)
        elif outcome is not Outcome.CONNECT_ERROR and self.peers.forward_failed(domain, now):
            log(
                logging.WARNING,
                "federation.peer_tried_last",
                domain=domain,
                failures=FAIL_AFTER,
                outcome=outcome.value,
                note=f"its gateway left {FAIL_AFTER} forwards in a row without an answer"
                f" (its probes may pass): other domains first, for {DEMOTED_S:g} s and then"
                " while a forward to it is in flight",
            )

    def _refused(
        self, domain: str, status: int, data: bytes
    ) -> tuple[Outcome, bool, str, AgentReachError | None, str]:
        """An error answer of the other domain's gateway: (outcome, reached an agent, what it
        said, the refusal to pass on, the endpoint id for the attempt)."""
        try:
            got = _refusal.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return (
                Outcome.SERVER_ERROR,
                False,
                f"HTTP {status}, {_NOT_OURS}",
                None,
                (f"@{domain}"),
            )
        endpoint_id = f"@{domain}"
        last = got.attempts[-1].get("endpoint_id") if got.attempts else None
        if isinstance(last, str):
            endpoint_id = _remote_id(last, domain)
        said = f"{domain}: {got.error}: {got.detail}"
        if got.error == "agent_error":
            fields: dict[str, Any] = {"agent_status": got.agent_status}
            if got.agent_answer is not None:
                fields["agent_answer"] = got.agent_answer
            return Outcome.AGENT_ERROR, True, said, AgentError(said, **fields), endpoint_id
        if got.error == "deadline_exceeded":
            return Outcome.TIMEOUT, True, said, None, endpoint_id
        if got.error == "all_attempts_failed":
            return Outcome.SERVER_ERROR, True, said, None, endpoint_id
        refusal: AgentReachError | None = None
        if got.error in _REFUSALS:
            refusal = error_from_answer(status, {"error": got.error, "detail": said})
            refusal.http_status = None  # ours to render now, from our own table
        elif got.error in ("overloaded", "rate_limited"):
            # the other domain asks to come back later: so does this answer, with its delay
            retry_after = got.retry_after_s if got.retry_after_s is not None else 1.0
            retry_after = min(MAX_PEER_RETRY_AFTER_S, max(1.0, retry_after))  # another's number
            refusal = Overloaded(said, retry_after_s=retry_after)
        elif got.error in ("unauthorized", "forbidden"):
            log(logging.WARNING, "federation.forward_refused", domain=domain, detail=said)
        return Outcome.SERVER_ERROR, False, said, refusal, endpoint_id


def _remote_id(endpoint_id: str, domain: str) -> str:
    """What another domain's gateway named as its endpoint, as seen here: always
    ``agent://NAME@DOMAIN`` of the domain forwarded to (it cannot name a third one), and
    ``@DOMAIN`` alone for a name that is not an endpoint id."""
    name, _ = split_domain(endpoint_id)
    return f"{name}@{domain}" if is_endpoint_id(name) else f"@{domain}"
