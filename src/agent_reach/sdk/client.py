"""The client SDK: reach agents through a gateway from Python, async inside, sync facade outside.

``ReachClient`` speaks the wire contract over one pooled aiohttp session. Each call has exactly
one timeout, derived from what the call is: a send waits for the caller's own deadline
(``timeout_ms``) plus a small allowance for the network, because the gateway answers within that
deadline whatever the agents do; nothing else is stacked on top (no client retries of a send: the
gateway already retries, fails over and budgets retries, and a second layer would multiply the
load in an outage). Every error answer becomes the typed error of its contract code
(:func:`agent_reach.errors.error_from_answer`), carrying ``trace_id``, ``msg_id`` and ``attempts``;
a gateway that cannot be reached is :class:`~agent_reach.errors.GatewayUnavailable`.

Given several gateways (which share one registry), a call that cannot reach one is made through
the next, within the same timeout (:mod:`._failover` says in which order). The one exception to
"no client retries": a send whose connection could not even be made, so that no gateway has seen
it; it goes to the next gateway with the same ``msg_id`` and what is left of its deadline.

Given ``nats://`` gateway URLs, the calls go over NATS instead (:mod:`._natsgateway`, imported
only then, so that the SDK needs nats-py only for them): register, heartbeat, deregister and
send; every other call is refused with a ConfigError, before anything is sent.

Bodies and answers are the structs of :mod:`agent_reach.wire` (built and parsed in
:mod:`._wire`). ``SyncReachClient`` (:mod:`.sync`, re-exported here) is the blocking facade:
there is one implementation of every call, the async one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar, cast
from urllib.parse import quote

import msgspec

from agent_reach.clock import Clock
from agent_reach.errors import (
    AgentReachError,
    ConfigError,
    DeadlineExceeded,
    EndpointNotRegistered,
    GatewayUnavailable,
    TraceNotFound,
)
from agent_reach.sdk._credentials import Credentials
from agent_reach.sdk._failover import (
    CONNECT_TIMEOUT_S,
    COOLOFF_S,
    MAX_ANSWER_BYTES,
    Failover,
    GatewayPool,
    GatewayRing,
    log_failover,
    unusable,
)
from agent_reach.sdk._wire import (
    DEFAULT_TIMEOUT_MS,
    EMPTY,
    NETWORK_ALLOWANCE_S,
    Priority,
    error_of,
    parse,
    register_body,
    send_body,
    token_request,
    traceparent_header,
)
from agent_reach.sdk.sync import SyncReachClient
from agent_reach.settings import gateway_urls, nats_gateway
from agent_reach.wire.answers import (
    AgentInfo,
    Attempt,
    Candidate,
    HeartbeatAnswer,
    IssuedToken,
    Ok,
    Registration,
    Reply,
    RouteExplanation,
    Trace,
)
from agent_reach.wire.bodies import AGENTS_MAX_LIMIT, AgentsPage, EndpointIdBody, SendBody
from agent_reach.wire.ids import new_id

if TYPE_CHECKING:
    from agent_reach.sdk._natsgateway import NatsGatewayPool

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "EMPTY",
    "NETWORK_ALLOWANCE_S",
    "AgentInfo",
    "Attempt",
    "Candidate",
    "Failover",
    "HeartbeatAnswer",
    "IssuedToken",
    "Priority",
    "ReachClient",
    "Registration",
    "Reply",
    "RouteExplanation",
    "SyncReachClient",
    "Trace",
]

T = TypeVar("T")
_DOT_SEGMENTS = ("", ".", "..")  # path segments a URL resolves away: never a name or an id


class ReachClient:
    """Async client of one gateway, or of several that share a registry.
    Use as ``async with ReachClient() as client: ...``.

    ``gateway``: one URL, a comma-separated list or a sequence of URLs (default
    ``$AGENT_REACH_GATEWAY``, same forms, or ``http://127.0.0.1:7700``). With several, a call
    that cannot reach the current one goes to the next (module docstring), a gateway that
    failed is tried last for ``cooloff_s`` seconds, making a connection may take at most
    ``connect_timeout_s`` (but to the last gateway left, which may take the rest of the call's
    time), and each move is handed to ``on_failover`` (default: a ``client.gateway_failover``
    log line). An answer is read up to ``max_answer_bytes`` (256 MiB; never decompressed): past
    it, GatewayUnavailable. ``sender`` goes on every send that names none; ``timeout_s`` bounds
    each call that is not a send, across the gateways tried (register, heartbeat and deregister
    take a bound of their own too); ``headers`` go on every request.

    Over NATS (``nats://[USER:PASSWORD@]HOST:PORT[/PREFIX]``, docs/client.md): several URLs are
    the servers of one NATS system, the gateways serving PREFIX share the requests (no
    failover here: ``cooloff_s``, ``on_failover`` and ``max_connections`` have no use), and
    ``connect_timeout_s`` bounds the first connection to NATS. Only register, heartbeat,
    deregister and send are served; other calls raise ConfigError. Needs nats-py
    (``pip install 'agent-reach-gateway[nats]'``).

    ``token`` (token mode, docs/security.md): a string, or a function giving the current one;
    default ``$AGENT_REACH_TOKEN``, if set. Given a string (an agent without the agent SDK,
    holding its enrollment token), the client keeps the endpoint token of each registration it
    makes and the renewals its heartbeats bring (:meth:`endpoint_token`): the registrations,
    heartbeats and deregistration of that id, and sends with that id as ``sender``, present it.
    One found refused (401/403) is dropped: the next registration presents the client's own
    token again (:mod:`._credentials`).
    """

    def __init__(
        self,
        gateway: str | Sequence[str] | None = None,
        *,
        sender: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        cooloff_s: float = COOLOFF_S,
        clock: Clock | None = None,
        token: str | Callable[[], str | None] | None = None,
        on_failover: Callable[[Failover], None] | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self._tokens = Credentials(token)
        urls = gateway_urls(gateway)
        self._gateways: GatewayPool | NatsGatewayPool
        if nats_gateway(urls) is None:
            self._gateways = GatewayPool(
                GatewayRing(urls, cooloff_s=cooloff_s),
                headers=headers,
                max_connections=max_connections,
                connect_timeout_s=connect_timeout_s,
                clock=clock,
                token=self._tokens.own,
                on_failover=on_failover or log_failover,
                max_answer_bytes=max_answer_bytes,
            )
        else:  # the servers of one NATS system, and the gateways' prefix
            self._gateways = _over_nats(
                urls,
                headers=headers,
                connect_timeout_s=connect_timeout_s,
                clock=clock,
                token=self._tokens.own,
            )
        self.sender = sender
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_s

    @property
    def gateway(self) -> str:
        """The current gateway: the last one that answered (the first given, before any).
        Over NATS: the URL (password hidden) of the NATS server the client is connected to."""
        pool = self._gateways
        return pool.ring.current if isinstance(pool, GatewayPool) else pool.current

    @property
    def gateways(self) -> tuple[str, ...]:
        """Every gateway this client may use, in the order given (over NATS: the URLs of the
        NATS servers given)."""
        pool = self._gateways
        return pool.ring.urls if isinstance(pool, GatewayPool) else pool.urls

    @property
    def connect_timeout_s(self) -> float:
        """With several gateways: how long making a connection may take before the next
        gateway is tried (may be changed between calls). Over NATS: how long the first
        connection to NATS may take (read when it is made)."""
        return self._gateways.connect_timeout_s

    @connect_timeout_s.setter
    def connect_timeout_s(self, seconds: float) -> None:
        self._gateways.connect_timeout_s = seconds

    def endpoint_token(self, endpoint_id: str) -> str | None:
        """Token mode: the endpoint token this client holds for ``endpoint_id`` (from its
        registration through this client, or the last renewal), else None."""
        return self._tokens.endpoint_token(endpoint_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        await self._gateways.close()

    async def _json(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        resend: bool = True,
        as_endpoint: str | None = None,
        timeout_s: float | None = None,
    ) -> T:
        bound = self.timeout_s if timeout_s is None else timeout_s
        presented = self._tokens.as_endpoint(as_endpoint)
        status, answer, headers, url = await self._gateways.call(
            method,
            path,
            late=self._late(bound),
            body=body,
            params=params,
            timeout_s=bound,
            resend=resend,
            headers=presented,
        )
        if status != 200:
            if status in (401, 403) and as_endpoint is not None and presented is not None:
                self._tokens.refused(as_endpoint, presented)
            raise error_of(status, answer, headers)
        return parse(answer, kind, status, f"the answer of the gateway at {url} to {method} {path}")

    @staticmethod
    def _late(bound_s: float) -> Callable[[str], GatewayUnavailable]:
        """The error of a call that ran out of its ``bound_s`` seconds."""
        return lambda what: GatewayUnavailable(f"{what} within {bound_s} s")

    async def send(
        self,
        intent: str | None,
        payload: Any = EMPTY,
        *,
        intent_text: str | None = None,
        fallback: bool = True,
        recipient_hint: str | None = None,
        timeout_ms: int | None = None,
        priority: Priority = "normal",
        trace_id: str | None = None,
        msg_id: str | None = None,
        sender: str | None = None,
        traceparent: str | None = None,
    ) -> Reply:
        """Reach the agent that serves ``intent``; return its answer or raise a typed error.

        ``intent_text`` is what the caller wants in words (any language): with it, ``intent``
        may be None, and the gateway's fallback matcher picks the tag when no agent declares
        ``intent`` exactly or by alias (``fallback=False`` forbids that). ``Reply.match`` says
        how the tag was found; a ``NoCapableAgent`` carries the nearest tags as
        ``suggestions``.

        Raises the :class:`~agent_reach.errors.ReachError` of the answer's code
        (``NoCapableAgent``, ``DeadlineExceeded``, ``AllAttemptsFailed``, ...), which carries
        ``trace_id``, ``msg_id`` and ``attempts``; ``InvalidRequest`` for a request the gateway
        refuses; ``GatewayUnavailable`` (with ``msg_id`` and ``trace_id``) when no gateway can
        be reached. ``msg_id`` and ``trace_id`` are generated here when not given, so even a
        lost answer can be traced. ``traceparent`` (W3C) is sent as that header; by default, the
        one of the traced request this send is made in (an agent's handler), if any.

        With several gateways, a send goes to the next one only when its connection could not
        be made (nothing was sent): with the same ``msg_id`` and ``trace_id``, and what is left
        of ``timeout_ms``. Once the request may have reached a gateway (connection lost after
        sending, or no answer), it is never sent through another.
        """
        deadline_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        ids = {"msg_id": msg_id or new_id("msg"), "trace_id": trace_id or new_id("trace")}
        body = send_body(
            intent,
            payload,
            intent_text=intent_text,
            fallback=fallback,
            msg_id=ids["msg_id"],
            trace_id=ids["trace_id"],
            sender=sender or self.sender,
            recipient_hint=recipient_hint,
            priority=priority,
            timeout_ms=deadline_ms,
        )

        def late(what: str) -> DeadlineExceeded:
            return DeadlineExceeded(
                f"{what} within the {deadline_ms} ms deadline"
                f" (+{NETWORK_ALLOWANCE_S:g} s for the network)",
                **ids,
                attempts=[],
            )

        def retry_body(spent_s: float) -> SendBody | None:
            # one deadline across gateways: the next one gets what is left of it
            left_ms = deadline_ms - math.ceil(spent_s * 1000)
            return msgspec.structs.replace(body, timeout_ms=left_ms) if left_ms >= 1 else None

        try:
            status, answer, headers, _ = await self._gateways.call(
                "POST",
                "/v1/send",
                late=late,
                body=body,
                retry_body=retry_body,
                # one timeout: the caller's deadline, which the gateway keeps, plus the wire
                timeout_s=max(deadline_ms, 0) / 1000 + NETWORK_ALLOWANCE_S,
                resend=False,
                fields=ids,
                headers={
                    **traceparent_header(traceparent),
                    **(self._tokens.as_endpoint(body.sender) or {}),
                },
            )
            if status != 200:
                raise error_of(status, answer, headers)
            return parse(answer, Reply, status, "the gateway's send answer")
        except AgentReachError as err:
            # every failure names the send (an unusable answer too: a proxy's page after the
            # gateway took it), so that the caller can send it again with the same msg_id
            for key, value in ids.items():
                err.fields.setdefault(key, value)
            raise

    async def agents(
        self,
        *,
        intent: str | None = None,
        status: str | Iterable[str] | None = None,
        page_size: int | None = None,
    ) -> list[AgentInfo]:
        """Every registered endpoint, with its derived status and latencies; with ``intent``,
        only those that declare it exactly; with ``status`` (``"healthy"``, or several:
        ``["suspect", "down"]``), only those with one of them.

        Without filters or ``page_size``: one v1 call, the gateway's whole list at one moment
        (in registration order). With any: the gateway's pages are walked, ``page_size``
        agents a call (default and most: 1000), in endpoint_id order (``limit`` and
        ``cursor``, an extension beyond CONTRACT.md v1: docs/api.md); each page is one call
        within ``timeout_s``. An agent registered all along is listed once; one that comes or
        goes during the walk may be missing. A gateway without pages answers its whole list,
        which is filtered here then. InvalidRequest for a filter the gateway refuses.
        """
        statuses = [status] if isinstance(status, str) else list(status or ())
        if intent is None and not statuses and page_size is None:
            listing = await self._json("GET", "/v1/agents", AgentsPage)
            return listing.agents
        params = {"limit": str(AGENTS_MAX_LIMIT if page_size is None else page_size)}
        if intent is not None:
            params["intent"] = intent
        if statuses:
            params["status"] = ",".join(statuses)
        found: list[AgentInfo] = []
        cursor: str | None = None
        while True:
            page = await self._json(
                "GET",
                "/v1/agents",
                AgentsPage,
                params=params if cursor is None else {**params, "cursor": cursor},
            )
            if page.next_cursor is msgspec.UNSET:  # a gateway without pages: every agent
                wanted = {s for given in statuses for s in given.split(",")}
                return [
                    a
                    for a in page.agents
                    if (intent is None or intent in a.capabilities)
                    and (not wanted or a.status in wanted)
                ]
            # pages come in endpoint_id order: one that does not move on is not the gateway's
            if found and page.agents and page.agents[0].endpoint_id <= found[-1].endpoint_id:
                raise unusable("the pages of /v1/agents went back (not in endpoint_id order)", 200)
            found += page.agents
            if page.next_cursor is None or not page.agents:
                return found
            cursor = page.next_cursor

    async def agent(self, endpoint_id: str) -> AgentInfo:
        """One endpoint (``agent://NAME`` or ``NAME``); ``EndpointNotRegistered`` if unknown."""
        name = endpoint_id.removeprefix("agent://")
        if name in _DOT_SEGMENTS:  # the URL would lose them (dot segments): no such name
            raise EndpointNotRegistered(f"{endpoint_id!r} is not registered")
        return await self._json("GET", f"/v1/agents/{quote(name, safe='')}", AgentInfo)

    async def explain(
        self,
        intent: str | None,
        *,
        intent_text: str | None = None,
        fallback: bool = True,
        recipient_hint: str | None = None,
        timeout_ms: int | None = None,
    ) -> RouteExplanation:
        """The route a send of ``intent`` (or ``intent_text``) would take now (a dry run:
        nothing is delivered); ``match`` says how the tag was found.

        Raises the same typed error a send would (``NoCapableAgent``, with ``suggestions``).
        """
        params: dict[str, str] = {}
        if intent is not None:
            params["intent"] = intent
        if intent_text is not None:
            params["intent_text"] = intent_text
        if not fallback:
            params["fallback"] = "false"
        if recipient_hint is not None:
            params["recipient_hint"] = recipient_hint
        if timeout_ms is not None:
            params["timeout_ms"] = str(timeout_ms)
        return await self._json("GET", "/v1/route", RouteExplanation, params=params)

    async def trace(self, trace_id: str) -> Trace:
        """The recorded hops of a recent request; ``TraceNotFound`` when there are none."""
        if trace_id in _DOT_SEGMENTS:  # as for agent(): no such trace id
            raise TraceNotFound(f"no trace {trace_id!r} is kept")
        return await self._json("GET", f"/v1/traces/{quote(trace_id, safe='')}", Trace)

    async def register(
        self,
        endpoint_id: str,
        capabilities: list[str],
        endpoint_url: str,
        description: str = "",
        *,
        timeout_s: float | None = None,
    ) -> Registration:
        """Register (or replace) an endpoint: for agents not written with the agent SDK. In
        token mode the answer's endpoint token becomes this client's token for that id (see the
        class). ``timeout_s``: this call's bound instead of the client's. An ``endpoint_url``
        that no HTTP client could dial raises InvalidRequest before anything is sent."""
        body = register_body(endpoint_id, capabilities, endpoint_url, description)
        answer = await self._json(
            "POST",
            "/v1/register",
            Registration,
            body=body,
            as_endpoint=endpoint_id,
            timeout_s=timeout_s,
        )
        self._tokens.adopt(endpoint_id, answer.token)
        return answer

    async def register_card(
        self,
        endpoint_id: str,
        card_url: str,
        capabilities: list[str] | None = None,
        description: str = "",
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Register an A2A agent by its Agent Card (docs/a2a.md): the gateway fetches it, takes
        its JSON-RPC interface and maps its skills to tags (``capabilities``, when given, win),
        and keeps it alive by fetching it. The answer's ``a2a`` says what was taken from the
        card (``skills``, ``unmapped_skills``, ``card_version``)."""
        body: dict[str, Any] = {"endpoint_id": endpoint_id, "a2a_card_url": card_url}
        if capabilities:
            body["capabilities"] = capabilities
        if description:
            body["description"] = description
        answer = await self._json("POST", "/v1/register", dict, body=body, timeout_s=timeout_s)
        return cast(dict[str, Any], answer)

    async def heartbeat(self, endpoint_id: str, *, timeout_s: float | None = None) -> str:
        """Send one heartbeat; returns the endpoint's status (``EndpointNotRegistered``: register
        again). ``timeout_s``: this call's bound instead of the client's."""
        answer = await self._json(
            "POST",
            "/v1/heartbeat",
            HeartbeatAnswer,
            body=EndpointIdBody(endpoint_id),
            as_endpoint=endpoint_id,
            timeout_s=timeout_s,
        )
        self._tokens.adopt(endpoint_id, answer.token)  # a renewed endpoint token (token mode)
        return answer.status

    async def deregister(self, endpoint_id: str, *, timeout_s: float | None = None) -> None:
        """Remove an endpoint's record (``EndpointNotRegistered`` if unknown). ``timeout_s``:
        this call's bound instead of the client's."""
        # not sent again after a connection lost mid-call: a second gateway would answer 404
        await self._json(
            "POST",
            "/v1/deregister",
            Ok,
            body=EndpointIdBody(endpoint_id),
            resend=False,
            as_endpoint=endpoint_id,
            timeout_s=timeout_s,
        )
        self._tokens.forget(endpoint_id)

    async def issue_token(
        self,
        kind: Literal["enroll", "client"],
        *,
        subject: str | None = None,
        endpoints: Sequence[str] = (),
        intents: Sequence[str] = (),
        ttl_s: float | None = None,
    ) -> IssuedToken:
        """Have the gateway issue an enrollment or client token (needs an operator token).

        ``enroll``: which endpoint ids (``endpoints``, patterns such as ``agent://weather-*``)
        may register with which intents (``intents``, e.g. ``weather.*``). ``client``:
        ``subject`` is the ``agent://NAME`` id its holder sends as.
        """
        body = token_request(
            kind, subject=subject, endpoints=endpoints, intents=intents, ttl_s=ttl_s
        )
        return await self._json("POST", "/v1/tokens", IssuedToken, body=body, resend=False)

    async def healthz(self) -> bool:
        """True when the gateway answers ``/healthz``; GatewayUnavailable when it cannot."""
        answer = await self._json("GET", "/healthz", Ok)
        return answer.ok

    async def get(self, path: str) -> Any:
        """``GET path`` (from the gateway's root, query included): the parsed JSON of a 200, or
        the typed error of the answer. For paths this client has no method for, such as the
        ``/v1/diagnostics`` extension."""
        return await self._json("GET", path, Any)

    async def metrics(self) -> str:
        """The gateway's Prometheus text exposition."""
        status, text, _, url = await self._gateways.call(
            "GET", "/metrics", late=self._late(self.timeout_s), timeout_s=self.timeout_s, text=True
        )
        if status != 200:
            raise GatewayUnavailable(f"{url}/metrics answered HTTP {status}")
        return str(text)


def _over_nats(urls: Sequence[str], **options: Any) -> NatsGatewayPool:
    """The pool of ``nats://`` gateways (nats-py imported only now)."""
    try:
        from agent_reach.sdk._natsgateway import NatsGatewayPool
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "nats":
            raise
        raise ConfigError(
            "a nats:// gateway needs nats-py: pip install 'agent-reach-gateway[nats]'",
            source="gateway",
        ) from None
    return NatsGatewayPool(urls, **options)
