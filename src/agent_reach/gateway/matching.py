"""Which tag a request goes to: exact, then alias, then the fallback matcher (CONTRACT.md v1.1,
"Matching").

:func:`resolve` turns what the caller asked (``intent``, ``intent_text``, ``fallback``,
``recipient_hint``) into a :class:`Match`, the tag the request is routed on and how it was
found, or refuses with the contract's routing errors. The router then plans the endpoints of
that one tag (:meth:`agent_reach.gateway.router.Router.plan`).

Invariants:
- Each step runs only when the steps before it found no endpoint declaring the tag: exact (an
  endpoint declares ``intent``), alias (the dictionary maps ``intent`` to a canonical tag an
  endpoint declares; confidence 1.0), fallback (the matcher's best tag that an endpoint
  declares, at or above ``--confidence-threshold``). ``fallback`` false forbids every
  non-exact match, the alias step included (CONTRACT.md v1.1).
- The exact and alias steps cost two dictionary lookups; only the fallback step awaits the
  matcher (a worker thread, bounded: :class:`~agent_reach.intents.matcher.MatchIndexHolder`).
- A refusal with ``no_capable_agent`` carries ``suggestions``: the nearest tags below the
  threshold (at most 3, best first), so the caller sees how close it came. A lookup made only
  for them (``fallback`` false) that finds the matcher overloaded leaves them out rather than
  turn the refusal into a 503.
- ``reachable`` (token mode: the tags the policy lets this sender reach) is applied to the
  matcher's answer first, so a match never lands on a tag the sender may not reach while a
  reachable one was near enough, and such a tag is never a runner-up or a suggestion either
  (that would tell the sender what exists beyond its reach).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_reach.core.rounding import floor4, round4
from agent_reach.errors import (
    InvalidRequest,
    NoCapableAgent,
    Overloaded,
    RecipientIncapable,
    RecipientNotFound,
)
from agent_reach.wire.answers import MatchInfo

if TYPE_CHECKING:
    from agent_reach.gateway.router import Router

__all__ = ["MAX_SUGGESTIONS", "Match", "match_by_meaning", "resolve", "settle", "suggestions"]

MAX_SUGGESTIONS = 3
MAX_KEPT_EXACT = 65536  # exact matches a router keeps (one per tag), then forgets at once


@dataclass(frozen=True, slots=True)
class Match:
    """The tag a request is routed on, how it was found, and the runners-up of a fallback."""

    method: str  # exact, alias, semantic, lexical, hint
    tag: str
    confidence: float
    runners_up: tuple[tuple[str, float], ...] = ()

    def info(self) -> MatchInfo:
        return MatchInfo(self.method, self.tag, round4(self.confidence))

    def header(self) -> str:
        """``X-Reach-Match``: ``METHOD;confidence=0.93``."""
        return f"{self.method};confidence={self.confidence:.2f}"

    def event(self) -> dict[str, Any]:
        """The trace's record of the match (the route event)."""
        out: dict[str, Any] = {
            "method": self.method,
            "tag": self.tag,
            "confidence": round4(self.confidence),
        }
        if self.runners_up:
            out["runners_up"] = [
                {"tag": tag, "confidence": round4(c)} for tag, c in self.runners_up
            ]
        return out


def suggestions(scored: list[tuple[str, float]], below: float | None) -> list[dict[str, Any]]:
    """The nearest tags of a lookup for a refusal: at most 3, best first, each under ``below``
    (None: any), its confidence cut to 4 places (never shown at the threshold it missed)."""
    near = [(tag, c) for tag, c in scored if below is None or c < below]
    return [{"tag": tag, "confidence": floor4(c)} for tag, c in near[:MAX_SUGGESTIONS]]


def settle(
    router: Router, intent: str | None, hint: str | None = None, *, fallback: bool = True
) -> Match | None:
    """The steps that need no matcher, on the request path without an await: the hinted
    endpoint's tag, the exact tag, the alias; None when the fallback must decide. Raises the
    hint's refusals. An exact match's :class:`Match` is one per tag, kept (two dictionary
    lookups is the whole cost the exact path pays for matching)."""
    registry = router.registry
    if hint is not None:
        if intent is None:
            raise InvalidRequest(
                "recipient_hint needs intent: the tag the named endpoint declares",
                field="intent",
            )
        record = registry.get(hint)
        if record is None:
            raise RecipientNotFound(f"recipient_hint {hint} is not registered")
        if intent in record.capabilities:
            return Match("hint", intent, 1.0)
        # an alias, unless the caller forbade every match that is not exact (`fallback`)
        canonical = router.dictionary.canonical(intent) if fallback else None
        if canonical is not None and canonical in record.capabilities:
            return Match("hint", canonical, 1.0)
        raise RecipientIncapable(f"{hint} does not declare intent {intent!r}")
    if intent is None:
        return None
    if registry.by_intent(intent):
        kept = router.exact_matches
        exact = kept.get(intent)
        if exact is None:
            if len(kept) >= MAX_KEPT_EXACT:  # tags come and go: bounded
                kept.clear()
                router.exact_matches_cleared += 1
            exact = kept[intent] = Match("exact", intent, 1.0)
        return exact
    canonical = router.dictionary.canonical(intent) if fallback else None
    if canonical is not None and canonical != intent and registry.by_intent(canonical):
        return Match("alias", canonical, 1.0)
    return None


async def resolve(
    router: Router,
    intent: str | None,
    text: str | None,
    *,
    fallback: bool = True,
    hint: str | None = None,
    reachable: Callable[[str], bool] | None = None,
    dry_run: bool = False,
) -> Match:
    """The tag a request goes to, or the contract's refusal (module docstring)."""
    settled = settle(router, intent, hint, fallback=fallback)
    if settled is not None:
        return settled
    return await match_by_meaning(
        router, intent, text, fallback=fallback, reachable=reachable, dry_run=dry_run
    )


async def match_by_meaning(
    router: Router,
    intent: str | None,
    text: str | None,
    *,
    fallback: bool = True,
    reachable: Callable[[str], bool] | None = None,
    dry_run: bool = False,
    elsewhere: Callable[[str], bool] | None = None,
) -> Match:
    """The fallback step (after :func:`settle` found nothing), or ``no_capable_agent`` with
    the suggestions. ``elsewhere`` (federation): the tags another domain serves; the best one
    at or above the threshold is the match when no tag an endpoint here declares is (local
    first)."""
    registry = router.registry
    holder = router.matches
    method = holder.method
    threshold = router.settings.confidence_threshold
    scored: list[tuple[str, float]] = []
    query = intent
    if text is None and intent is not None:
        # a dictionary alias means what its tag means (which no endpoint declares, or settle()
        # had taken it): scored as that tag, not read as words another tag might match better
        # (`ticket.void`, an alias of an unserved `order.cancel`, went to `support.ticket.void`)
        query = router.dictionary.canonical(intent) or intent
    if method is not None:
        try:
            scored = await holder.lookup(query, text)
        except Overloaded:
            if fallback:
                raise  # the match itself could not be made: come back later
            # only the suggestions were wanted: the refusal goes out without them
    if reachable is not None:  # a tag the sender may not reach is neither chosen nor shown
        scored = [item for item in scored if reachable(item[0])]
    if fallback and method is not None:
        remote: tuple[str, float] | None = None
        for tag, confidence in scored:
            if confidence < threshold:
                break
            if registry.by_intent(tag):
                rest = tuple(item for item in scored if item[0] != tag)
                return Match(method, tag, confidence, rest)
            if remote is None and elsewhere is not None and elsewhere(tag):
                remote = (tag, confidence)
        if remote is not None:
            rest = tuple(item for item in scored if item[0] != remote[0])
            return Match(method, remote[0], remote[1], rest)
    if not dry_run and intent is not None:
        router.unrouted.note(intent, router.clock.wall())
    near = suggestions(scored, threshold)
    if intent is not None:
        detail = f"no agent declares intent {intent!r}"
    else:
        detail = f"no agent's intent matches the words {_short(text)!r}"
    if near:
        best = near[0]
        detail += f"; the nearest tag is {best['tag']!r} at confidence {best['confidence']:g}"
        detail += f", under the threshold {threshold:g}"
    raise NoCapableAgent(detail, suggestions=near)


def _short(text: str | None, limit: int = 60) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
