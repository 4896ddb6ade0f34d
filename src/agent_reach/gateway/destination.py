"""Where a request goes: a plan over this domain's endpoints, or a forward to other domains
(CONTRACT.md v1.1, "Matching" and "Federation"; docs/federation.md).

The order is the contract's: the hint (``agent://NAME@DOMAIN`` goes to that domain only); the
exact tag, then its alias, here; the same in another domain; the fallback by meaning here, then
a tag another domain offers; and a tag whose local endpoints are all unroutable goes to a domain
where it is routable. A request forwarded from another domain (``origin``) is served here or
refused with ``loop_detected``, never forwarded again.

Without federation (no forwarder) this is the v1.1 route: settle, match by meaning, plan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent_reach.core.names import split_domain
from agent_reach.core.retry import Deadline
from agent_reach.errors import (
    AgentReachError,
    InvalidRequest,
    LoopDetected,
    NoAvailableAgent,
    NoCapableAgent,
    RecipientNotFound,
)
from agent_reach.gateway.forward import Forwarder, ForwardRequest
from agent_reach.gateway.matching import Match
from agent_reach.gateway.router import RoutePlan, Router, RouteScope
from agent_reach.wire.bodies import SendBody

__all__ = ["FORWARDED", "Routed", "destination"]

FORWARDED = "_forwarded"  # the metrics' intent label of a request served by another domain


@dataclass(slots=True)
class Routed:
    """Where a request goes: ``plan`` (this domain's endpoints) or ``forward`` (others)."""

    match: Match
    tag: str
    plan: RoutePlan | None
    forward: ForwardRequest | None


def _no_trace(kind: str, **data: Any) -> None:
    """A ForwardRequest's trace until the send binds its own."""


def _loop(tag: str, origin: str) -> str:
    return (
        f"no agent of this domain can serve {tag!r} now, and a request forwarded from {origin}"
        " is not forwarded to a third domain"
    )


async def destination(
    router: Router,
    fwd: Forwarder | None,
    body: SendBody,
    deadline: Deadline,
    scope: RouteScope | None,
    admit: Callable[[str], tuple[str | None, RouteScope | None]] | None,
    origin: str | None,
    by_meaning: Callable[[Callable[[str], bool] | None], Awaitable[Match]],
) -> Routed:
    """Where ``body`` goes: a plan over this domain's endpoints, or a forward to other
    domains (federation: docs/federation.md). The order is the contract's: the hint; the
    exact tag (or its alias) here, then in another domain; the fallback by meaning here,
    then in another domain. ``origin`` is set for a request forwarded from another domain:
    it is served here or refused, never forwarded again (``loop_detected``)."""
    hint = body.recipient_hint
    if hint is not None and "@" in hint:
        name, domain = split_domain(hint)
        if domain == router.settings.domain:
            hint = body.recipient_hint = name
        else:
            if origin is not None:
                raise LoopDetected(
                    f"{hint} is in another domain, and a request forwarded from {origin} is"
                    " not forwarded again"
                )
            if fwd is None:
                raise RecipientNotFound(
                    f"recipient_hint {hint} names domain {domain!r}, and this gateway is in"
                    " no federation (--directory)"
                )
            if body.intent is None:
                raise InvalidRequest(
                    "recipient_hint needs intent: the tag the named endpoint declares",
                    field="intent",
                )
            fw = _forward(router, body, body.intent, deadline, None, hint=name, domain=domain)
            return Routed(Match("hint", body.intent, 1.0), body.intent, None, fw)
    if _restricted(scope):
        # the sender's rule names the endpoints it may reach: those of this domain, which the
        # policy can see; another domain's are not offered to it (a hint may still name one)
        fwd = None
    settled = router.settle(body.intent, hint, fallback=body.fallback)
    if settled is None and body.intent is not None and fwd is not None:
        # the exact tag (or its alias) in another domain, before any match by meaning
        canonical = router.dictionary.canonical(body.intent) if body.fallback else None
        for tag, method in ((body.intent, "exact"), (canonical, "alias")):
            if tag is not None and fwd.offers(tag, exclude=origin):
                if origin is not None:
                    raise LoopDetected(_loop(tag, origin))
                if admit is not None and tag != body.intent:
                    body.sender, scope = admit(tag)
                    if _restricted(scope):  # the rule of the tag names endpoints: ours only
                        fwd = None
                        break
                local = NoCapableAgent(f"no agent of this domain declares intent {tag!r}")
                return Routed(
                    Match(method, tag, 1.0),
                    tag,
                    None,
                    _forward(router, body, tag, deadline, local),
                )
    if settled is None:
        elsewhere = None if fwd is None or origin is not None else fwd.offers
        match = await by_meaning(elsewhere)
        if elsewhere is not None and not router.registry.by_intent(match.tag):
            if admit is not None and match.tag != body.intent:
                body.sender, scope = admit(match.tag)
            if not _restricted(scope):
                local = NoCapableAgent(f"no agent of this domain declares {match.tag!r}")
                return Routed(
                    match, match.tag, None, _forward(router, body, match.tag, deadline, local)
                )
            fwd = None  # the rule of the tag matched names endpoints: ours only
    else:
        match = settled
    if admit is not None and match.tag != body.intent:
        body.sender, scope = admit(match.tag)
    try:
        plan = router.plan(match, hint, scope=scope)
    except NoAvailableAgent as exc:
        # every local endpoint of the tag is suspect, down or ejected: another domain's, unless
        # the sender's rule for the tag routed on names the endpoints it may reach
        if hint is not None or fwd is None or _restricted(scope):
            raise
        if not fwd.offers(match.tag, exclude=origin):
            raise
        if origin is not None:
            raise LoopDetected(_loop(match.tag, origin)) from None
        return Routed(match, match.tag, None, _forward(router, body, match.tag, deadline, exc))
    return Routed(match, match.tag, plan, None)


def _restricted(scope: RouteScope | None) -> bool:
    """Whether the sender's rule names the endpoints it may reach (``[[reach]] endpoints``):
    those of this domain, which the policy can see; another domain's are never offered."""
    return scope is not None and scope.endpoint is not None


def _forward(
    router: Router,
    body: SendBody,
    tag: str,
    deadline: Deadline,
    local: AgentReachError | None,
    *,
    hint: str | None = None,
    domain: str | None = None,
) -> ForwardRequest:
    timeout_ms = body.timeout_ms or router.settings.default_timeout_ms
    return ForwardRequest(
        body, tag, deadline, timeout_ms, _no_trace, "", hint=hint, domain=domain, local=local
    )
