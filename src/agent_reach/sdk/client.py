"""The client SDK: reach agents through a gateway from Python, async inside, sync facade outside.

``ReachClient`` speaks the wire contract over one pooled aiohttp session. Each call has exactly
one timeout, derived from what the call is: a send waits for the caller's own deadline
(``timeout_ms``) plus a small allowance for the network, because the gateway answers within that
deadline whatever the agents do; nothing else is stacked on top (no client retries of a send: the
gateway already retries, fails over and budgets retries, and a second layer would multiply the
load in an outage). Every error answer becomes the typed error of its contract code
(:func:`agent_reach.errors.error_from_answer`), carrying ``trace_id``, ``msg_id`` and ``attempts``;
a gateway that cannot be reached is :class:`~agent_reach.errors.GatewayUnavailable`.

``SyncReachClient`` runs one ``ReachClient`` on a private event loop in a daemon thread, so that
scripts, notebooks and worker threads can call it; its methods block. There is one implementation
of every call, the async one.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, Literal, Self, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec

from agent_reach.errors import (
    AgentReachError,
    DeadlineExceeded,
    GatewayUnavailable,
    error_from_answer,
)
from agent_reach.settings import gateway_url

__all__ = [
    "AgentInfo",
    "Attempt",
    "Candidate",
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


class Attempt(msgspec.Struct, frozen=True):
    """One delivery attempt of a send: to which endpoint, how it ended, how long it took."""

    endpoint_id: str
    outcome: str
    latency_ms: float


class Reply(msgspec.Struct, frozen=True):
    """A successful send: the agent's ``result`` and how it was reached."""

    msg_id: str
    trace_id: str
    intent: str
    endpoint_id: str
    result: Any
    attempts: list[Attempt]
    latency_ms: float


class AgentInfo(msgspec.Struct, frozen=True):
    """One registered endpoint as ``GET /v1/agents`` lists it."""

    endpoint_id: str
    capabilities: list[str]
    endpoint_url: str
    status: str
    last_seen_at: float
    description: str = ""
    avg_latency_ms: float | None = None
    p95_latency_ms: float | None = None


class Candidate(msgspec.Struct, frozen=True):
    """One candidate of a route explanation, and why it is (not) eligible."""

    endpoint_id: str
    status: str
    confidence: float
    eligible: bool
    reason: str
    avg_latency_ms: float | None = None
    p95_latency_ms: float | None = None
    chosen: bool = False


class RouteExplanation(msgspec.Struct, frozen=True):
    """The dry run of ``GET /v1/route``: the route a send would take now."""

    intent: str
    chosen: str | None
    candidates: list[Candidate]
    per_try_timeout_ms: float | None = None
    max_retries: int = 0


class Trace(msgspec.Struct, frozen=True):
    """The recorded hops of one request (``GET /v1/traces/TRACE_ID``)."""

    trace_id: str
    events: list[dict[str, Any]]


class Registration(msgspec.Struct, frozen=True):
    """The gateway's answer to a registration: the heartbeat interval to keep."""

    endpoint_id: str
    heartbeat_interval_s: float


def new_id(prefix: str) -> str:
    """A fresh id such as ``trace_5f0c...``: made on the client so every error can name it."""
    return f"{prefix}_{secrets.token_hex(8)}"


class ReachClient:
    """Async client of one gateway. Use as ``async with ReachClient() as client: ...``.

    ``gateway`` defaults to ``$AGENT_REACH_GATEWAY`` or ``http://127.0.0.1:7700``; ``sender`` is
    put on every send that does not name one (an agent reaching others passes its own id);
    ``timeout_s`` bounds the calls that are not sends; ``headers`` go on every request (e.g. an
    ``Authorization`` header).
    """

    def __init__(
        self,
        gateway: str | None = None,
        *,
        sender: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
    ) -> None:
        self.gateway = gateway_url(gateway)
        self.sender = sender
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (idempotent)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                headers=self._headers,
                json_serialize=lambda obj: msgspec.json.encode(obj).decode(),
            )
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One HTTP exchange; (status, parsed JSON, headers) or GatewayUnavailable."""
        data = None if body is None else msgspec.json.encode(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._pool().request(
                method,
                self.gateway + path,
                data=data,
                params=params,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as resp:
                raw = await resp.read()
                status, answer_headers = resp.status, resp.headers
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise GatewayUnavailable(f"cannot reach the gateway at {self.gateway}: {exc}") from exc
        if path == "/metrics":
            return status, raw.decode(errors="replace"), answer_headers
        try:
            return status, msgspec.json.decode(raw), answer_headers
        except msgspec.DecodeError:
            raise GatewayUnavailable(
                f"the gateway at {self.gateway} answered HTTP {status} with a body that is not"
                " JSON",
                http_status=status,
            ) from None

    async def _json(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        body: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> T:
        try:
            status, answer, headers = await self._call(method, path, body=body, params=params)
        except TimeoutError as exc:
            raise GatewayUnavailable(
                f"no answer from the gateway at {self.gateway} within {self.timeout_s} s"
            ) from exc
        if status != 200:
            raise _error(status, answer, headers)
        try:
            return msgspec.convert(answer, kind)
        except msgspec.ValidationError as exc:
            raise GatewayUnavailable(
                f"the gateway's answer to {method} {path} is not the contract's: {exc}"
            ) from exc

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
    ) -> Reply:
        """Reach the agent that serves ``intent``; return its answer or raise a typed error.

        Raises the :class:`~agent_reach.errors.ReachError` of the answer's code
        (``NoCapableAgent``, ``DeadlineExceeded``, ``AllAttemptsFailed``, ...), which carries
        ``trace_id``, ``msg_id`` and ``attempts``; ``InvalidRequest`` for a request the gateway
        refuses; ``GatewayUnavailable`` when the gateway cannot be reached. ``msg_id`` and
        ``trace_id`` are generated here when not given, so even a lost answer can be traced.
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
        try:
            status, answer, headers = await self._call(
                "POST",
                "/v1/send",
                body=body,
                # one timeout: the caller's deadline, which the gateway keeps, plus the wire
                timeout_s=max(deadline_ms, 0) / 1000 + NETWORK_ALLOWANCE_S,
            )
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"no answer from the gateway within the {deadline_ms} ms deadline"
                f" (+{NETWORK_ALLOWANCE_S:g} s for the network)",
                **ids,
                attempts=[],
            ) from exc
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
        """Register (or replace) an endpoint: for agents not written with the agent SDK."""
        body = {
            "endpoint_id": endpoint_id,
            "capabilities": capabilities,
            "endpoint_url": endpoint_url,
            "description": description,
        }
        return await self._json("POST", "/v1/register", Registration, body=body)

    async def heartbeat(self, endpoint_id: str) -> str:
        """Send one heartbeat; returns the endpoint's status (``EndpointNotRegistered``: register
        again)."""
        answer = await self._json(
            "POST", "/v1/heartbeat", _Heartbeat, body={"endpoint_id": endpoint_id}
        )
        return answer.status

    async def deregister(self, endpoint_id: str) -> None:
        """Remove an endpoint's record (``EndpointNotRegistered`` if unknown)."""
        await self._json("POST", "/v1/deregister", _Ok, body={"endpoint_id": endpoint_id})

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
        try:
            status, text, _ = await self._call("GET", "/metrics")
        except TimeoutError as exc:
            raise GatewayUnavailable(f"no answer from {self.gateway}/metrics") from exc
        if status != 200:
            raise GatewayUnavailable(f"{self.gateway}/metrics answered HTTP {status}")
        return str(text)


class _Agents(msgspec.Struct):
    agents: list[AgentInfo]


class _Heartbeat(msgspec.Struct):
    status: str


class _Ok(msgspec.Struct):
    ok: bool = True


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

    def __init__(self, gateway: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agent-reach-client", daemon=True
        )
        self._thread.start()
        self.client = ReachClient(gateway, **options)

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

    def healthz(self) -> bool:
        """:meth:`ReachClient.healthz`, blocking."""
        return self._run(self.client.healthz())

    def metrics(self) -> str:
        """:meth:`ReachClient.metrics`, blocking."""
        return self._run(self.client.metrics())
