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

``SyncReachClient`` runs one ``ReachClient`` on a private event loop in a daemon thread, so that
scripts, notebooks and worker threads can call it; its methods block. There is one implementation
of every call, the async one.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, TypeVar
from urllib.parse import quote

import msgspec

from agent_reach.clock import Clock
from agent_reach.errors import (
    AgentReachError,
    DeadlineExceeded,
    GatewayUnavailable,
    error_from_answer,
)
from agent_reach.observability.tracecontext import TRACEPARENT
from agent_reach.sdk._failover import CONNECT_TIMEOUT_S, COOLOFF_S, GatewayPool, GatewayRing
from agent_reach.settings import gateway_token, gateway_urls
from agent_reach.wire.answers import (
    AgentInfo,
    Attempt,
    Candidate,
    IssuedToken,
    Registration,
    Reply,
    RouteExplanation,
    Trace,
)
from agent_reach.wire.ids import new_id

__all__ = [
    "AgentInfo",
    "Attempt",
    "Candidate",
    "IssuedToken",
    "ReachClient",
    "Registration",
    "Reply",
    "RouteExplanation",
    "SyncReachClient",
    "Trace",
]

Priority = Literal["low", "normal", "high"]
T = TypeVar("T")

DEFAULT_TIMEOUT_MS = 8000
# what a send may take beyond the caller's deadline: the gateway's answer on the wire
NETWORK_ALLOWANCE_S = 1.0
EMPTY: Any = msgspec.UNSET  # "no payload given": sent as {} (an explicit None is sent as null)


class ReachClient:
    """Async client of one gateway, or of several that share a registry.
    Use as ``async with ReachClient() as client: ...``.

    ``gateway`` is one URL, a comma-separated list or a sequence of URLs; it defaults to
    ``$AGENT_REACH_GATEWAY`` (same forms) or ``http://127.0.0.1:7700``. With several, a call
    that cannot reach the current gateway goes to the next (see the module docstring), and a
    gateway that failed is tried last for ``cooloff_s`` seconds. ``sender`` is put on every send
    that does not name one (an agent reaching others passes its own id); ``timeout_s`` bounds
    the calls that are not sends, across all the gateways tried; with several gateways, making
    a connection may take ``connect_timeout_s`` at most before the next is tried; ``headers`` go
    on every request. ``token`` is the bearer token of a gateway in token mode
    (docs/security.md): a string, or a function giving the current one (an agent's endpoint
    token, renewed by its heartbeats); it defaults to ``$AGENT_REACH_TOKEN``, if set. A client
    given a string (an agent not written with the agent SDK, holding its enrollment token)
    keeps the endpoint token of each registration it makes, and the renewals its heartbeats
    bring: its heartbeats and deregistration of that id, and its sends with that id as
    ``sender``, present it; everything else presents the client's own token.
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
    ) -> None:
        # a token given as a string (or from the environment) is held here, and replaced by the
        # endpoint token of a registration made through this client, and by its renewals
        self._held: str | None = None
        self._adopts = token is None or isinstance(token, str)
        self._endpoint_tokens: dict[str, str] = {}  # endpoint id -> its endpoint token
        if token is None or isinstance(token, str):
            self._held = gateway_token(token)
            current: Callable[[], str | None] = lambda: self._held  # noqa: E731
        else:
            current = token
        self._gateways = GatewayPool(
            GatewayRing(gateway_urls(gateway), cooloff_s=cooloff_s),
            headers=headers,
            max_connections=max_connections,
            connect_timeout_s=connect_timeout_s,
            clock=clock,
            token=current,
        )
        self.sender = sender
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_s

    @property
    def gateway(self) -> str:
        """The current gateway: the last one that answered (the first given, before any)."""
        return self._gateways.ring.current

    @property
    def gateways(self) -> tuple[str, ...]:
        """Every gateway this client may use, in the order given."""
        return self._gateways.ring.urls

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
    ) -> T:
        status, answer, headers, url = await self._gateways.call(
            method,
            path,
            late=self._late,
            body=body,
            params=params,
            timeout_s=self.timeout_s,
            resend=resend,
            headers=self._as(as_endpoint),
        )
        if status != 200:
            raise _error(status, answer, headers)
        try:
            return msgspec.convert(answer, kind)
        except msgspec.ValidationError as exc:
            raise GatewayUnavailable(
                f"the answer of the gateway at {url} to {method} {path} is not the contract's:"
                f" {exc}"
            ) from exc

    def _late(self, what: str) -> GatewayUnavailable:
        return GatewayUnavailable(f"{what} within {self.timeout_s} s")

    async def send(
        self,
        intent: str,
        payload: Any = EMPTY,
        *,
        recipient_hint: str | None = None,
        timeout_ms: int | None = None,
        priority: Priority = "normal",
        trace_id: str | None = None,
        msg_id: str | None = None,
        sender: str | None = None,
        traceparent: str | None = None,
    ) -> Reply:
        """Reach the agent that serves ``intent``; return its answer or raise a typed error.

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
        body = {
            **ids,
            "intent": intent,
            "payload": {} if payload is EMPTY else payload,
            "priority": priority,
            "timeout_ms": deadline_ms,
            "sender": sender or self.sender,
            "recipient_hint": recipient_hint,
        }

        def late(what: str) -> DeadlineExceeded:
            return DeadlineExceeded(
                f"{what} within the {deadline_ms} ms deadline"
                f" (+{NETWORK_ALLOWANCE_S:g} s for the network)",
                **ids,
                attempts=[],
            )

        def retry_body(spent_s: float) -> dict[str, Any] | None:
            # one deadline across gateways: the next one gets what is left of it
            left_ms = deadline_ms - math.ceil(spent_s * 1000)
            return {**body, "timeout_ms": left_ms} if left_ms >= 1 else None

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
            headers={**(_traceparent(traceparent) or {}), **(self._as(body["sender"]) or {})},
        )
        if status != 200:
            err = _error(status, answer, headers)
            for key, value in ids.items():
                err.fields.setdefault(key, value)
            raise err
        try:
            return msgspec.convert(answer, Reply)
        except msgspec.ValidationError as exc:
            raise GatewayUnavailable(
                f"the gateway's send answer is not the contract's: {exc}"
            ) from exc

    async def agents(self) -> list[AgentInfo]:
        """Every registered endpoint, with its derived status and latencies."""
        listing = await self._json("GET", "/v1/agents", _Agents)
        return listing.agents

    async def agent(self, endpoint_id: str) -> AgentInfo:
        """One endpoint (``agent://NAME`` or ``NAME``); ``EndpointNotRegistered`` if unknown."""
        name = quote(endpoint_id.removeprefix("agent://"), safe="")
        return await self._json("GET", f"/v1/agents/{name}", AgentInfo)

    async def explain(
        self, intent: str, *, recipient_hint: str | None = None, timeout_ms: int | None = None
    ) -> RouteExplanation:
        """The route a send of ``intent`` would take now (a dry run: nothing is delivered).

        Raises the same typed error a send would (``NoCapableAgent``, ...).
        """
        params = {"intent": intent}
        if recipient_hint is not None:
            params["recipient_hint"] = recipient_hint
        if timeout_ms is not None:
            params["timeout_ms"] = str(timeout_ms)
        return await self._json("GET", "/v1/route", RouteExplanation, params=params)

    async def trace(self, trace_id: str) -> Trace:
        """The recorded hops of a recent request; ``TraceNotFound`` when there are none."""
        return await self._json("GET", f"/v1/traces/{quote(trace_id, safe='')}", Trace)

    async def register(
        self,
        endpoint_id: str,
        capabilities: list[str],
        endpoint_url: str,
        description: str = "",
    ) -> Registration:
        """Register (or replace) an endpoint: for agents not written with the agent SDK. In
        token mode the answer's endpoint token becomes this client's token (see the class)."""
        body = {
            "endpoint_id": endpoint_id,
            "capabilities": capabilities,
            "endpoint_url": endpoint_url,
            "description": description,
        }
        answer = await self._json(
            "POST", "/v1/register", Registration, body=body, as_endpoint=endpoint_id
        )
        self._adopt(endpoint_id, answer.token)
        return answer

    def _adopt(self, endpoint_id: str, token: str | None) -> None:
        if token and self._adopts:
            self._endpoint_tokens[endpoint_id] = token

    def _as(self, endpoint_id: str | None) -> dict[str, str] | None:
        """The Authorization of a call made as ``endpoint_id``, when this client holds its
        endpoint token (None: the client's own token)."""
        token = self._endpoint_tokens.get(endpoint_id) if endpoint_id else None
        return {"Authorization": f"Bearer {token}"} if token else None

    async def heartbeat(self, endpoint_id: str) -> str:
        """Send one heartbeat; returns the endpoint's status (``EndpointNotRegistered``: register
        again)."""
        answer = await self._json(
            "POST",
            "/v1/heartbeat",
            _Heartbeat,
            body={"endpoint_id": endpoint_id},
            as_endpoint=endpoint_id,
        )
        self._adopt(endpoint_id, answer.token)  # a renewed endpoint token (token mode)
        return answer.status

    async def deregister(self, endpoint_id: str) -> None:
        """Remove an endpoint's record (``EndpointNotRegistered`` if unknown)."""
        # not sent again after a connection lost mid-call: a second gateway would answer 404
        await self._json(
            "POST",
            "/v1/deregister",
            _Ok,
            body={"endpoint_id": endpoint_id},
            resend=False,
            as_endpoint=endpoint_id,
        )
        self._endpoint_tokens.pop(endpoint_id, None)

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
        body: dict[str, Any] = {
            "kind": kind,
            "endpoints": list(endpoints),
            "intents": list(intents),
        }
        if subject is not None:
            body["subject"] = subject
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return await self._json("POST", "/v1/tokens", IssuedToken, body=body, resend=False)

    async def healthz(self) -> bool:
        """True when the gateway answers ``/healthz``; GatewayUnavailable when it cannot."""
        answer = await self._json("GET", "/healthz", _Ok)
        return answer.ok

    async def get(self, path: str) -> Any:
        """``GET path`` (from the gateway's root, query included): the parsed JSON of a 200, or
        the typed error of the answer. For paths this client has no method for, such as the
        ``/v1/diagnostics`` extension."""
        return await self._json("GET", path, Any)

    async def metrics(self) -> str:
        """The gateway's Prometheus text exposition."""
        status, text, _, url = await self._gateways.call(
            "GET", "/metrics", late=self._late, timeout_s=self.timeout_s, text=True
        )
        if status != 200:
            raise GatewayUnavailable(f"{url}/metrics answered HTTP {status}")
        return str(text)


class _Agents(msgspec.Struct):
    agents: list[AgentInfo]


class _Heartbeat(msgspec.Struct):
    status: str
    token: str | None = None


class _Ok(msgspec.Struct):
    ok: bool = True


def _traceparent(given: str | None) -> dict[str, str] | None:
    value = given or TRACEPARENT.get()
    return {"traceparent": value} if value else None


def _error(status: int, answer: Any, headers: Mapping[str, str]) -> AgentReachError:
    err = error_from_answer(status, answer)
    retry_after = headers.get("Retry-After", "")
    if retry_after.replace(".", "", 1).isdigit():
        err.fields.setdefault("retry_after_s", float(retry_after))
    return err


class SyncReachClient:
    """The blocking facade of :class:`ReachClient`, for scripts and threads.

    It owns a private event loop in a daemon thread; every method submits the async call there and
    waits for it. Safe to share between threads. ``close()`` (or ``with``) stops the loop.
    """

    def __init__(self, gateway: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agent-reach-client", daemon=True
        )
        self._thread.start()
        self.client = ReachClient(gateway, **options)

    @property
    def gateway(self) -> str:
        """:attr:`ReachClient.gateway`: the current gateway."""
        return self.client.gateway

    @property
    def gateways(self) -> tuple[str, ...]:
        """:attr:`ReachClient.gateways`: every gateway, in the order given."""
        return self.client.gateways

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("this SyncReachClient is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the pool and stop the private loop (idempotent)."""
        if not self._thread.is_alive():
            return
        self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def send(self, intent: str, payload: Any = EMPTY, **options: Any) -> Reply:
        """:meth:`ReachClient.send`, blocking."""
        return self._run(self.client.send(intent, payload, **options))

    def agents(self) -> list[AgentInfo]:
        """:meth:`ReachClient.agents`, blocking."""
        return self._run(self.client.agents())

    def agent(self, endpoint_id: str) -> AgentInfo:
        """:meth:`ReachClient.agent`, blocking."""
        return self._run(self.client.agent(endpoint_id))

    def explain(self, intent: str, **options: Any) -> RouteExplanation:
        """:meth:`ReachClient.explain`, blocking."""
        return self._run(self.client.explain(intent, **options))

    def trace(self, trace_id: str) -> Trace:
        """:meth:`ReachClient.trace`, blocking."""
        return self._run(self.client.trace(trace_id))

    def register(
        self, endpoint_id: str, capabilities: list[str], endpoint_url: str, description: str = ""
    ) -> Registration:
        """:meth:`ReachClient.register`, blocking."""
        return self._run(self.client.register(endpoint_id, capabilities, endpoint_url, description))

    def heartbeat(self, endpoint_id: str) -> str:
        """:meth:`ReachClient.heartbeat`, blocking."""
        return self._run(self.client.heartbeat(endpoint_id))

    def deregister(self, endpoint_id: str) -> None:
        """:meth:`ReachClient.deregister`, blocking."""
        self._run(self.client.deregister(endpoint_id))

    def issue_token(self, kind: Literal["enroll", "client"], **options: Any) -> IssuedToken:
        """:meth:`ReachClient.issue_token`, blocking."""
        return self._run(self.client.issue_token(kind, **options))

    def healthz(self) -> bool:
        """:meth:`ReachClient.healthz`, blocking."""
        return self._run(self.client.healthz())

    def metrics(self) -> str:
        """:meth:`ReachClient.metrics`, blocking."""
        return self._run(self.client.metrics())
