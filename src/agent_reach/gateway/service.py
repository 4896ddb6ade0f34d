"""The gateway's use cases: one method per thing a caller can ask, for every edge alike.

An edge (HTTP, NATS, A2A, MCP; peer gateways come in through HTTP) parses its protocol into a
:class:`Caller` and the wire structs of :mod:`agent_reach.wire.bodies`, calls one method here,
and renders what comes back (a JSON-ready answer) or the error it raises (the tree of
:mod:`agent_reach.errors`, rendered from the edge's own table). Nothing here knows a protocol.

Invariants:
- Every method authenticates its caller first (:meth:`Access.authenticate`): access checks,
  eviction on a policy change, rate limits and audit lines happen here, never in an edge.
- A send binds its trace id once (:data:`~agent_reach.observability.logs.TRACE_ID`), before
  anything else runs: every log line of the request carries it, and every error answer of a
  send carries ``msg_id``, ``trace_id`` and ``attempts``, whatever refused it.
- A refusal changes nothing: the checks run before the registry or a transport is touched.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from agent_reach.auth.tokens import Kind
from agent_reach.core.names import is_domain, is_endpoint_id, qualified
from agent_reach.errors import (
    AgentReachError,
    ConfigError,
    DeadlineExceeded,
    DictionaryError,
    EndpointHeld,
    EndpointNotRegistered,
    Forbidden,
    InvalidRequest,
    LoopDetected,
    NoAvailableAgent,
    Overloaded,
    RegistryFull,
    TraceNotFound,
)
from agent_reach.gateway import explain
from agent_reach.gateway.access import earlier_registration
from agent_reach.gateway.forward import HOPS_HEADER, ORIGIN_HEADER
from agent_reach.gateway.listing import (
    TAG_CHUNK,
    AgentListing,
    Routable,
    describe,
    intents_pieces,
    sorted_in_turns,
)
from agent_reach.gateway.principal import (
    ENDPOINTS,
    OPERATORS,
    PEERS,
    READERS,
    REGISTRANTS,
    SENDERS,
    Principal,
)
from agent_reach.intents.dictionary import strict_refusal
from agent_reach.observability.logs import TRACE_ID, log
from agent_reach.wire.answers import IntentsAnswer, Reply
from agent_reach.wire.bodies import (
    CardRegisterBody,
    EndpointIdBody,
    RegisterBody,
    RouteQuery,
    SendBody,
    TokenRequest,
    TraceQuery,
    agents_query,
    convert,
    decode,
    decode_register,
)
from agent_reach.wire.ids import new_id

if TYPE_CHECKING:
    from agent_reach.gateway.node import Node
    from agent_reach.gateway.router import RouteScope

__all__ = [
    "ANONYMOUS_SENDER",
    "TAG_CHUNK",
    "Caller",
    "Service",
    "delivery_refusal",
    "intents_pieces",
    "with_ids",
]

# the sender of a forwarded request that named none (open mode), as the receiver sees it
ANONYMOUS_SENDER = "agent://anonymous"
_HOPS = re.compile(r"[0-9]{1,3}")  # X-Reach-Hops: a small number, ASCII digits only
MAX_TRACE_DOMAINS = 4  # other domains a trace read fetches events from
TRACE_FETCH_S = 2.0  # how long it waits for each


class Caller(NamedTuple):
    """Who calls, from where, with which credentials: what an edge saw, not yet checked (a
    named tuple: made for every request, at less than half a frozen dataclass's cost).

    ``remote`` is the peer's address; ``authorization`` the credentials as presented
    (``Bearer TOKEN``). ``host`` and ``origin`` are
    what a browser would send (open mode refuses cross-site and rebinding requests; edges
    without browsers leave them None). ``traceparent`` is the W3C header, ``received_at`` the
    monotonic time the request arrived (a deadline counts from it), and ``delivery`` says that
    the request is a gateway's delivery (``X-Reach-Attempt``): an endpoint URL pointing at a
    gateway's own send. ``hops`` and ``reach_origin`` are the ``X-Reach-Hops`` and
    ``X-Reach-Origin`` headers as sent (a forwarded request, federation), checked by the send.
    """

    remote: str = "?"
    authorization: str | None = None
    host: str | None = None
    origin: str | None = None
    traceparent: str | None = None
    received_at: float | None = None
    delivery: bool = False
    # federation: a request forwarded by another domain's gateway (X-Reach-Hops, X-Reach-Origin)
    hops: str | None = None
    reach_origin: str | None = None


class Service:
    """The use cases over one :class:`~agent_reach.gateway.node.Node`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.access = node.access
        self.router = node.router
        self.registry = node.registry
        self.metrics = node.metrics
        self.traces = node.traces
        self.reacher = node.reacher
        self._rereading = asyncio.Lock()  # one reload at a time: the last read is in force
        self.admission = node.admission
        self._overload_logged = -1e9

    # --- open mode's guard, for what is not a use case (static files, metrics) -------------

    def admit(self, caller: Caller) -> None:
        """Open mode: refuse what a web page could send (foreign Origin, rebinding Host)."""
        self.access.check_browser(caller.host, caller.origin, remote=caller.remote)

    def reader(self, caller: Caller, action: str) -> str | None:
        """Admit a caller to an edge that reads and sends on its behalf (``/mcp``): its token's
        kind and subject (``kind:subject``) in token mode, None in open mode (after the browser
        guard). Unauthorized, Forbidden otherwise; each call it makes is judged again."""
        principal = self.access.authenticate(caller, READERS, action)
        claims = principal.claims
        return None if claims is None else f"{claims.kind}:{claims.subject}"

    # --- registration and the heartbeat line -----------------------------------------------

    async def register(
        self, caller: Caller, body: RegisterBody | CardRegisterBody | bytes
    ) -> dict[str, Any]:
        """Register (or replace) an endpoint; counts as a heartbeat. ``body`` may come raw:
        then it is decoded after the caller is authenticated (credentials are judged first)."""
        principal = self.access.authenticate(caller, REGISTRANTS, "register")
        if isinstance(body, bytes):
            body = decode_register(body)
        card = None
        access = self.access
        if isinstance(body, CardRegisterBody):  # an A2A agent by its card (gateway/cards.py)
            # judged and counted before the card is fetched: a refused or limited caller makes
            # the gateway fetch nothing
            access.check_register(principal, body.endpoint_id, body.capabilities or [])
            access.limit_registration(principal, body.endpoint_id)
            body, card = await self.node.cards.read(body)
        refusal = self.node.endpoint_refusal(body.endpoint_url)
        if refusal is not None:
            raise InvalidRequest(f"{refusal} - at `$.endpoint_url`", field="endpoint_url")
        grant = access.check_register(principal, body.endpoint_id, body.capabilities)
        if card is None:
            access.limit_registration(principal, body.endpoint_id)
        unknown = await self._check_tags(body)  # strict: UnknownIntent, nothing registered
        await access.check_endpoint_url(principal, body.endpoint_id, body.endpoint_url)
        try:
            record = await self.router.register(body, owner=grant.owner)
        except EndpointHeld as exc:  # checked by the registry, in one step with the write
            access.denied(principal.who, "register", body.endpoint_id, exc.detail)
            raise
        except RegistryFull as exc:  # --max-endpoints: logged and counted as a denial (503)
            access.denied(principal.who, "register", body.endpoint_id, exc.detail, status=503)
            raise
        self.metrics.registrations.inc()
        cards = self.node.cards
        if card is not None:
            await cards.keep(record.endpoint_id, card)
            log(
                logging.INFO,
                "a2a.card_registered",
                endpoint_id=record.endpoint_id,
                card_url=card.card_url,
                card_version=card.version,
                unmapped=card.unmapped,
            )
        elif record.endpoint_url.startswith("a2a+") or cards.holds(record.endpoint_id):
            # an A2A agent registering itself heartbeats: its card, if kept, is not fetched;
            # an id registered otherwise now leaves its card at once (the keeper's rounds would
            # find it a round on, when they run: a card kept this way, then deregistered, was
            # kept for good while no other A2A agent was registered)
            await cards.forget(record.endpoint_id)
        if unknown:  # warn mode: registered, and said
            self.metrics.unknown_intents.labels("warn").inc()
            log(
                logging.WARNING,
                "intent.unknown",
                endpoint_id=record.endpoint_id,
                tags=list(unknown),
                mode="warn",
            )
        answer = {
            "ok": True,
            "endpoint_id": record.endpoint_id,
            "heartbeat_interval_s": float(self.settings.heartbeat_interval),
            **grant.fields(),
        }
        if card is not None:
            answer["a2a"] = card.shown()
        return answer

    async def _check_tags(self, body: RegisterBody) -> tuple[str, ...]:
        """The registration modes of the dictionary: the tags of ``body`` that are not canonical
        tags of it (an alias is not) in warn mode; none in open mode; in strict mode such tags
        are refused (UnknownIntent with ``intents`` and the nearest known ``suggestions``)."""
        mode = self.settings.effective_intent_mode
        if mode == "open":
            return ()
        dictionary = self.node.dictionary
        unknown = tuple(t for t in dict.fromkeys(body.capabilities) if t not in dictionary)
        if not unknown or mode != "strict":
            return unknown
        self.metrics.unknown_intents.labels("strict").inc()
        log(
            logging.WARNING,
            "intent.unknown",
            endpoint_id=body.endpoint_id,
            tags=list(unknown),
            mode="strict",
            refused=True,
        )
        try:
            near = await self.router.suggest(unknown[0], None)
        except Overloaded:  # the matcher is busy: refused all the same, without its words
            near = []
        raise strict_refusal(dictionary, unknown, near)

    async def heartbeat(self, caller: Caller, body: EndpointIdBody | bytes) -> dict[str, Any]:
        """Note a heartbeat (:meth:`heartbeat_now`, and the eviction it may ask for)."""
        answer = self.heartbeat_now(caller, body)
        return answer if isinstance(answer, dict) else await answer

    def heartbeat_now(
        self, caller: Caller, body: EndpointIdBody | bytes
    ) -> dict[str, Any] | Awaitable[NoReturn]:
        """Note a heartbeat without waiting for anything (the registry's touch is synchronous):
        the answer, so that the edge serves it with no task. In token mode, an id the policy no
        longer lets claim its intents (a reload raced its registration) gets instead the
        eviction to await, which then refuses the heartbeat."""
        principal = self.access.authenticate(caller, ENDPOINTS, "heartbeat")
        if isinstance(body, bytes):
            body = decode(body, EndpointIdBody)
        endpoint_id = body.endpoint_id
        if principal.claims is not None:
            current = self.registry.get(endpoint_id)
            self.access.check_owner(principal, "heartbeat", endpoint_id, current)
            if current is not None:
                allowed, why = self.access.claim_allowed(current)
                if not allowed:
                    return self._evict_beating(principal, endpoint_id, why)
        try:
            health = self.router.heartbeat(endpoint_id)
        except EndpointNotRegistered:
            self.metrics.heartbeats_unknown.inc()
            raise
        self.metrics.heartbeats_ok.inc()
        answer: dict[str, Any] = {
            "ok": True,
            "endpoint_id": endpoint_id,
            "status": health.status.value,
        }
        renewed = self.access.renewal(principal)
        if renewed is not None:
            answer.update(renewed.fields())
        return answer

    async def _evict_beating(self, principal: Principal, endpoint_id: str, why: str) -> NoReturn:
        await self.router.evict(lambda record: (False, why), endpoint_id)
        self.access.deny(principal, "heartbeat", endpoint_id, why)

    async def deregister(self, caller: Caller, body: EndpointIdBody | bytes) -> dict[str, Any]:
        """Remove an endpoint at once (its own endpoint token, or an operator's)."""
        principal = self.access.authenticate(caller, ENDPOINTS | OPERATORS, "deregister")
        if isinstance(body, bytes):
            body = decode(body, EndpointIdBody)
        endpoint_id = body.endpoint_id
        current = self.registry.get(endpoint_id)
        self.access.check_owner(principal, "deregister", endpoint_id, current)
        # an endpoint token removes only its own registration, checked again where the record
        # is written: on Redis, one made since through another gateway may not be in this view
        owner = self.access.own_generation(principal)
        try:
            await self.router.deregister(endpoint_id, owner=owner)
        except EndpointHeld:
            self.access.deny(
                principal, "deregister", endpoint_id, earlier_registration(endpoint_id)
            )
        cards = self.node.cards
        if (current is not None and current.endpoint_url.startswith("a2a+")) or cards.holds(
            endpoint_id
        ):
            await cards.forget(endpoint_id)
        return {"ok": True}

    async def enforce_policy(self) -> list[str]:
        """A new policy applies to the ids registered already: those it no longer lets claim
        their intents are deregistered (they are refused when they register again)."""
        return await self.router.evict(self.access.claim_allowed)

    # --- reading the registry --------------------------------------------------------------

    def agents(self, caller: Caller, query: Mapping[str, str]) -> AgentListing:
        """Every registered endpoint, as the contract's AGENT objects, or one page of them.

        ``query``: the query string's values (``GET /v1/agents``, the MCP tool's arguments;
        read after the caller is authenticated, 422 when they do not parse). The answer is an
        :class:`~agent_reach.gateway.listing.AgentListing`, built a chunk at a time as the edge
        iterates it, so that a big registry never holds the event loop for long: the v1 answer
        (no query), or the page the query asks for (an extension beyond contract v1:
        :func:`~agent_reach.wire.bodies.agents_query`)."""
        self.access.authenticate(caller, READERS, "list agents")
        return AgentListing(self.router, self.node.cards.local, agents_query(query))

    async def intents(self, caller: Caller) -> IntentsAnswer:
        """``GET /v1/intents``: :func:`agent_reach.gateway.explain.intents_listing`."""
        self.access.authenticate(caller, READERS, "list intents")
        return await explain.intents_listing(
            self.router, self.node.dictionary, self.settings.effective_intent_mode
        )

    def agent(self, caller: Caller, name: str) -> dict[str, Any]:
        """One endpoint by NAME (``agent://NAME``); EndpointNotRegistered when unknown."""
        self.access.authenticate(caller, READERS, "read an agent")
        endpoint_id = f"agent://{name}"
        record = self.registry.get(endpoint_id) if is_endpoint_id(endpoint_id) else None
        if record is None:  # a malformed name cannot be registered either
            raise EndpointNotRegistered(f"{endpoint_id!r} is not registered")
        # the same AGENT object as the listing's, ``a2a`` included for a card's agent
        return describe(self.router, self.node.cards.local, record, self.router.now())

    async def reachable_intents(
        self, caller: Caller, first: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The first ``first`` intents some agent can take a request for now (deprecated ones
        left out), in ``GET /v1/intents``'s order (the dictionary's entries, then the other
        registered tags sorted), each as ``{tag, description, routable}``, and how many more
        there are: what the MCP tools' descriptions name. At a big registry this is far less
        than the listing: one judging pass of :meth:`reachable_now` and the smallest of the
        other tags picked, where the listing is 8 MB at 50,000 tags for the edge to read. A
        tag no longer routable when its agents are counted (a moment after the judging) is
        left out, and not counted in the rest: there may be fewer than ``first``."""
        self.access.authenticate(caller, READERS, "list intents")
        live = await self.reachable_now()
        await asyncio.sleep(0)  # the judging's last chunk, then what follows, in turns apart
        dictionary = self.node.dictionary
        known = [e for e in dictionary if e.tag in live and not e.deprecated]
        in_dictionary = sum(e.tag in live for e in dictionary)  # deprecated ones too
        others = len(live) - in_dictionary
        shown = [(e.tag, e.description) for e in known[:first]]
        wanted = max(0, first - len(shown))
        # the smallest of the other tags, without a list of them all (~55,000 at 50,000 agents)
        smallest = heapq.nsmallest(wanted + in_dictionary, live) if wanted else []
        shown += [(tag, "") for tag in smallest if tag not in dictionary][:wanted]
        routable = Routable(self.router)
        items = []
        for tag, about in shown:
            n = (await routable.count(tag))[1]
            if n:  # none since reachable_now: not reachable any more, so not counted either
                items.append({"tag": tag, "description": about, "routable": n})
        return items, len(known) + others - len(shown)

    async def reachable_now(self) -> frozenset[str]:
        """The tags some agent can take a request for now (healthy or degraded): what an edge
        that lists them (the MCP tools' descriptions) watches for changes. No caller: the set
        goes to nobody, only its changes are announced. Judged :data:`JUDGE_CHUNK` endpoints
        at a time (:class:`~agent_reach.gateway.listing.Routable`), the loop serving others
        between (at 50,000 tags the whole takes ~90 ms)."""
        routable = Routable(self.router)
        found = set()
        for tag in list(self.registry.intents()):
            if (await routable.count(tag, any_one=True))[1]:  # one live endpoint is enough
                found.add(tag)
        return frozenset(found)

    async def routable_skills(self) -> AsyncIterator[list[tuple[str, str, list[str]]]]:
        """The tags some agent can take now, each with words for it (the dictionary's
        description and examples, else the first declaring agent's description): the skills of
        the gateway's A2A card, in tag order. No caller: the card is public, as discovery is.
        Judged as :meth:`reachable_now`, sorted in turns, and given :data:`TAG_CHUNK` at a time,
        the loop serving others between (each chunk let go once used: the list of 50,000 let
        go at once held the loop ~7 ms)."""
        dictionary = self.node.dictionary
        registry = self.registry
        tags = await sorted_in_turns(await self.reachable_now())
        for start in range(0, len(tags), TAG_CHUNK):
            out = []
            for tag in tags[start : start + TAG_CHUNK]:
                entry = dictionary.entries.get(tag)
                if entry is not None:
                    out.append((tag, entry.description, list(entry.examples)))
                    continue
                described = ""
                for k, endpoint_id in enumerate(registry.by_intent(tag)):
                    record = registry.get(endpoint_id)
                    if record is not None and record.description:
                        described = record.description
                        break
                    if k == 2:  # the first few declaring agents' words, or none
                        break
                out.append((tag, described, []))
            yield out
            await asyncio.sleep(0)

    async def relay(
        self, caller: Caller, endpoint_id: str, intent: str, method: str, params: dict[str, Any]
    ) -> Any:
        """An A2A call (``GetTask``, ``CancelTask``) to the A2A agent ``endpoint_id`` that owns
        the task, as the caller may send ``intent`` there; the agent's result. Refusals as a
        send's (Forbidden, NoAvailableAgent); AgentError for the agent's own JSON-RPC error."""
        access = self.access
        principal = access.authenticate(caller, SENDERS, "send")
        access.limit(principal)
        access.check_send(principal, None, intent, endpoint_id)
        record = self.registry.get(endpoint_id)
        if record is None:
            raise NoAvailableAgent(f"{endpoint_id}, which owns the task, is not registered")
        if not record.endpoint_url.startswith("a2a+"):
            raise InvalidRequest(f"{endpoint_id} owns no A2A task: it is not an A2A agent")
        # work in delivery like a send: counted against --max-inflight (a review held 60 at an
        # agent through a gateway bounded at 2), refused as a normal-priority send would be
        if not self.admission.admit("normal"):
            self._refuse_overloaded("normal")
        try:
            return await self.reacher.relay(record, method, params, caller.traceparent)
        finally:
            self.admission.done()

    # --- reaching ----------------------------------------------------------------------------

    async def send(
        self, caller: Caller, body: SendBody, *, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """Deliver ``body`` by intent (or to its recipient_hint) within its deadline.

        The trace is opened and its id bound first; any error raised after that carries the
        request's ``msg_id``, ``trace_id`` and the ``attempts`` made.
        """
        reacher = self.reacher
        received_at = caller.received_at
        if received_at is None:
            received_at = reacher.clock.monotonic()
        # read at the end of a stall of the loop: it may have waited all of it in the socket
        received_at = self.router.liveness.arrival(received_at)
        body.msg_id = msg_id = body.msg_id or new_id("msg")
        opened = reacher.open_trace(body, msg_id, caller.traceparent)
        body.trace_id = opened.trace_id
        token = TRACE_ID.set(opened.trace_id)
        admitted = False
        try:
            if caller.delivery:
                raise delivery_refusal()
            access = self.access
            origin = self._origin(caller)
            hint = body.recipient_hint
            if hint is not None and hint.endswith(f"@{self.settings.domain}"):
                # this domain's own endpoint: agent://NAME, judged and routed as such
                body.recipient_hint = hint[: -len(self.settings.domain) - 1]
            principal = access.authenticate(caller, SENDERS if origin is None else PEERS, "send")
            if origin is not None:
                origin = access.check_origin(principal, origin)
                # the sender as the receiving domain's policy sees it: agent://NAME@ORIGIN
                body.sender = qualified(body.sender or ANONYMOUS_SENDER, origin)
                headers = {**(headers or {}), ORIGIN_HEADER: origin}
            elif principal.claims is not None and principal.claims.kind is Kind.PEER:
                raise Forbidden("a peer token forwards requests (X-Reach-Origin); it sends none")
            access.limit(principal)
            if not self.admission.admit(body.priority):
                self._refuse_overloaded(body.priority)
            admitted = True
            scope = None
            if body.intent is not None:  # judged on what was asked first, as in v1
                body.sender, scope = access.check_send(
                    principal, body.sender, body.intent, body.recipient_hint
                )
            elif principal.claims is not None:  # (a send never takes an operator token)
                # words only: the sender is judged before anything is matched or traced
                body.sender = access.sender_of(principal, body.sender, "send", "intent_text")
            admit = None
            if principal.claims is not None:  # token mode: a match to another tag is judged too
                sender, hint = body.sender, body.recipient_hint

                def admit(tag: str) -> tuple[str | None, RouteScope | None]:
                    return access.check_send(principal, sender, tag, hint)

            result = await reacher.send(
                body,
                opened,
                received_at,
                scope,
                admit=admit,
                reachable=access.reachable(principal, self.registry.by_intent),
                extra_headers=headers,
                origin=origin,
            )
        except AgentReachError as exc:
            opened.refused(exc)
            exc.fields.setdefault("msg_id", msg_id)
            exc.fields.setdefault("trace_id", opened.trace_id)
            exc.fields.setdefault("attempts", [])
            raise
        finally:
            if admitted:
                self.admission.done()
            TRACE_ID.reset(token)
        return result

    def _refuse_overloaded(self, priority: str) -> NoReturn:
        """Admission said no: 503 overloaded, counted, logged (at most once a second)."""
        admission = self.admission
        self.metrics.overloaded.labels(priority).inc()
        now = self.node.clock.monotonic()
        if now - self._overload_logged >= 1.0:
            self._overload_logged = now
            log(
                logging.WARNING,
                "reach.overloaded",
                priority=priority,
                in_delivery=admission.inflight,
                max_inflight=admission.max_inflight,
                refused_so_far=admission.refused,
            )
        raise Overloaded(
            f"the gateway has {admission.inflight} requests in delivery; {priority} priority is"
            f" refused from {admission.limit(priority)} (--max-inflight {admission.max_inflight})",
            retry_after_s=1,
        )

    def _origin(self, caller: Caller) -> str | None:
        """The domain a forwarded request comes from (None: not forwarded); LoopDetected for
        one that crossed a boundary already, InvalidRequest for headers that do not parse."""
        if caller.hops is None and caller.reach_origin is None:
            return None
        hops = (caller.hops or "").strip()
        if not _HOPS.fullmatch(hops):
            raise InvalidRequest(
                f"{HOPS_HEADER} must be a number of hops, got {caller.hops!r}", field=HOPS_HEADER
            )
        if int(hops) >= 2:
            raise LoopDetected(
                f"the request crossed {int(hops)} domain boundaries: requests cross one at most"
            )
        origin = (caller.reach_origin or "").strip()
        if not is_domain(origin):
            raise InvalidRequest(
                f"{ORIGIN_HEADER} must name the domain the request comes from, got"
                f" {caller.reach_origin!r}",
                field=ORIGIN_HEADER,
            )
        if origin == self.settings.domain:
            raise LoopDetected(
                f"a request forwarded from domain {origin!r} came back to it: not served again"
            )
        return origin

    async def explain(
        self, caller: Caller, query: RouteQuery | Mapping[str, str]
    ) -> dict[str, Any]:
        """The route a send would take now (``/v1/route``), delivering nothing. ``query`` may
        come as the query string's values (converted after the caller is authenticated)."""
        try:
            access = self.access
            principal = access.authenticate(caller, READERS, "route")
            if not isinstance(query, RouteQuery):
                query = convert(dict(query), RouteQuery)
            hint = query.recipient_hint
            if query.intent is not None:
                access.check_send(principal, None, query.intent, hint, action="route")
            timeout_ms = query.timeout_ms or self.settings.default_timeout_ms
            try:  # the matcher's work is bounded as a send's would be
                async with asyncio.timeout(timeout_ms / 1000.0):
                    match = await self.router.resolve(
                        query.intent,
                        query.intent_text,
                        fallback=query.fallback,
                        hint=hint,
                        reachable=access.reachable(principal, self.registry.by_intent),
                        dry_run=True,
                    )
            except TimeoutError:
                raise DeadlineExceeded(
                    f"the match of the words did not finish within {timeout_ms} ms"
                ) from None
            self.metrics.matches.labels(match.method).inc()
            _sender, scope = access.check_send(principal, None, match.tag, hint, action="route")
            return self.router.explain_route(match, hint, query.timeout_ms, scope)
        except AgentReachError as exc:
            with_ids(exc)
            raise

    # --- traces and operations -----------------------------------------------------------------

    async def trace(
        self, caller: Caller, trace_id: str, sender: str | None = None
    ) -> dict[str, Any]:
        """The recorded events of a recent request; TraceNotFound otherwise (also when the
        caller may not read it: a trace of someone else's request is not confirmed).

        Federation: a request forwarded to other domains has their events merged in, fetched
        from their gateways (each marked with ``from_domain``; one that cannot be fetched
        leaves a ``remote_trace_unavailable`` event saying why). A peer reading the trace gets
        this gateway's events only: those of the requests it forwarded, and of ``sender`` alone
        when the peer names one (``?sender=``: it reads for a sender of its own, who must not
        see another's requests forwarded under the same trace id)."""
        principal = self.access.authenticate(caller, READERS | PEERS, "read a trace")
        reader = self.access.trace_reader(principal, trace_id, sender)
        events = self.traces.get(trace_id, reader)
        if not events:
            if events is not None:
                self.access.trace_refused(principal, trace_id)
            raise TraceNotFound(f"no recent request with trace_id {trace_id!r}")
        membership = self.node.membership
        if membership is not None and (
            principal.claims is None or principal.claims.kind is not Kind.PEER
        ):
            domains = list(
                dict.fromkeys(
                    e["domain"] for e in events if e.get("kind") == "attempt" and e.get("domain")
                )
            )[:MAX_TRACE_DOMAINS]
            if domains:
                limit = self.traces.max_events
                claims = principal.claims
                # a sender reads its own requests' part there too, as here (an operator all)
                mine = (
                    None
                    if claims is None or claims.kind is Kind.OPERATOR
                    else qualified(claims.subject, self.settings.domain)
                )
                fetched = await asyncio.gather(
                    *(
                        membership.fetch_trace(d, trace_id, TRACE_FETCH_S, limit, mine)
                        for d in domains
                    )
                )
                now = self.node.clock.wall()
                for domain, got in zip(domains, fetched, strict=True):
                    if isinstance(got, list):
                        events.extend(
                            {**e, "from_domain": domain} for e in got if isinstance(e, dict)
                        )
                    else:
                        events.append(
                            {
                                "ts": round(now, 6),
                                "kind": "remote_trace_unavailable",
                                "from_domain": domain,
                                "detail": got,
                            }
                        )
                events.sort(key=lambda e: e["ts"] if isinstance(e.get("ts"), int | float) else 0.0)
        return {"trace_id": trace_id, "events": events}

    def federation(self, caller: Caller) -> dict[str, Any]:
        """``GET /v1/federation``: this gateway's domain, its directory, its own summary and
        its peers' with their ages (docs/federation.md)."""
        self.access.authenticate(caller, READERS, "read the federation")
        membership = self.node.membership
        if membership is None:
            return {
                "domain": self.settings.domain,
                "directory": None,
                "summary": None,
                "peers": [],
            }
        return membership.describe()

    def recent_traces(
        self, caller: Caller, query: TraceQuery | Mapping[str, str]
    ) -> dict[str, Any]:
        """The most recent requests, filtered (operators)."""
        self.access.authenticate(caller, OPERATORS, "list traces")
        if not isinstance(query, TraceQuery):
            query = convert(dict(query), TraceQuery)
        found = self.traces.recent(query.intent, query.outcome, query.limit)
        return {"traces": [summary.to_body() for summary in found]}

    def inflight(self, caller: Caller) -> dict[str, Any]:
        """The delivery attempts this gateway process has open now, by endpoint (operators)."""
        self.access.authenticate(caller, OPERATORS, "read deliveries in flight")
        stats = self.router.stats
        counts = {eid: s.inflight for eid, s in stats.items() if s.inflight > 0}
        return {
            "at": round(self.router.clock.wall(), 3),
            "total": sum(counts.values()),
            "endpoints": counts,
        }

    async def diagnostics(self, caller: Caller) -> dict[str, Any]:
        """The settings that decide health and retries, and the intents callers asked that no
        agent declares with the nearest known tags (operators)."""
        self.access.authenticate(caller, OPERATORS, "read diagnostics")
        return await explain.with_suggestions(self.router, self.router.diagnostics())

    def keys(self, caller: Caller) -> dict[str, Any]:
        """The keys (JWKS) tokens are signed with; public. With an endpoint token, also that
        registration's delivery keys (docs/security.md, "Signed deliveries")."""
        return self.access.jwks(caller)

    def issue_token(self, caller: Caller, body: TokenRequest | bytes) -> dict[str, Any]:
        """A new enrollment or client token (operators)."""
        principal = self.access.authenticate(caller, OPERATORS, "issue tokens")
        if isinstance(body, bytes):
            body = decode(body, TokenRequest)
        return self.access.issue(principal, body)

    async def reload(self, caller: Caller) -> dict[str, Any]:
        """Re-read the intent dictionary, the key directory and the policy file (operators;
        anyone in open mode): :meth:`reread`."""
        principal = self.access.authenticate(caller, OPERATORS, "reload")
        self.access.admin(principal, "reload", "intents+keys+policy")
        return await self.reread()

    async def reread(self) -> dict[str, Any]:
        """Re-read what the gateway was started with (``POST /v1/reload``, SIGHUP): the intent
        dictionary, and in token mode the keys and the policy (a changed policy is enforced on
        the ids registered). A bad dictionary is refused first (ConfigError, source
        ``intents``, naming the line) and nothing is reloaded; the old one stays. The file is
        read in a worker thread (a big one takes seconds to check)."""
        async with self._rereading:
            return await self._reread()

    async def _reread(self) -> dict[str, Any]:
        node = self.node
        try:
            dictionary = await asyncio.to_thread(node.read_dictionary)
        except DictionaryError as exc:
            log(
                logging.ERROR,
                "intent.dictionary_refused",
                path=exc.path,
                line=exc.line,
                error=exc.detail,
                entries_in_force=len(node.dictionary),
            )
            raise ConfigError(
                f"the intent dictionary is not reloaded, the old one stays "
                f"({len(node.dictionary)} entries): {exc}",
                source="intents",
                line=exc.line,
                path=exc.path,
            ) from None
        answer = self.access.reload()
        if answer.get("policy_changed"):
            answer["evicted"] = await self.enforce_policy()
        changed = node.use_dictionary(dictionary)
        if self.settings.intents:
            log(
                logging.INFO,
                "intent.dictionary_reloaded",
                path=self.settings.intents,
                entries=len(dictionary),
                changed=changed,
            )
        answer["intents"] = {
            "path": self.settings.intents,
            "entries": len(dictionary),
            "changed": changed,
        }
        return answer

    def health(self) -> dict[str, Any]:
        """``/healthz``: always ok while the gateway serves; with its shared registry away it
        still routes on its last view, and says so."""
        state = self.registry.state()
        registry: dict[str, Any] = {
            "backend": state.backend,
            "available": state.available,
            "detail": state.detail,
        }
        if state.last_sync_age_s is not None:
            registry["last_sync_age_s"] = round(state.last_sync_age_s, 3)
        answer: dict[str, Any] = {"ok": True, "registry": registry}
        nats = self.node.nats
        if nats is not None:  # a gateway that lost NATS still serves its HTTP endpoints
            link = nats.state()
            answer["nats"] = {
                "connected": link.connected,
                "server": link.server,
                "reconnects": link.reconnects,
                "last_error": link.last_error,
                "slow_consumers": link.slow_consumers,
                "unreadable_messages": link.unreadable,
            }
        membership = self.node.membership
        if membership is not None:  # a gateway whose directory is away still serves
            answer["federation"] = {
                "domain": membership.domain,
                "directory_ok": membership.directory_ok,
                "peers": len(membership.peers),
            }
        return answer


def delivery_refusal() -> InvalidRequest:
    """The answer to a gateway's delivery (``X-Reach-Attempt``) sent to a gateway's send: an
    endpoint URL points at ``/v1/send``, and nothing is delivered (no loop)."""
    return InvalidRequest(
        "this request is a gateway's delivery (X-Reach-Attempt): an endpoint_url "
        "points at a gateway's /v1/send, and the gateway will not deliver to itself",
        field="X-Reach-Attempt",
    )


def with_ids(exc: AgentReachError) -> AgentReachError:
    """An error answer of a send or a dry run refused before the request named its ids (a body
    that does not decode, a bad query): new ones, and no attempts."""
    exc.fields.setdefault("msg_id", new_id("msg"))
    exc.fields.setdefault("trace_id", new_id("trace"))
    exc.fields.setdefault("attempts", [])
    return exc
