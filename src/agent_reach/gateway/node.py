"""The composition root: one gateway node, built once, started, closed in order.

A :class:`Node` builds every part of a gateway from its settings (the registry, the transports
behind their mux, the router, the metrics and traces, access control, the delivery loop and
the service), owns the background loops (the liveness ticker, the purge, the reloader of the
key directory and policy file) and closes everything in the reverse order of starting.

Every edge (the HTTP app, NATS, A2A and MCP; peer gateways come in through the HTTP app)
receives the node and nothing else: it reads ``node.service`` for the use cases and
``node.settings`` for what it needs to listen, and never builds a part of its own
(docs/architecture.md, "Adding an edge").

Invariants:
- Building does no I/O; :meth:`start` loads the intent dictionary, keys and policy (a
  ConfigError stops the start: DictionaryError names the line at fault), opens the registry
  (BackendUnavailable when its store cannot be reached) and the transports, then starts the
  loops. :meth:`close` is idempotent and safe after a failed start.
- The dictionary in force is :attr:`Node.dictionary` (the router reads the same one as
  ``router.dictionary``); a reload builds a new one and swaps both at once, or, refused, leaves
  the old one in force (:meth:`Node.read_dictionary`, :meth:`Node.use_dictionary`).
- Every background loop sleeps through the node's clock, catches per iteration (logged with
  context) and lets cancellation pass.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

from agent_reach.auth.keys import KeyDirectoryError
from agent_reach.auth.tokens import Kind
from agent_reach.clock import Clock, SystemClock
from agent_reach.core.admission import Admission
from agent_reach.core.netguard import AddressGuard
from agent_reach.errors import ConfigError
from agent_reach.federation.member import Membership
from agent_reach.federation.summary import build_summary
from agent_reach.gateway.access import Access
from agent_reach.gateway.cards import CardKeeper
from agent_reach.gateway.delivery import Reacher
from agent_reach.gateway.forward import Forwarder
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.monitor import run_purger, run_ticker
from agent_reach.gateway.router import Router
from agent_reach.gateway.service import Service
from agent_reach.gateway.traces import TraceStore
from agent_reach.intents import matcher_for
from agent_reach.intents.dictionary import EMPTY_DICTIONARY, IntentDictionary, load_dictionary
from agent_reach.observability.logs import log
from agent_reach.registry import RegistryBackend, open_registry
from agent_reach.settings import GatewaySettings
from agent_reach.transport import Transport, TransportMux, http_mux, scheme_of
from agent_reach.transport.a2a import A2aTransport
from agent_reach.transport.http import HttpTransport
from agent_reach.wire.federation import DomainSummary

if TYPE_CHECKING:
    from agent_reach.transport.nats import NatsTransport

__all__ = ["Node"]

START_INDEX_WAIT_S = 10.0  # how long start() waits for the fallback matcher's first index
PEER_TOKEN_TTL_S = 3600.0  # the life of a peer token a gateway signs for itself


class Node:
    """One gateway: its parts, its loops, its lifecycle. Edges receive it.

    ``clock``, ``registry``, ``transport`` and ``rng`` are injectable for tests and
    benchmarks; by default everything comes from ``settings``.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        clock: Clock | None = None,
        registry: RegistryBackend | None = None,
        transport: Transport | None = None,
        rng: random.Random | None = None,
    ) -> None:
        settings.check()
        self.settings = settings
        self.clock = clock = clock or SystemClock()
        self.registry = registry or open_registry(
            settings.registry,
            prefix=settings.registry_prefix,
            max_records=settings.max_endpoints,
            clock=clock,
        )
        # every transport behind one mux, by the endpoint URL's scheme (http, https; nats: too
        # with --nats)
        self.transport: Transport = transport or http_mux(
            max_response_bytes=settings.max_body_bytes,
            address_guard=AddressGuard.from_csv(settings.endpoint_networks),
        )
        self._mux = mux = self.transport if isinstance(self.transport, TransportMux) else None
        self.nats: NatsTransport | None = None
        if settings.nats_servers and mux is not None:
            self.nats = _nats_transport(settings, clock)
            mux.add("nats", self.nats)
        # A2A agents (a2a+http://...: their JSON-RPC interface): SendMessage over the HTTP pool
        http = None if mux is None else mux.transport_for("http://agent")
        if isinstance(http, HttpTransport) and mux is not None:
            a2a = A2aTransport(http)
            mux.add("a2a+http", a2a)
            mux.add("a2a+https", a2a)
        # the fallback matcher of --matcher (None: none); the note says what it fell back to
        matcher, self.matcher_note = matcher_for(settings.matcher)
        self.router = Router(settings, self.registry, clock, rng=rng, matcher=matcher)
        self.metrics = GatewayMetrics(
            self.router.status_counts,
            self.registry.state,
            scan=self.router.scan_for_scrape,
        )
        self.metrics.follow(self.registry)  # drops the series of tags no longer declared
        self.traces = TraceStore(settings.trace_capacity)
        self.metrics.watch(
            records=self.registry.records,
            now=self.router.now,
            heartbeat_interval_s=float(settings.heartbeat_interval),
            trace_count=self.traces.__len__,
        )
        if self.nats is not None:
            self.metrics.watch_nats(self.nats.state)
        self.access = Access(
            settings,
            wall=clock.wall,
            monotonic=clock.monotonic,
            on_denied=lambda action, status: self.metrics.denied.labels(action, status).inc(),
        )
        # admission (--max-inflight): requests in delivery at once, low priority refused first
        self.admission = Admission(settings.max_inflight)
        self.metrics.in_delivery.set_function(lambda: self.admission.inflight)
        slots = self.router.slots  # the waits for a free slot of an endpoint at its bound
        self.metrics.slot_waiting.set_function(lambda: slots.waiting)
        self.metrics.slot_refused.set_function(lambda: slots.refused)
        self.metrics.slot_served.set_function(lambda: slots.served)
        # federation (--directory): this domain's summary out, the others' in, forwarding
        self.membership: Membership | None = None
        forwarder = None
        self._peer_token: tuple[str, float] | None = None  # (token, expires_at) we signed
        if settings.directory:
            membership = self.membership = Membership(
                settings.domain,
                settings.directory,
                settings.summary_interval,
                clock,
                self._summary,
                token=self.peer_token,
                on_peers_changed=self.router.matches.changed,
                on_published=lambda ok: self.metrics.summaries_published.labels(
                    "ok" if ok else "failed"
                ).inc(),
                fetch=http.fetch if isinstance(http, HttpTransport) else None,
            )
            forwarder = Forwarder(
                settings.domain,
                membership.peers,
                self.transport,
                self.router.budget,
                self.metrics,
                clock,
                membership.headers,
            )
            self.router.remote_tags = lambda: membership.peers.tags(clock.monotonic())
        self.reacher = Reacher(
            self.router,
            self.transport,
            self.metrics,
            self.traces,
            wall=clock.wall,
            signer=self.access.tokens,
            forwarder=forwarder,
        )
        # the intent dictionary in force (docs/intents.md): read at start, swapped on reload
        self.dictionary: IntentDictionary = EMPTY_DICTIONARY
        # A2A agents registered by their card, kept alive by fetching it (gateway/cards.py)
        self.cards = CardKeeper(self, http if isinstance(http, HttpTransport) else None)
        self.service = Service(self)
        self._tasks: list[asyncio.Task[None]] = []
        self._watch_bounds(http if isinstance(http, HttpTransport) else None)

    def _watch_bounds(self, http: HttpTransport | None) -> None:
        """``agent_reach_bound_hits_total{bound}``: the bounded queues, caches and tables of
        the gateway's parts that a caller can fill (docs/operations.md, "Bounds"); the edges
        add theirs."""
        watch = self.metrics.watch_bound
        router, traces, access = self.router, self.traces, self.access
        watch("matcher_waiting", lambda: router.matches.refused)
        watch("matcher_cache", lambda: router.matches.evicted)
        watch("exact_matches", lambda: router.exact_matches_cleared)
        watch("unrouted_intents", lambda: router.unrouted.evicted)
        watch("trace_store", lambda: traces.evicted)
        watch("trace_events", lambda: traces.events_dropped)
        watch("principals", lambda: access.principals_cleared)
        if (sends := access.limiter) is not None:
            watch("send_rate_keys", lambda: sends.forgotten)
        if (registrations := access.registrations) is not None:
            watch("register_rate_keys", lambda: registrations.forgotten)
        if http is not None:
            watch("delivery_pool", http.pool_waits)
            watch("url_caches", http.caches_cleared)
        if self.membership is not None:
            peers = self.membership.peers
            watch("federation_peers", lambda: peers.ignored)
        registry = self.registry
        if hasattr(registry, "buffer_refused"):  # a shared registry's writes while it is away
            watch("registry_buffer", lambda: registry.buffer_refused)

    def endpoint_refusal(self, url: str) -> str | None:
        """Why no transport of this node delivers to ``url`` (None: one does); registration
        refuses such a URL with 422."""
        mux = self._mux
        if mux is None:
            return None  # an injected transport (tests, benchmarks) takes what it is given
        if not mux.supports(url):
            scheme = scheme_of(url)
            hint = " (start the gateway with --nats)" if scheme == "nats" else ""
            return f"no transport of this gateway delivers to {scheme}: URLs{hint}"
        if self.nats is not None and scheme_of(url) == "nats":
            return self.nats.refusal(url)
        return None

    def _summary(self, gateway_url: str) -> DomainSummary:
        """This domain's summary now (federation), counted from the router's tiers."""
        router = self.router
        return build_summary(
            self.settings.domain,
            gateway_url,
            self.clock.wall(),
            list(self.registry.intents()),
            router.tiers_of,
            router.stats,
        )

    def peer_token(self) -> str | None:
        """Token mode: what this gateway presents to the directory and to other domains:
        --peer-token, else a peer token for --domain signed with its own keys (renewed once
        half of its life is gone). None in open mode."""
        settings = self.settings
        if settings.peer_token:
            return settings.peer_token
        tokens = self.access.tokens
        if tokens is None:
            return None
        now = self.clock.wall()
        held = self._peer_token
        if held is None or held[1] - now < PEER_TOKEN_TTL_S / 2:
            try:
                held = self._peer_token = tokens.issue(Kind.PEER, settings.domain, PEER_TOKEN_TTL_S)
            except KeyDirectoryError as exc:  # every key retired: present none, say why
                log(logging.ERROR, "federation.peer_token_failed", error=exc.detail)
                return None
        return held[0]

    def read_dictionary(self) -> IntentDictionary:
        """The dictionary of ``--intents``, read and checked now (the empty one without the
        flag); DictionaryError naming the line at fault. Changes nothing."""
        path = self.settings.intents
        return EMPTY_DICTIONARY if not path else load_dictionary(path)

    def use_dictionary(self, dictionary: IntentDictionary) -> bool:
        """Put ``dictionary`` in force (the node's and the router's, at once); a changed one
        has the fallback index rebuilt (its tags and texts). Whether it changed."""
        changed = dictionary != self.dictionary
        self.dictionary = dictionary
        if changed or self.router.dictionary is not dictionary:
            self.router.dictionary = dictionary  # the router rebuilds its index for it
        return changed

    async def start(self) -> None:
        """Load the dictionary, keys and policy, open the registry and the transports, start
        the loops."""
        # DictionaryError: the gateway does not start (read off the loop: a big file takes
        # seconds to check)
        dictionary = await asyncio.to_thread(self.read_dictionary)
        self.use_dictionary(dictionary)
        if self.settings.intents:
            log(
                logging.INFO,
                "intent.dictionary_loaded",
                path=self.settings.intents,
                entries=len(dictionary),
                aliases=len(dictionary.aliases),
                mode=self.settings.effective_intent_mode,
            )
        self.access.load()
        self.cards.load()  # --a2a-card-keys: a bad file stops the start
        await self.registry.start()
        await self.transport.start()
        # the first index of the fallback matcher: the dictionary's tags and the registry's
        method = self.router.matches.method
        fell_back = self.settings.matcher == "semantic" and method != "semantic"
        log(
            logging.WARNING if fell_back else logging.INFO,
            "intent.matcher",
            asked=self.settings.matcher,
            matcher=method or "none",
            note=self.matcher_note,
        )
        # the first index before the gateway listens (words sent at once find the tags), for
        # START_INDEX_WAIT_S at most: a big registry's first build goes on in the background.
        # wait() starts it unless a change already did (use_dictionary() above, through the
        # router's dictionary setter, and the registry's start call changed(); one more would
        # only add a build a churn gap later)
        if not await self.router.matches.wait(START_INDEX_WAIT_S):
            log(logging.WARNING, "intent.index_pending", waited_s=START_INDEX_WAIT_S)
        self._tasks = [
            asyncio.create_task(run_ticker(self.router, self.metrics), name="agent-reach-ticker"),
            asyncio.create_task(run_purger(self.router), name="agent-reach-purger"),
            asyncio.create_task(self.cards.run(), name="agent-reach-cards"),
        ]
        if not self.access.open:
            self._tasks.append(
                asyncio.create_task(self._run_reloader(), name="agent-reach-reloader")
            )
        if self.membership is not None:
            await self.membership.start()
            self._tasks.append(
                asyncio.create_task(self.membership.run(), name="agent-reach-federation")
            )

    async def _run_reloader(self) -> None:
        """Poll the key directory and the policy file; enforce a changed policy on the ids
        registered already."""
        while True:
            await self.clock.sleep(self.settings.reload_interval)
            try:
                if self.access.poll():
                    await self.service.enforce_policy()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the loop: the next change is still seen
                log(logging.ERROR, "auth.reloader_error", exc_info=True)

    async def close(self) -> None:
        """Stop the loops, then close the transports, the registry (reverse order) and the
        fallback matcher's build task and threads."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.membership is not None:
            await self.membership.close()
        await self.transport.close()  # both idempotent, and safe on a part never started
        await self.registry.close()
        self.router.matches.close()  # the matcher's build task and lookup threads


def _nats_transport(settings: GatewaySettings, clock: Clock) -> NatsTransport:
    try:
        from agent_reach.transport.nats import NatsTransport
    except ImportError as exc:  # the nats extra is not installed
        raise ConfigError(
            "--nats needs nats-py: pip install 'agent-reach-gateway[nats]'", source="nats"
        ) from exc
    return NatsTransport(
        settings.nats_servers,
        max_response_bytes=settings.max_body_bytes,
        reserved=[settings.nats_prefix],
        clock=clock,
    )
