"""The shared registry on Redis (``redis://HOST:PORT/DB``): many gateways, one address book.

Where things live (each module's docstring states its invariants):

- :mod:`.registry`: :class:`RedisRegistry`, the backend (lifecycle, the view, the writes);
- :mod:`.store`: every Redis call, the key layout, Redis's clock and error translation;
- :mod:`.scripts`: the Lua scripts that write (atomic, Redis time, bounded by the live ids);
- :mod:`.sync`: keeping the view equal to Redis (notifications, heartbeats, reconciles);
- :mod:`.versions`: which change is newer (a version per change, tombstones that expire);
- :mod:`.buffer`: the writes that wait for Redis; :mod:`.link`: whether Redis answers;
- :mod:`.loops`: the background loops (flush, sync, listen) and how they end.

Invariants of the whole:

- **One time source.** Every last-seen time written to Redis is Redis's own ``TIME``; each
  gateway maps it to its own liveness clock with an offset measured at every sync, so skewed
  or stepped gateway clocks cannot make an agent look dead or alive.
- **No Redis round trip on a route decision**; a view is stale by at most
  :data:`STALENESS_BOUND_S` for a heartbeat (plus a round trip), by milliseconds for a
  registration or removal (pub/sub), and by ``reconcile_s`` for a lost notification.
- **Bounded by the live ids.** Redis holds one entry per registered id in each structure and
  nothing of removed or never-registered ids (but, for :data:`RESET_WINDOW_S` after Redis
  lost its data, expiring tombstones of the removals made then); each view holds the
  versions of its records and tombstones of recent removals only, dropped once nothing older
  can arrive (at most :data:`TOMBSTONE_TTL_S`).
- **Redis away**: routing goes on from the view, writes are buffered and written later
  (the writes of at most :data:`MAX_BUFFERED` ids: past it a write of another id is refused;
  a removal of an id Redis never had cancels its buffered registration); no purge runs from
  a view that may miss heartbeats. **Redis emptied**: the view is
  re-published, filling in only what Redis has nothing of (no record written since is
  overwritten, no id removed since comes back). Delivery latency statistics stay local to
  each gateway.
- Nothing from redis-py leaks past this package: :class:`~agent_reach.errors.BackendUnavailable`
  when Redis cannot be reached, :class:`~agent_reach.errors.ConfigError` for a bad URL or
  prefix.
"""

from __future__ import annotations

from agent_reach.registry.redis.buffer import MAX_BUFFERED
from agent_reach.registry.redis.loops import FLUSH_S, RECONCILE_S, STALENESS_BOUND_S, SYNC_S
from agent_reach.registry.redis.registry import TOMBSTONE_TTL_S, RedisRegistry
from agent_reach.registry.redis.store import RESET_WINDOW_S
from agent_reach.registry.redis.sync import RESYNC_EPS_S

__all__ = [
    "FLUSH_S",
    "MAX_BUFFERED",
    "RECONCILE_S",
    "RESET_WINDOW_S",
    "RESYNC_EPS_S",
    "STALENESS_BOUND_S",
    "SYNC_S",
    "TOMBSTONE_TTL_S",
    "RedisRegistry",
]
