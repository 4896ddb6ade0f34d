"""The gateway service: registry operations, derived health, and route decisions.

Orchestrates the pure core over a registry backend; it never speaks HTTP. Delivery (the retry
loop) lives in :mod:`agent_reach.gateway.delivery`.

Invariants:
- Status is derived in one place (:func:`agent_reach.core.health.derive`) on the liveness clock.
- The per-intent tiers are kept up to date incrementally: an event that may change an endpoint's
  tier (registry change other than a timely heartbeat, slow flag flip, ejection, recovery)
  re-places that endpoint; a status change by time alone re-places it when it comes due.
- A send refused with ``no_capable_agent`` is noted in a bounded record of unrouted intents
  (:mod:`agent_reach.gateway.diagnostics`); dry runs are not, and routed requests cost nothing.
- Attempts open to one endpoint are at most ``--max-inflight-per-endpoint``: :meth:`Router.acquire`
  returns an endpoint with a free slot, or waits for one in priority order
  (:mod:`agent_reach.gateway.slots`). Every event that can free a slot or make room (an attempt
  ending or cancelled, a member re-placed, a waiter leaving) offers it to the waiters; a waiter
  woken with a slot it may take takes it without choosing again (one wake-up a wait). A waiter
  also looks again every ``RECHECK_S``, so that a slot freed by a path that offered nothing is
  not lost.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from agent_reach.clock import Clock
from agent_reach.core.health import EndpointStats, Health, LivenessClock, derive
from agent_reach.core.model import ROUTABLE, EndpointRecord, Outcome, Status
from agent_reach.core.retry import Deadline, RetryBudget, max_retries, per_try_timeout_ms
from agent_reach.core.routing import PROBE_SHARE, Tiers, at_bound, build_tiers, pick
from agent_reach.errors import (
    DeadlineExceeded,
    EndpointNotRegistered,
    Forbidden,
    InvalidRequest,
    NoAvailableAgent,
    RecipientNotFound,
)
from agent_reach.gateway import explain
from agent_reach.gateway.diagnostics import UnroutedIntents
from agent_reach.gateway.matching import Match, resolve, settle, suggestions
from agent_reach.gateway.slots import Slots
from agent_reach.intents.dictionary import EMPTY_DICTIONARY, IntentDictionary
from agent_reach.intents.matcher import FallbackMatcher, MatchIndexHolder
from agent_reach.observability.logs import log
from agent_reach.registry.base import RegistryBackend, RegistryChange
from agent_reach.settings import GatewaySettings
from agent_reach.wire.bodies import RegisterBody

__all__ = ["RoutePlan", "RouteScope", "Router"]

STALL_TICK_S = 0.25
_JUST_SEEN = Health(Status.HEALTHY, "healthy", math.inf)  # only its status is read
FAILURE_PENALTY_MS = 2000.0  # what a failed attempt costs in the load-aware score
RECHECK_S = 0.25  # a request waiting for a slot looks again at least this often
STATUS_CHUNK = 1000  # healths derived per turn of the loop when a scrape counts statuses


@dataclass(frozen=True, slots=True)
class RouteScope:
    """Where a sender's request may go (token mode): the endpoints the policy lets it reach
    with the matched tag (None: no limit)."""

    endpoint: Callable[[str], bool] | None = None


@dataclass(slots=True)
class RoutePlan:
    """Where a request may go: a fixed hinted endpoint, or the matched tag's tiers."""

    intent: str  # the tag routed on (the match's)
    hint: str | None
    tiers: Tiers | None
    match: Match
    ids: tuple[str, ...] = ()  # the candidates a scope kept (empty: every endpoint of the tag)


class Router:
    """Registry operations and route decisions over one registry backend."""

    def __init__(
        self,
        settings: GatewaySettings,
        registry: RegistryBackend,
        clock: Clock,
        *,
        rng: random.Random | None = None,
        matcher: FallbackMatcher | None = None,
    ) -> None:
        self.settings = settings
        self.thresholds = settings.thresholds
        self.registry = registry
        self.clock = clock
        self.rng = rng or random.Random()
        self._dictionary: IntentDictionary = EMPTY_DICTIONARY
        self.exact_matches: dict[str, Match] = {}  # one Match per exact tag (matching.settle)
        self.exact_matches_cleared = 0  # times it was cleared at its bound (a metric)
        # fallback matches come from an index of the known tags (the dictionary's and every
        # registered one), rebuilt off the request path when they or their texts change
        self.matches = MatchIndexHolder(matcher, self._known_tags, self._tag_texts)
        interval = settings.heartbeat_interval
        self.liveness = LivenessClock(STALL_TICK_S, min(1.0, interval / 2))
        self.stats: dict[str, EndpointStats] = {}
        self.budget = RetryBudget(settings.retry_budget_ratio, settings.retry_budget_min_per_s)
        # --max-inflight-per-endpoint: attempts open to one endpoint, and the requests waiting;
        # a wait queue holds as many as the gateway admits (each waiter is a request in
        # delivery), so that it refuses no request --max-inflight's priority shares let in
        self.bound = settings.max_inflight_per_endpoint
        self.slots = Slots(clock.monotonic, self._offer, settings.max_inflight)
        self._tiers: dict[str, Tiers] = {}
        self.unrouted = UnroutedIntents()  # intents refused with no_capable_agent
        # nats:SUBJECT -> the ids registered there (one, but for a holder down when another
        # came, back by heartbeat, or two registered through two gateways at once): two ids on
        # one subject would both take every delivery (two queue groups), so register refuses
        # a subject another id holds and is not down
        self.nats_holders: dict[str, set[str]] = {}
        # federation: the tags other domains serve, known to the fallback matcher too
        self.remote_tags: Callable[[], Collection[str]] = tuple
        registry.bind(self.now)  # records' last_seen are on this gateway's liveness clock
        registry.subscribe(self._on_change)

    # --- time and health -------------------------------------------------------------------

    def now(self) -> float:
        """Liveness time: monotonic, minus what the gateway itself spent stalled."""
        return self.liveness.now(self.clock.monotonic())

    def health(self, record: EndpointRecord, now: float | None = None) -> Health:
        """The derived health of ``record``."""
        return derive(
            record.last_seen,
            self.stats.get(record.endpoint_id),
            self.now() if now is None else now,
            self.thresholds,
        )

    def _replace_member(self, endpoint_id: str, intents: Collection[str]) -> None:
        """Re-place ``endpoint_id`` in the cached tiers of ``intents`` after an event."""
        record = self.registry.get(endpoint_id)
        if record is None and self.slots.waiting:
            # gone: a waiter left with no candidate (its hinted ones too) answers at once
            self.slots.kick(intents, endpoint_id)
        h: Health | None = None
        for intent in intents:
            tiers = self._tiers.get(intent)
            if tiers is None:
                continue
            if record is None or intent not in record.capabilities:
                tiers.place(endpoint_id, None)
                if not tiers.placed:
                    del self._tiers[intent]
                continue
            if h is None:
                h = self.health(record)
            tiers.place(endpoint_id, h)
        self._offer(endpoint_id)  # it may have room for waiters now (back, or new)

    def _on_change(self, change: RegistryChange) -> None:
        before, after = change.before, change.after
        endpoint_id = change.endpoint_id
        if before is None or after is None or before.endpoint_url != after.endpoint_url:
            holders = self.nats_holders
            if before is not None and (held := holders.get(before.endpoint_url)) is not None:
                held.discard(endpoint_id)
                if not held:
                    del holders[before.endpoint_url]
            if after is not None and after.endpoint_url.startswith("nats:"):
                holders.setdefault(after.endpoint_url, set()).add(endpoint_id)
        if after is None or (before is not None and before.endpoint_url != after.endpoint_url):
            self.stats.pop(endpoint_id, None)  # gone, or another process: its latencies go too
        else:
            stats = self.stats.get(endpoint_id)
            ejected_at = stats.ejected_at if stats is not None else None
            if stats is not None and ejected_at is not None and after.last_seen > ejected_at:
                stats.forgive()  # a heartbeat (or registration) ends a passive ejection
            if (
                before is not None
                and before.capabilities == after.capabilities
                and before.description == after.description  # (the matcher's words)
                and ejected_at is None
                # the new last_seen is "now": was the previous heartbeat still on time?
                and after.last_seen - before.last_seen <= self.thresholds.degraded_after
            ):
                return  # a timely heartbeat keeps the tier (slowness is not its business)
        if (
            before is None
            or after is None
            or before.capabilities != after.capabilities
            or before.description != after.description
        ):
            self.matches.changed()
            if before is not None:  # a tag whose last endpoint left may never come back:
                # its kept Match goes (the collector walks every one kept: F20)
                kept = self.exact_matches
                for tag in before.capabilities:
                    if tag in kept and not self.registry.by_intent(tag):
                        del kept[tag]
        intents = {*(before.capabilities if before else ()), *(after.capabilities if after else ())}
        self._replace_member(endpoint_id, intents)

    @property
    def dictionary(self) -> IntentDictionary:
        """The intent dictionary in force (empty without ``--intents``)."""
        return self._dictionary

    @dictionary.setter
    def dictionary(self, dictionary: IntentDictionary) -> None:
        """A new dictionary (start, reload): the matcher's index is rebuilt for it."""
        self._dictionary = dictionary
        self.matches.changed()

    def _known_tags(self) -> tuple[str, ...]:
        """Every tag the fallback matcher knows: the registered ones, then the dictionary's
        and other domains' not among them. Read on the loop at every index build: the
        registry's tags are copied as they are (~0.5 ms at 50,000), not put through a set
        (~4 ms: docs/reliability.md, F15)."""
        registered = self.registry.intents()
        known = list(registered)
        others = {*self._dictionary.tags(), *self.remote_tags()}
        known.extend(tag for tag in others if tag not in registered)
        return tuple(known)

    def _tag_texts(self, tag: str) -> list[str]:
        """The dictionary's description and examples of ``tag``, and the agents' descriptions
        of the endpoints declaring it (for matchers that compare words)."""
        out = list(self._dictionary.texts(tag))
        for endpoint_id in self.registry.by_intent(tag):
            record = self.registry.get(endpoint_id)
            if record is not None and record.description:
                out.append(record.description)
        return out

    # --- registry operations ---------------------------------------------------------------

    async def register(self, body: RegisterBody, owner: str = "") -> EndpointRecord:
        """Insert or replace a record; counts as a heartbeat. ``owner`` is the registration's
        generation in token mode (``""`` in open mode): then the registry refuses the write
        (EndpointHeld) while another live registration holds the id, checked where it is
        written (in Redis, against writes through other gateways too).

        Registering an id again may mean a new process behind it (a restart): its load-aware
        cost starts again as a new endpoint's does (:meth:`EndpointStats.renew`).

        A ``nats:`` subject where another id is registered and not down is refused
        (InvalidRequest, ``endpoint_url``): both ids' agents would take every delivery to it
        (each id is its own queue group), and the caller would get whichever answered first."""
        url = body.endpoint_url
        now = self.now()
        for holder in self.nats_holders.get(url, ()) if url.startswith("nats:") else ():
            other = self.registry.get(holder)
            if (
                holder != body.endpoint_id
                and other is not None
                and self.health(other, now).status is not Status.DOWN
            ):
                raise InvalidRequest(
                    f"{url} is where {holder} is registered (and not down): two ids on one"
                    " subject would both take every delivery; give this one a subject of its"
                    f" own, or deregister {holder} first",
                    field="endpoint_url",
                )
        record = EndpointRecord(
            endpoint_id=body.endpoint_id,
            capabilities=tuple(body.capabilities),
            endpoint_url=body.endpoint_url,
            description=body.description,
            last_seen=self.now(),
            last_seen_at=self.clock.wall(),
            owner=owner,
        )
        held_within = self.thresholds.down_after if owner else None
        before = await self.registry.upsert(record, held_within_s=held_within)
        stats = self.stats.get(record.endpoint_id) if before is not None else None
        if stats is not None:
            stats.renew()  # perhaps a new process: its cost starts again (reliability.md, F8)
        log(
            logging.INFO,
            "agent.registered",
            endpoint_id=record.endpoint_id,
            capabilities=list(record.capabilities),
            endpoint_url=record.endpoint_url,
            replaced=before is not None,
        )
        return record

    def heartbeat(self, endpoint_id: str) -> Health:
        """Note a heartbeat (synchronous, as the registry's touch); EndpointNotRegistered when
        the id is unknown."""
        now = self.now()
        record = self.registry.touch(endpoint_id, now, self.clock.wall())
        if record is None:
            raise EndpointNotRegistered(f"{endpoint_id} is not registered; register again")
        if endpoint_id not in self.stats:
            return _JUST_SEEN  # no deliveries yet: nothing but the heartbeat decides
        return self.health(record, now)

    async def deregister(self, endpoint_id: str, *, owner: str | None = None) -> None:
        """Remove a record at once; EndpointNotRegistered when the id is unknown, EndpointHeld
        (nothing removed) when ``owner`` is given and the record is another owner's."""
        if await self.registry.remove(endpoint_id, owner=owner) is None:
            raise EndpointNotRegistered(f"{endpoint_id} is not registered")
        log(logging.INFO, "agent.deregistered", endpoint_id=endpoint_id)

    async def evict(
        self, keep: Callable[[EndpointRecord], tuple[bool, str]], *only: str
    ) -> list[str]:
        """Deregister every record (or those of the ids ``only``) that ``keep`` refuses (a
        policy that no longer lets an id claim its intents); returns their ids. ``keep``
        answers (kept, why)."""
        evicted = []
        if only:
            records = [r for r in map(self.registry.get, only) if r is not None]
        else:
            records = list(self.registry.records())
        for record in records:
            kept, why = keep(record)
            if kept:
                continue
            if await self.registry.remove(record.endpoint_id) is not None:
                evicted.append(record.endpoint_id)
                log(logging.WARNING, "agent.evicted", endpoint_id=record.endpoint_id, why=why)
        return evicted

    async def purge(self) -> int:
        """Delete records that have not heartbeat for the purge time (never before down)."""
        purged = await self.registry.purge(self.now() - self.settings.purge_after_s)
        if purged:
            log(logging.INFO, "registry.purged", count=purged)
        return purged

    def describe(self, record: EndpointRecord, now: float) -> dict[str, Any]:
        """The contract's AGENT object."""
        stats = self.stats.get(record.endpoint_id)
        avg, p95 = stats.latency_stats() if stats else (None, None)
        return {
            "endpoint_id": record.endpoint_id,
            "capabilities": list(record.capabilities),
            "endpoint_url": record.endpoint_url,
            "description": record.description,
            "status": self.health(record, now).status.value,
            "last_seen_at": round(record.last_seen_at, 3),
            "avg_latency_ms": None if avg is None else round(avg, 3),
            "p95_latency_ms": None if p95 is None else round(p95, 3),
        }

    def status_counts(self) -> dict[str, int]:
        """How many endpoints are in each status now (O(n): for scrapes, not hot paths)."""
        now = self.now()
        counts = {s.value: 0 for s in Status}
        for record in self.registry.records():
            counts[self.health(record, now).status.value] += 1
        return counts

    async def scan_for_scrape(
        self, chunk: int = STATUS_CHUNK
    ) -> tuple[dict[str, int], list[float]]:
        """How many endpoints are in each status, and each one's ``last_seen``: of the records
        registered when called (one snapshot for both), at that time, with ``chunk`` records
        per turn of the loop (~1 µs each: 50 ms in one go at 50,000 endpoints, on every
        scrape)."""
        now = self.now()
        records = list(self.registry.records())  # a registration meanwhile must not break it
        counts = {s.value: 0 for s in Status}
        seen: list[float] = []
        health = self.health
        for start in range(0, len(records), chunk):
            part = records[start : start + chunk]
            for record in part:
                counts[health(record, now).status.value] += 1
            seen += [record.last_seen for record in part]
            await asyncio.sleep(0)  # the loop serves others between chunks
        return counts, seen

    # --- routing ---------------------------------------------------------------------------

    def _intent_tiers(self, intent: str, now: float) -> Tiers:
        tiers = self._tiers.get(intent)
        if tiers is None:
            registry = self.registry
            tiers = build_tiers(
                registry.by_intent(intent), registry.get, self.stats, now, self.thresholds
            )
            if tiers.placed:
                self._tiers[intent] = tiers
        elif tiers.valid_until < now:

            def rederive(endpoint_id: str) -> Health | None:
                record = self.registry.get(endpoint_id)
                if record is None or intent not in record.capabilities:
                    return None
                return self.health(record, now)

            tiers.expire(now, rederive)
        return tiers

    def tiers_of(self, intent: str) -> Tiers:
        """The tiers of ``intent`` now (the summary of a domain counts them)."""
        return self._intent_tiers(intent, self.now())

    def settle(
        self, intent: str | None, hint: str | None = None, *, fallback: bool = True
    ) -> Match | None:
        """The match found without the matcher: :func:`agent_reach.gateway.matching.settle`."""
        return settle(self, intent, hint, fallback=fallback)

    async def resolve(
        self,
        intent: str | None,
        text: str | None,
        *,
        fallback: bool = True,
        hint: str | None = None,
        reachable: Callable[[str], bool] | None = None,
        dry_run: bool = False,
    ) -> Match:
        """The tag a request goes to: :func:`agent_reach.gateway.matching.resolve`."""
        return await resolve(
            self,
            intent,
            text,
            fallback=fallback,
            hint=hint,
            reachable=reachable,
            dry_run=dry_run,
        )

    async def route(
        self,
        intent: str | None,
        hint: str | None = None,
        *,
        text: str | None = None,
        fallback: bool = True,
        dry_run: bool = False,
        scope: RouteScope | None = None,
    ) -> RoutePlan:
        """:meth:`resolve` then :meth:`plan`, for callers with no policy to apply between
        them (tests, tools)."""
        match = await self.resolve(intent, text, fallback=fallback, hint=hint, dry_run=dry_run)
        return self.plan(match, hint, scope=scope)

    async def suggest(self, intent: str | None, text: str | None = None) -> list[dict[str, Any]]:
        """The nearest known tags to ``intent`` (or the words ``text``): at most 3, best
        first, ``{"tag", "confidence"}`` (strict registrations, doctor)."""
        if self.matches.method is None:
            return []
        return suggestions(await self.matches.lookup(intent, text), None)

    def plan(
        self,
        match: Match,
        hint: str | None,
        *,
        scope: RouteScope | None = None,
    ) -> RoutePlan:
        """The endpoints ``match``'s tag may go to now; raise the contract's routing errors.

        ``scope`` (token mode: the endpoints the policy lets this sender reach with the tag)
        keeps only the candidates it accepts; when it accepts none: ``forbidden``.
        """
        tag = match.tag
        now = self.now()
        if hint is not None:
            record = self.registry.get(hint)
            if record is None:
                raise RecipientNotFound(f"recipient_hint {hint} is not registered")
            h = self.health(record, now)
            if h.status is Status.DOWN:
                raise NoAvailableAgent(f"{hint} is down: {h.reason}")
            return RoutePlan(tag, hint, None, match)
        allowed = None if scope is None else scope.endpoint
        ids: tuple[str, ...] = ()
        if allowed is None:
            tiers = self._intent_tiers(tag, now)
        else:
            ids = tuple(e for e in self.registry.by_intent(tag) if allowed(e))
            if not ids:
                raise Forbidden(
                    f"the policy lets this sender reach {tag!r} only at endpoints that do"
                    " not declare it"
                )
            tiers = build_tiers(ids, self.registry.get, self.stats, now, self.thresholds)
        if not tiers.healthy and not tiers.degraded:
            raise NoAvailableAgent(
                f"{tiers.unavailable} agent(s) declare {tag!r} but none is healthy or degraded"
            )
        return RoutePlan(tag, None, tiers, match, ids)

    def refresh(self, plan: RoutePlan) -> Tiers | None:
        """The plan's tiers re-derived now (statuses are checked again before each retry)."""
        if plan.tiers is None:
            return None
        now = self.now()
        if plan.ids:
            return build_tiers(plan.ids, self.registry.get, self.stats, now, self.thresholds)
        return self._intent_tiers(plan.intent, now)

    def choose(
        self,
        plan: RoutePlan,
        tried: Collection[str] = (),
        *,
        free_only: bool = False,
        probes: bool = True,
    ) -> str | None:
        """The endpoint for the next attempt (None when no eligible one is left).

        Prefers an endpoint not yet tried (failover); otherwise the most recently tried one
        that is still eligible (a retry of an endpoint already tried). Endpoints at their
        bound of attempts (``--max-inflight-per-endpoint``) come after every other; with
        ``free_only`` they are not chosen at all (a hedge, which must not wait). Choosing
        takes no slot: :meth:`acquire` does, right before an attempt. ``probes=False``: without
        the probe share (a dry run shows the choice of the other 98 % of sends). Only a
        request's first choice draws the probe share (a retry or a hedge, with ``tried``, never
        does), so that at most that share of requests carry a probe, however many retries
        they make.
        """
        choice = self._choose(plan, tried, bounded=True, probes=probes)
        if choice is None and not free_only:
            choice = self._choose(plan, tried, bounded=False, probes=probes)
        return choice

    def _choose(
        self,
        plan: RoutePlan,
        tried: Collection[str],
        *,
        bounded: bool,
        fresh: bool = False,
        probes: bool = True,
    ) -> str | None:
        """:meth:`choose` among the endpoints with a free slot (``bounded``) or among all;
        ``fresh``: with the statuses derived again even before any attempt."""
        tiers = self.refresh(plan) if tried or fresh else plan.tiers
        return self._choose_in(plan, tiers, tried, bounded=bounded, probes=probes)

    def _choose_in(
        self,
        plan: RoutePlan,
        tiers: Tiers | None,
        tried: Collection[str],
        *,
        bounded: bool,
        probes: bool = True,
    ) -> str | None:
        """:meth:`_choose` in ``tiers`` (the plan's, or refreshed; None for a hinted plan)."""
        if plan.hint is not None:
            record = self.registry.get(plan.hint)
            if record is None or self.health(record).status is Status.DOWN:
                return None
            if bounded and self.full(plan.hint):
                return None
            return plan.hint
        assert tiers is not None
        now = self.now()
        reserved = self.slots.reserved
        bound = self.bound if bounded else None
        share = PROBE_SHARE if probes and not tried else 0.0
        choice = pick(tiers, self.stats, now, self.rng, tried, share, bound, reserved)
        if choice is None and tried:  # every eligible one was tried: the latest still eligible
            for endpoint_id in reversed(list(tried)):
                h = tiers.placed.get(endpoint_id)
                routable = h is not None and h.status in ROUTABLE
                if routable and not (bounded and self.full(endpoint_id)):
                    return endpoint_id
        return choice

    def full(self, endpoint_id: str) -> bool:
        """Whether ``endpoint_id`` has its bound of attempts open (reserved slots count)."""
        reserved = self.slots.reserved.get(endpoint_id, 0)
        return at_bound(self.stats.get(endpoint_id), reserved, self.bound)

    async def acquire(
        self,
        plan: RoutePlan,
        tried: Collection[str] = (),
        priority: str | None = "normal",
        deadline: Deadline | None = None,
        *,
        prefer: str | None = None,
    ) -> str | None:
        """The endpoint for an attempt about to start, with a free slot: ``prefer`` (the one
        :meth:`choose` gave) when it has one, else the choice among those that have one, else,
        when every eligible candidate is at its bound, the first slot one of them frees, the
        waiting requests served ``high`` first, then ``normal``, then ``low``, in order of
        arrival within one (:mod:`agent_reach.gateway.slots`): the waiter woken for a slot
        takes it, unless its endpoint was tried already by this request or is gone (then it
        chooses again, as it does when kicked or looking again on its recheck).

        None when no eligible candidate is left. Raises Overloaded (503, Retry-After) when the
        wait queue of the request's intent is full for its priority, and DeadlineExceeded when
        ``deadline`` runs out first. The slot returned is held for the request until an attempt
        starts there (:meth:`attempt_started`), or two turns of the event loop: start it at
        once (in this task, or in a task created now).

        A retry (``tried`` not empty) gets ``prefer`` only if it is still eligible now, its
        status checked again after the backoff waited since :meth:`choose`
        (:meth:`_eligible_now`); else it is chosen again.
        """
        if prefer is not None and tried and not self._eligible_now(plan, prefer):
            prefer = None  # no longer eligible since it was chosen: choose again
        if prefer is None or self.full(prefer):
            fresh = prefer is not None or bool(tried)
            tiers = self.refresh(plan) if fresh else plan.tiers
            target = self._choose_in(plan, tiers, tried, bounded=True)
            if target is None:
                if not fresh:
                    tiers = self.refresh(plan)
                if not self._any_eligible(plan, tiers):
                    return None
                return await self._wait_for_slot(plan, tried, priority, deadline)
        else:
            target = prefer
        self.slots.claim(target)
        return target

    def _eligible_now(self, plan: RoutePlan, endpoint_id: str) -> bool:
        """Whether ``endpoint_id`` may take an attempt of ``plan`` now: registered, and not down
        when hinted (a hint may go to a suspect endpoint), else still declaring the tag and
        healthy, degraded or due a probe."""
        record = self.registry.get(endpoint_id)
        if record is None:
            return False
        h = self.health(record)
        if plan.hint is not None:
            return h.status is not Status.DOWN
        if not plan.ids and plan.intent not in record.capabilities:
            return False  # re-registered meanwhile without the tag
        return h.status in ROUTABLE or h.probe  # (a probe: chosen by the probe share)

    def _any_eligible(self, plan: RoutePlan, tiers: Tiers | None) -> bool:
        """Whether the unbounded choice in ``tiers`` would find an endpoint (one not down for a
        hint; else any healthy or degraded one, tried or not): what a wait can end with."""
        if plan.hint is not None:
            record = self.registry.get(plan.hint)
            return record is not None and self.health(record).status is not Status.DOWN
        assert tiers is not None
        return bool(tiers.healthy or tiers.degraded)

    def _takes(self, plan: RoutePlan, tried: Collection[str], endpoint_id: str) -> bool:
        """Whether a waiter of ``plan`` woken with a slot reserved at ``endpoint_id`` takes it
        as it is: :meth:`Slots.offer` judged the endpoint routable (hintable for a hint's
        queue) for the waiter's queue; it is still registered, and not tried already by this
        request (a hinted endpoint is its only candidate, tried or not)."""
        if plan.hint is None and endpoint_id in tried:
            return False  # another candidate may have a slot: choose again
        return self.registry.get(endpoint_id) is not None

    async def _wait_for_slot(
        self,
        plan: RoutePlan,
        tried: Collection[str],
        priority: str | None,
        deadline: Deadline | None,
    ) -> str | None:
        """Wait in line for a slot (:mod:`agent_reach.gateway.slots`); returns the endpoint with
        its slot claimed, or None when no eligible candidate is left.

        Woken with a slot reserved at an endpoint it may take (:meth:`_takes`), a waiter takes
        it: one wake-up, no choice made again. Kicked, out of time for a recheck, or woken for
        an endpoint it may not take, it gives the reservation back and chooses again."""
        slots = self.slots
        if plan.hint is not None:
            waiter = slots.join(("hint", plan.hint), priority)
        elif plan.ids:
            waiter = slots.join((plan.intent, plan.ids), priority, intent=plan.intent, ids=plan.ids)
        else:
            waiter = slots.join(plan.intent, priority, intent=plan.intent)
        try:
            while True:
                left = math.inf
                if deadline is not None:
                    left = deadline.remaining(self.clock.monotonic())
                    if left <= 0:
                        raise DeadlineExceeded(
                            "the deadline ran out while every eligible agent had"
                            f" {self.bound} attempts open (--max-inflight-per-endpoint)"
                        )
                woken = await slots.wait(waiter, min(left, RECHECK_S))
                offered = waiter.endpoint if woken else None
                if offered is not None and self._takes(plan, tried, offered):
                    return slots.hand_over(waiter)  # the reservation is its claim now
                offered = slots.taken(waiter)
                tiers = self.refresh(plan)
                target = self._choose_in(plan, tiers, tried, bounded=True)
                if target is not None and not woken and self._offer(target):
                    continue  # a slot nobody was offered: to the first in line (maybe this one)
                if target is not None:
                    slots.leave(waiter, served=True)
                    if offered is not None and offered != target:
                        self._offer(offered)  # it chose better: that slot is free again
                    slots.claim(target)
                    return target
                if offered is not None:
                    self._offer(offered)  # of no use to it: perhaps to the next in line
                if not self._any_eligible(plan, tiers):
                    return None  # no eligible candidate left to wait for
                slots.requeue(waiter)
        finally:
            released = slots.leave(waiter)
            if released is not None:
                self._offer(released)

    def _offer(self, endpoint_id: str) -> int:
        """Offer the free slots of ``endpoint_id`` to the requests waiting for one; returns
        how many were woken."""
        slots = self.slots
        if not slots.waiting:
            return 0
        record = self.registry.get(endpoint_id)
        if record is None:
            return 0
        stats = self.stats.get(endpoint_id)
        inflight = stats.inflight if stats is not None else 0
        room = self.bound - inflight - slots.reserved.get(endpoint_id, 0)
        if room <= 0:
            return 0
        status = self.health(record).status
        return slots.offer(
            endpoint_id,
            record.capabilities,
            room,
            routable=status in ROUTABLE,
            hintable=status is not Status.DOWN,
        )

    def per_try_ms(self, endpoint_id: str) -> float:
        """The contract's per-try timeout for ``endpoint_id`` from its recent p95."""
        stats = self.stats.get(endpoint_id)
        return per_try_timeout_ms(stats.p95_ms() if stats else None)

    def max_retries(self, timeout_ms: float, per_try_ms: float) -> int:
        """The contract's retry count for this deadline."""
        return max_retries(timeout_ms, self.settings.overhead_reserve_ms, per_try_ms)

    def explain_route(
        self,
        match: Match,
        hint: str | None,
        timeout_ms: int | None,
        scope: RouteScope | None = None,
    ) -> dict[str, Any]:
        """The ``/v1/route`` answer (:func:`agent_reach.gateway.explain.explain_route`)."""
        return explain.explain_route(self, match, hint, timeout_ms, scope)

    def diagnostics(self) -> dict[str, Any]:
        """The ``/v1/diagnostics`` answer (:func:`agent_reach.gateway.explain.diagnostics`)."""
        return explain.diagnostics(self)

    # --- what deliveries teach -------------------------------------------------------------

    def attempt_started(self, endpoint_id: str) -> EndpointStats:
        """Count an attempt in flight; returns the endpoint's stats."""
        stats = self.stats.get(endpoint_id)
        if stats is None:
            stats = self.stats[endpoint_id] = EndpointStats()
        self.slots.consume(endpoint_id)  # the slot acquire held for it, if any, is its own now
        stats.inflight += 1
        return stats

    def attempt_cancelled(
        self, endpoint_id: str, stats: EndpointStats, latency_ms: float = 0.0
    ) -> None:
        """An attempt ended without an outcome (a hedge race was decided, or the request was
        cancelled): its slot is free. It had not answered after ``latency_ms``, a lower bound
        of its latency: its load-aware cost learns that (never lowered by it), and one past the
        slow threshold is a latency sample, as a timeout's is (a mean of lower bounds over the
        threshold is over it: an endpoint that keeps losing hedge races by seconds is seen
        slow, not hidden by the hedges that win)."""
        stats.inflight -= 1
        if latency_ms > 0.0 and self.stats.get(endpoint_id) is stats:
            now = self.now()
            t = self.thresholds
            if latency_ms < t.slow_threshold_ms:
                stats.at_least(latency_ms, now)
            else:
                was_slow = stats.is_slow(now, t)
                # the cost as a lower bound moves it: raised to it, never blended down toward it
                cost = stats.cost_ms(now)
                stats.observe(latency_ms, now, answered=False, penalty_ms=cost, t=t)
                if was_slow != stats.is_slow(now, t):
                    record = self.registry.get(endpoint_id)
                    if record is not None:
                        self._replace_member(endpoint_id, record.capabilities)  # offers too
                        return
        self._offer(endpoint_id)

    def attempt_cut_short(self, endpoint_id: str, stats: EndpointStats, latency_ms: float) -> None:
        """An attempt that timed out with less time than its endpoint usually takes (its
        p95): the caller's deadline cut it short, which says nothing of the endpoint's health
        (no sample, no penalty, no strike: a hedge sent with 95 ms left penalized an endpoint
        that answers in 200 ms). Its load-aware cost learns it took at least that long."""
        stats.inflight -= 1
        if self.stats.get(endpoint_id) is stats:
            stats.at_least(latency_ms, self.now())
        self._offer(endpoint_id)

    def attempt_finished(
        self,
        endpoint_id: str,
        stats: EndpointStats,
        outcome: Outcome,
        latency_ms: float,
        *,
        reached: bool,
        eject: bool,
        blameless: bool = False,
    ) -> None:
        """Learn from one attempt: latency samples, cost, passive ejection, recovery; and
        offer its slot to the requests waiting for one. A ``blameless`` attempt (nothing went
        out, the gateway's link or the request at fault) teaches nothing."""
        stats.inflight -= 1
        if blameless or self.stats.get(endpoint_id) is not stats:
            self._offer(endpoint_id)
            return  # its books as they were; or deregistered or replaced meanwhile
        now = self.now()
        t = self.thresholds
        was_slow = stats.is_slow(now, t)
        was_recovering = stats.recovering
        was_ejected = stats.ejected_at is not None
        answered = outcome in (Outcome.OK, Outcome.AGENT_ERROR)
        if reached and outcome is not Outcome.CONNECT_ERROR:
            penalty = 0.0 if answered else FAILURE_PENALTY_MS
            stats.observe(
                latency_ms,
                now,
                answered=outcome is not Outcome.TIMEOUT,
                penalty_ms=penalty,
                t=t,
            )
        else:
            stats.penalize(FAILURE_PENALTY_MS, now)
        if eject:
            stats.eject(now)
            log(
                logging.WARNING,
                "health.ejected",
                endpoint_id=endpoint_id,
                outcome=outcome.value,
                probe_in_s=round(stats.probe_at - now, 3),
            )
        elif answered:
            if was_recovering:
                stats.recover(latency_ms, now)  # an answer (a probe's): back in full
                if was_ejected:
                    log(logging.INFO, "health.recovered", endpoint_id=endpoint_id)
        else:
            stats.fail(now)
        changed = eject or was_recovering or stats.recovering
        if changed or was_slow != stats.is_slow(now, t):
            record = self.registry.get(endpoint_id)
            if record is not None:
                self._replace_member(endpoint_id, record.capabilities)  # offers the slot too
                return
        self._offer(endpoint_id)
