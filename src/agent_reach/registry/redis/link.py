"""Whether Redis answers, as one gateway last found it, and what follows from that.

Invariants:

- **One transition, one log line.** ``registry.unavailable`` when a call first fails,
  ``registry.recovered`` (with how long) when one first succeeds again; :meth:`Link.state`
  says which holds now (for ``/healthz`` and a metric).
- **Known away, not tried.** While :attr:`Link.available` is false, writes are buffered
  without trying Redis (no caller waits for a timeout); the background loops try it.
- **No purge from a view that may miss heartbeats**: not while Redis is away, not until a
  reconcile has run since, and not for :data:`PURGE_GRACE_S` after that (the other gateways
  write the heartbeats they buffered meanwhile).
"""

from __future__ import annotations

import logging

from agent_reach.observability.logs import log
from agent_reach.registry.base import RegistryState
from agent_reach.settings import redacted

__all__ = ["PURGE_GRACE_S", "Link"]

# no purge for this long after Redis returns: the other gateways write the heartbeats they
# buffered meanwhile (they retry at most RETRY_MAX_S apart)
PURGE_GRACE_S = 10.0


class Link:
    """The state of one gateway's connection to Redis."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.available = True
        self.view_stale = False  # Redis was away and no reconcile has run since
        # the view may have missed changes: reconcile next (cleared by a reconcile before its
        # snapshot, never after: see sync.py)
        self.reconcile_due = True
        self.no_purge_until = 0.0  # liveness time: PURGE_GRACE_S after Redis returned
        self._down_since: float | None = None

    def lost(self, exc: BaseException, now: float) -> None:
        """A call to Redis failed."""
        self.view_stale = True
        self.reconcile_due = True
        if self.available:
            self.available = False
            self._down_since = now
            log(
                logging.WARNING,
                "registry.unavailable",
                url=redacted(self.url),
                error=str(exc),
                note="routing on the last view; writes are buffered",
            )

    def healthy(self, now: float) -> None:
        """A call to Redis succeeded."""
        if not self.available:
            self.available = True
            down_for = None if self._down_since is None else now - self._down_since
            log(
                logging.WARNING,
                "registry.recovered",
                url=redacted(self.url),
                unavailable_s=None if down_for is None else round(down_for, 3),
            )

    def reconciled(self, now: float) -> None:
        """The view was made equal to Redis (as of a snapshot: :attr:`reconcile_due` was
        taken before it, and a request made since stands)."""
        if self.view_stale:
            self.no_purge_until = now + PURGE_GRACE_S
            self.view_stale = False

    def may_purge(self, now: float) -> bool:
        """Whether the view sees every heartbeat (up to the staleness bound)."""
        return not self.view_stale and now >= self.no_purge_until

    def state(self, age_s: float | None) -> RegistryState:
        """The registry's state, with the age of the view's last sync."""
        detail = (
            "redis reachable" if self.available else "redis unreachable: routing on the last view"
        )
        return RegistryState("redis", self.available, detail, age_s)
