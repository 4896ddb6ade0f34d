"""The client SDK's exchange with gateways over NATS: :class:`NatsGatewayPool`.

It has :class:`~agent_reach.sdk._failover.GatewayPool`'s :meth:`~NatsGatewayPool.call` (same
arguments, same return shape), so :class:`~agent_reach.sdk.client.ReachClient` makes its calls
through either without knowing which. The wire is the gateway's NATS edge (CONTRACT.md,
"NATS transport"): ``POST /v1/register`` is a request to ``PREFIX.v1.register`` (and so for
heartbeat, deregister and send) with the HTTP API's body; the reply's body is the HTTP answer,
its header ``Reach-Status`` the HTTP status (absent: 200); in token mode the bearer token goes
in the ``Authorization`` header.

Invariants:
- Only those four calls, and ``GET /v1/keys`` (``PREFIX.v1.keys``: the JWKS an agent in token
  mode verifies deliveries with), go over NATS; any other (``GET /v1/agents``, ``/metrics``, ``POST
  /v1/tokens``, ...) is refused with :func:`~agent_reach.settings.not_over_nats` (a
  ConfigError) before anything is connected or sent.
- One :class:`~agent_reach.transport.natslink.NatsLink`, made and started on the first call,
  under a lock; its first connect is bounded (``connect_timeout_s``, and what is left of the
  call's time); failing it is GatewayUnavailable, and the next call tries again.
- Every request waits at most what is left of the call's ``timeout_s`` (never nats-py's 0.5 s
  default). Nothing sent (no connection, link down, no responders: no gateway serves the
  subject): GatewayUnavailable. Sent and no answer in time: ``late(...)``, the call's own error
  (it may have been acted on). There is no failover here: the gateways serving one prefix are
  one queue group, and NATS hands each request to one of them.
- No nats-py exception leaves :meth:`NatsGatewayPool.call`: each becomes one of ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import msgspec
from nats import errors as nats_errors

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    ConfigError,
    GatewayUnavailable,
    InvalidRequest,
    PayloadTooLarge,
)
from agent_reach.sdk._failover import CONNECT_TIMEOUT_S, describe, unusable
from agent_reach.settings import NatsGateway, nats_gateway, not_over_nats, redacted
from agent_reach.transport.natslink import LINK_LOST, NatsLink, wire_size
from agent_reach.wire.status import STATUS_HEADER, reach_status

__all__ = ["NatsGatewayPool"]

# the HTTP calls that the gateway serves over NATS, and their operation (subject suffix)
OPERATIONS = {
    ("POST", "/v1/register"): "register",
    ("POST", "/v1/heartbeat"): "heartbeat",
    ("POST", "/v1/deregister"): "deregister",
    ("POST", "/v1/send"): "send",
    ("GET", "/v1/keys"): "keys",  # the JWKS, to verify deliveries with (beyond the contract)
}


class NatsGatewayPool:
    """The NATS side of a client: one link to the NATS system of ``urls`` (gateway URLs
    ``nats://[USER:PASSWORD@]HOST:PORT[/PREFIX]``, as :func:`~agent_reach.settings.gateway_urls`
    gives them), and :meth:`call`, one request to the gateways serving PREFIX.

    ``headers`` go on every request (as NATS headers); ``token`` gives the bearer token of each
    call (token mode), read when it is made. ``connect_timeout_s`` (read when the link is made,
    so it may be changed before the first call) bounds the first connection to NATS, and each
    later try of a server. ConfigError for URLs that are not one NATS system's.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        clock: Clock | None = None,
        token: Callable[[], str | None] | None = None,
        name: str = "agent-reach-client",
    ) -> None:
        target = nats_gateway(urls)
        if target is None:
            raise ConfigError(f"gateways over NATS need nats:// or tls:// URLs, got {urls!r}")
        self.target: NatsGateway = target
        self.urls = tuple(urls)
        self.connect_timeout_s = connect_timeout_s
        self.name = name
        self._headers = dict(headers or {})
        self._token = token
        self._clock = clock or SystemClock()
        self._link: NatsLink | None = None
        self._linking = asyncio.Lock()  # one first connect at a time

    @property
    def current(self) -> str:
        """The gateway URL (password hidden) of the NATS server the link is connected to (the
        first given, before any connection)."""
        nc = self._link.client if self._link is not None else None
        at = nc.connected_url if nc is not None and nc.is_connected else None
        if at is not None:
            for url in self.urls:
                parts = urlsplit(url)
                if (parts.hostname, parts.port or 4222) == (at.hostname, at.port or 4222):
                    return redacted(url)
            # a server the cluster told the link of
            return f"{at.scheme}://{at.hostname}:{at.port or 4222}/{self.target.prefix}"
        return redacted(self.urls[0])

    def where(self) -> str:
        """The NATS servers, passwords hidden."""
        return ",".join(redacted(url) for url in self.target.servers)

    async def close(self) -> None:
        """Close the link (idempotent); a later call makes a new one."""
        async with self._linking:
            link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def call(
        self,
        method: str,
        path: str,
        *,
        late: Callable[[str], AgentReachError],
        timeout_s: float,
        body: Any = None,
        retry_body: Callable[[float], Any] | None = None,
        params: Mapping[str, str] | None = None,
        resend: bool = True,
        text: bool = False,
        fields: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any, Mapping[str, str], str]:
        """One request to the gateways over NATS, within ``timeout_s``:
        :meth:`GatewayPool.call <agent_reach.sdk._failover.GatewayPool.call>`'s arguments and
        answer (status, parsed JSON, headers, the gateway URL).

        ``retry_body`` and ``resend`` have no use here (a request is made once: there is no
        other gateway to go to). Refused before anything is sent, with a ConfigError: any call
        other than register, heartbeat, deregister and send. GatewayUnavailable (with
        ``fields``) when nothing could be sent; ``late(what happened)`` when it was sent and
        no answer came in time.
        """
        operation = OPERATIONS.get((method, path))
        if operation is None or params or text:
            raise not_over_nats(f"{method} {path}")
        extra = dict(fields or {})
        subject = self.target.subject(operation)
        start = self._clock.monotonic()
        link = await self._linked(timeout_s, extra)
        nc = link.client
        if nc is None or not nc.is_connected:
            why = link.last_error or "reconnecting"
            raise GatewayUnavailable(
                f"no connection to NATS at {self.where()} ({why}): {subject} was not sent",
                **extra,
            )
        left = timeout_s - (self._clock.monotonic() - start)
        if left <= 0:
            raise GatewayUnavailable(
                f"connecting to NATS at {self.where()} took the whole {timeout_s:g} s:"
                f" {subject} was not sent",
                **extra,
            )
        data = b"" if body is None else msgspec.json.encode(body)
        sent = self._request_headers(headers)
        size = wire_size(data, sent)  # the server counts the headers too (and would hang up)
        if size > nc.max_payload:
            raise PayloadTooLarge(
                f"request of {size} bytes over the NATS server's max_payload of"
                f" {nc.max_payload}: {subject} was not sent",
                **extra,
            )
        try:
            # nats-py's own timeout bounds the wait for the reply; this one the publish too
            async with asyncio.timeout(left):
                msg = await nc.request(subject, data, timeout=left, headers=sent or None)
        except nats_errors.NoRespondersError:
            raise GatewayUnavailable(
                f"no gateway serves {subject} on NATS (is it started with --nats?)", **extra
            ) from None
        except TimeoutError as exc:  # nats-py's TimeoutError is one too
            raise late(f"no answer over NATS to {subject}") from exc
        except nats_errors.MaxPayloadError:
            raise PayloadTooLarge(
                f"request of {len(data)} bytes over the NATS server's max_payload of"
                f" {nc.max_payload}: {subject} was not sent",
                **extra,
            ) from None
        except (nats_errors.BadSubjectError, nats_errors.BadHeaderError) as exc:
            raise InvalidRequest(f"{subject} was not sent over NATS: {describe(exc)}") from None
        except LINK_LOST as exc:
            raise GatewayUnavailable(
                f"lost the connection to NATS at {self.where()} ({describe(exc)}): {subject}"
                " was not sent",
                **extra,
            ) from exc
        except (OSError, nats_errors.Error) as exc:  # the request may have gone out
            raise GatewayUnavailable(
                f"the NATS request to {subject} failed ({describe(exc)}): it may have been"
                " delivered",
                **extra,
            ) from exc
        return self._answer(subject, msg.data, msg.headers)

    async def _linked(self, timeout_s: float, fields: Mapping[str, Any]) -> NatsLink:
        """The started link: made and started here on the first call (one caller at a time,
        each waiting at most its ``timeout_s``)."""
        link = self._link
        if link is not None and link.started:
            return link
        try:
            async with asyncio.timeout(timeout_s), self._linking:
                link = self._link
                if link is None or not link.started:
                    link = NatsLink(
                        list(self.target.servers),
                        connect_timeout_s=self.connect_timeout_s,
                        name=self.name,
                        clock=self._clock,
                    )
                    await link.start()
                    self._link = link
                return link
        except BackendUnavailable as exc:
            raise GatewayUnavailable(
                f"cannot reach the gateways over NATS: {exc.detail}; nothing was sent", **fields
            ) from exc
        except TimeoutError as exc:
            raise GatewayUnavailable(
                f"cannot reach the gateways over NATS: no connection to {self.where()} within"
                f" {timeout_s:g} s; nothing was sent",
                **fields,
            ) from exc

    def _request_headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        sent = dict(self._headers)
        if self._token is not None and (token := self._token()):
            sent["Authorization"] = f"Bearer {token}"
        if extra:
            sent.update(extra)
        return sent

    def _answer(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None
    ) -> tuple[int, Any, Mapping[str, str], str]:
        got = Headers(headers or {})
        raw = got.get(STATUS_HEADER)
        status = reach_status(raw)
        if status is None:
            raise GatewayUnavailable(
                f"the answer over NATS to {subject} has {STATUS_HEADER} {raw!r}, not an HTTP status"
            )
        try:
            return status, msgspec.json.decode(data), got, self.current
        # RecursionError: JSON nested deeper than the decoder goes (not a DecodeError)
        except (msgspec.DecodeError, RecursionError):
            raise unusable(
                f"the answer over NATS to {subject} ({STATUS_HEADER} {status}) is not JSON",
                status,
            ) from None


class Headers(Mapping[str, str]):
    """A reply's NATS headers, read by name whatever its case (as HTTP headers are)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._by_name = {key.lower(): (key, value) for key, value in headers.items()}

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name
