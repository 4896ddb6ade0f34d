"""Several gateways sharing one registry: in which order to try them, and which failures allow
trying the next one. Used by the client (:mod:`.client`) and the heartbeat line (:mod:`._beat`).

Invariants of :class:`GatewayRing`:

- :meth:`~GatewayRing.order` holds every gateway exactly once: a gateway that failed recently is
  tried last, never dropped, since it is still worth a try when all the others fail too.
- The order starts from the current gateway, the last one that worked (sticky), and goes round
  in the order the gateways were given; so calls stay on one gateway while it works, and move
  on together when it fails.
- A failure is remembered for ``cooloff_s`` seconds; the oldest failures are retried first.
- No clock reads: the caller passes ``now`` (monotonic seconds).

Which failures allow trying the next gateway (:func:`never_sent`): only those where the
request cannot have reached the gateway, because the connection could not be made (refused,
DNS, no route, TLS handshake, connect timeout). A connection lost after the request was written
(reset, closed, read timeout) is ambiguous: the gateway may have acted on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

__all__ = ["COOLOFF_S", "GatewayRing", "describe", "never_sent"]

COOLOFF_S = 5.0


class GatewayRing:
    """The gateways of one client or agent, the current one, and the ones that failed lately."""

    def __init__(self, urls: Sequence[str], *, cooloff_s: float = COOLOFF_S) -> None:
        if not urls:
            raise ValueError("at least one gateway URL is needed")
        self.urls = tuple(urls)
        self.cooloff_s = cooloff_s
        self._current = 0
        self._failed_at: dict[str, float] = {}

    @property
    def current(self) -> str:
        """The last gateway that worked (the first one given, before any call)."""
        return self.urls[self._current]

    def order(self, now: float) -> list[str]:
        """Every gateway once, in the order to try them now: from the current one round the
        ring, those that did not fail in the last ``cooloff_s`` seconds first, then the others,
        the oldest failure first."""
        ring = self.urls[self._current :] + self.urls[: self._current]
        cooling = [url for url in ring if self._cooling(url, now)]
        cooling.sort(key=self._failed_at.__getitem__)
        return [url for url in ring if url not in cooling] + cooling

    def failed(self, url: str, now: float) -> None:
        """``url`` could not be reached (or lost the connection) at ``now``."""
        self._failed_at[url] = now

    def worked(self, url: str) -> None:
        """``url`` answered: it becomes the current gateway, and its failure is forgotten."""
        self._current = self.urls.index(url)
        self._failed_at.pop(url, None)

    def _cooling(self, url: str, now: float) -> bool:
        failed_at = self._failed_at.get(url)
        return failed_at is not None and now - failed_at < self.cooloff_s


def never_sent(exc: BaseException) -> bool:
    """Whether ``exc``, raised by an aiohttp request, means that nothing reached the gateway:
    the connection could not be made (refused, DNS, unreachable, TLS, connect timeout)."""
    return isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for logs and error details."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
