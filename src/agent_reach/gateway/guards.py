"""Guards that hold whatever the mode: what a web page could make an open-mode gateway do, and
where the gateway may be pointed to deliver (SSRF).

Invariants:
- Open mode answers only programs and its own pages: a request whose ``Origin`` is not the
  gateway itself is refused, and, bound to loopback, one whose ``Host`` is not a loopback name
  (DNS rebinding). Token mode needs neither: browsers do not attach bearer tokens by themselves.
- An endpoint URL whose host is, or resolves to, an address the :class:`AddressGuard` refuses is
  refused at registration; a name that does not resolve now is accepted, because the transport
  checks every address again when it connects (:class:`agent_reach.transport.http.GuardedResolver`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from urllib.parse import urlsplit

from agent_reach.core.netguard import AddressGuard, is_ip
from agent_reach.errors import Forbidden
from agent_reach.observability.logs import log
from agent_reach.settings import is_loopback

__all__ = ["RESOLVE_TIMEOUT_S", "BrowserGuard", "endpoint_url_refusal"]

RESOLVE_TIMEOUT_S = 2.0
_REMEMBERED = 64  # (Host, Origin) pairs found good, kept to skip the parsing next time


class BrowserGuard:
    """Open mode's refusal of what a web page in the operator's browser could send.

    Without credentials, any page could POST to a gateway on localhost (a cross-origin request
    carries an ``Origin`` that is not this gateway), or read it after pointing a name of its own
    at 127.0.0.1 (DNS rebinding: the ``Host`` is that name). Programs send neither.
    ``loopback_only``: the gateway is bound to loopback, so only loopback names are its own.
    """

    def __init__(self, loopback_only: bool) -> None:
        self.loopback_only = loopback_only
        self._ok: set[tuple[str | None, str | None]] = set()  # (Host, Origin) pairs that passed

    def check(self, host: str | None, origin: str | None) -> None:
        """Forbidden for a foreign Origin, or a Host that is not a loopback name."""
        pair = (host, origin)
        if pair in self._ok:
            return
        if origin is not None:
            authority = origin.partition("://")[2].split("/", 1)[0].lower()
            if authority != (host or "").lower():
                raise Forbidden(
                    f"cross-origin request from {origin!r} refused: in open mode only programs "
                    "and this gateway's own pages may call it"
                )
        if self.loopback_only and host is not None:
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if not is_loopback(name.strip("[]")):
                raise Forbidden(
                    f"Host {host!r} is not a loopback name: in open mode this gateway answers "
                    "only requests addressed to 127.0.0.1, ::1 or localhost"
                )
        if len(self._ok) < _REMEMBERED:  # remembered only once both checks passed
            self._ok.add(pair)


async def endpoint_url_refusal(guard: AddressGuard, url: str, endpoint_id: str) -> str | None:
    """Why ``url`` may not be an endpoint (None: it may): its host is a refused address or
    name, or resolves (within :data:`RESOLVE_TIMEOUT_S`) to a refused address. A ``nats:``
    subject has no address: the NATS transport judges its subjects."""
    if url.startswith("nats:"):
        return None
    host = urlsplit(url).hostname or ""
    refusal = guard.refusal_for_host(host)
    if refusal is not None or is_ip(host):
        return refusal
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError, UnicodeError) as exc:
        log(
            logging.INFO,
            "register.unresolved_host",
            endpoint_id=endpoint_id,
            host=host,
            error=str(exc),
        )
        return None
    for info in infos:
        refusal = guard.refusal_for_address(str(info[4][0]))
        if refusal is not None:
            return f"{host} resolves to {refusal}"
    return None
