"""One transport over several, picked by the endpoint URL's scheme.

Invariants:
- A :class:`TransportMux` is itself a :class:`~agent_reach.transport.base.Transport`: the
  delivery loop does not know how many transports there are.
- Each transport is started and closed once, however many schemes it serves.
- A URL of a scheme no transport serves is a :class:`Delivery` (``connect_error``, not
  reached, ejected), never an exception: records may come from a gateway built with other
  transports (a shared registry). Registration asks :meth:`TransportMux.supports` first.
"""

from __future__ import annotations

import re
from collections.abc import Coroutine, Mapping
from typing import Any

from agent_reach.core.model import Outcome
from agent_reach.core.netguard import AddressGuard
from agent_reach.errors import ConfigError
from agent_reach.transport.base import Delivery, Transport
from agent_reach.transport.http import HttpTransport

__all__ = ["TransportMux", "http_mux", "scheme_of"]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")  # RFC 3986, lower-cased


def scheme_of(url: str) -> str:
    """The scheme of a URL, lower case: ``http://h/p`` -> ``http``, ``nats:subj`` -> ``nats``;
    ``""`` when the URL has none."""
    head, colon, _ = url.partition(":")
    if not colon:
        return ""
    head = head.lower()
    return head if _SCHEME.fullmatch(head) else ""


class TransportMux:
    """Delivers through the transport registered for each URL's scheme.

    ``TransportMux({"http": t, "https": t})``, or :meth:`add` one pair at a time before
    :meth:`start`. Schemes are matched case-insensitively.
    """

    def __init__(self, transports: Mapping[str, Transport] | None = None) -> None:
        self._by_scheme: dict[str, Transport] = {}
        self._started = False
        for scheme, transport in (transports or {}).items():
            self.add(scheme, transport)

    def add(self, scheme: str, transport: Transport) -> None:
        """Serve ``scheme`` (``"nats"``, no colon) with ``transport``.

        Raises :class:`ConfigError` for a malformed or already served scheme, or once the mux
        is started (a transport added then would never have been started).
        """
        key = scheme.lower()
        if not _SCHEME.fullmatch(key):
            raise ConfigError(f"not a URL scheme: {scheme!r}", source="transport")
        if key in self._by_scheme:
            raise ConfigError(f"{key}: URLs already have a transport", source="transport")
        if self._started:
            raise ConfigError(f"{key}: transports are added before start()", source="transport")
        self._by_scheme[key] = transport

    @property
    def schemes(self) -> frozenset[str]:
        """The schemes served, lower case."""
        return frozenset(self._by_scheme)

    def supports(self, url: str) -> bool:
        """Whether a transport serves this URL's scheme (its other parts are not checked)."""
        return scheme_of(url) in self._by_scheme

    def transport_for(self, url: str) -> Transport | None:
        """The transport that delivers to ``url``, None when no transport serves its scheme."""
        return self._by_scheme.get(scheme_of(url))

    def _distinct(self) -> list[Transport]:
        seen: dict[int, Transport] = {}
        for transport in self._by_scheme.values():
            seen.setdefault(id(transport), transport)
        return list(seen.values())

    async def start(self) -> None:
        """Start every transport held, each once; idempotent."""
        self._started = True
        for transport in self._distinct():
            await transport.start()

    async def close(self) -> None:
        """Close every transport held, each once, even when one fails; idempotent."""
        errors: list[BaseException] = []
        for transport in self._distinct():
            try:
                await transport.close()
            except Exception as exc:  # the others still close; the first failure is raised
                errors.append(exc)
        if errors:
            raise errors[0]

    def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Coroutine[Any, Any, Delivery]:
        """Deliver through the transport of ``url``'s scheme; for a scheme none serves,
        ``connect_error``, not reached, ejected. The transport's own coroutine is what the
        caller awaits (no coroutine of the mux's in between: one frame less to resume)."""
        transport = self._by_scheme.get(scheme_of(url))
        if transport is None:
            return self._unserved(url)
        return transport.deliver(url, body, headers, timeout_s)

    async def _unserved(self, url: str) -> Delivery:
        scheme = scheme_of(url) or "(none)"
        served = ", ".join(sorted(self._by_scheme)) or "nothing"
        return Delivery(
            Outcome.CONNECT_ERROR,
            detail=f"not delivered: no transport for URL scheme {scheme} (served: {served})",
            reached=False,
            eject=True,
        )


def http_mux(
    *, max_response_bytes: int = 1 << 20, address_guard: AddressGuard | None = None
) -> TransportMux:
    """The gateway's transports: ``http`` and ``https`` through one :class:`HttpTransport`.

    Another transport is one more ``mux.add(scheme, transport)`` before ``start()``.
    """
    http = HttpTransport(max_response_bytes=max_response_bytes, address_guard=address_guard)
    return TransportMux({"http": http, "https": http})
