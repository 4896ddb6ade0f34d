"""The registry protocol: where endpoint records live, and the local view routing reads.

A backend has two faces:

- async writes (``upsert``, ``touch``, ``remove``, ``purge``), which may do I/O (Redis);
- a synchronous local view (``get``, ``by_intent``, ``intents``, ``records``) that never does
  I/O, so that a route decision never waits on a round trip.

Every change to the view, made here or (for a shared backend) by another gateway, is announced
to the listeners given to :meth:`RegistryBackend.subscribe` as a :class:`RegistryChange`, after
the view has been updated. Listeners must be quick and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple, Protocol

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import ConfigError, RegistryFull

__all__ = [
    "ClaimMap",
    "RegistryBackend",
    "RegistryChange",
    "RegistryListener",
    "RegistryState",
    "SharedMap",
    "check_max_records",
    "registry_full",
]


class RegistryChange(NamedTuple):
    """One record changed: ``before`` is None for a new record, ``after`` None for a removal."""

    endpoint_id: str
    before: EndpointRecord | None
    after: EndpointRecord | None


RegistryListener = Callable[[RegistryChange], None]


class RegistryState(NamedTuple):
    """Whether the backend's shared store is reachable, for ``/healthz`` and the metrics.

    ``last_sync_age_s`` is how old the view's last successful sync is (None: nothing to sync).
    """

    backend: str
    available: bool
    detail: str
    last_sync_age_s: float | None


class SharedMap(Protocol):
    """A small named map of strings beside the records, shared by every gateway of the
    registry (in-process on ``memory://``, a Redis hash on ``redis://``): what an edge or a
    loop must keep about some endpoints beyond their records (the card URLs of A2A agents).
    Not for the request path: each call may be a round trip. Raises BackendUnavailable when
    the store cannot be reached."""

    async def get(self, key: str) -> str | None:
        """The value of ``key``, or None."""
        ...

    async def put(self, key: str, value: str) -> None:
        """Set ``key`` (last write wins)."""
        ...

    async def delete(self, key: str) -> None:
        """Forget ``key`` (no error when absent)."""
        ...

    async def items(self) -> dict[str, str]:
        """Every key and value now."""
        ...


class ClaimMap(Protocol):
    """A small named map of strings whose entries expire, shared by every gateway of the
    registry: who holds what for a while (the owners of A2A tasks and contexts).

    - **TTL in the store.** An entry lives ``ttl_s`` after its last :meth:`claim`, then is
      gone for every reader: in-process on ``memory://`` (on the registry's bound clock,
      expired entries dropped as the map grows), one key per entry with a ``PX`` expiry on
      ``redis://`` (Redis forgets it itself: no sweep, nothing read back to expire).
    - **First claim wins.** A claim is one atomic step: a live entry holding another value is
      never overwritten, so of two gateways claiming a key at once exactly one gets it.

    Each call may be a round trip. Raises BackendUnavailable when the store cannot be
    reached."""

    async def get(self, key: str) -> str | None:
        """The value of ``key`` while it lives, or None."""
        ...

    async def claim(self, key: str, value: str, ttl_s: float) -> str:
        """Atomically: when ``key`` is absent (or expired) or holds ``value``, set it to
        ``value`` to live ``ttl_s`` seconds from now and return ``value``; else leave it as it
        is (value and expiry) and return the value another claim holds."""
        ...

    async def delete(self, key: str) -> None:
        """Forget ``key`` (no error when absent)."""
        ...


class RegistryBackend(Protocol):
    """Storage of endpoint records with an intent -> endpoints inverted index."""

    def shared_map(self, name: str) -> SharedMap:
        """The :class:`SharedMap` called ``name`` (``[a-z0-9-]+``) of this registry."""
        ...

    def claim_map(self, name: str) -> ClaimMap:
        """The :class:`ClaimMap` called ``name`` (``[a-z0-9-]+``) of this registry."""
        ...

    def bind(self, now: Callable[[], float]) -> None:
        """Give the backend the gateway's liveness clock (before :meth:`start`): every
        ``last_seen`` in the view is on it. A shared backend maps its own time source to it."""
        ...

    async def start(self) -> None:
        """Connect and load the view; idempotent. Raises
        :class:`~agent_reach.errors.BackendUnavailable` when the backing store cannot be
        reached (nothing from the store's client library: adapters translate). An unusable
        URL or prefix is a :class:`~agent_reach.errors.ConfigError`, raised when the backend
        is made (:func:`~agent_reach.registry.open_registry`)."""
        ...

    def state(self) -> RegistryState:
        """Whether the shared store is reachable now (the view is routed on either way)."""
        ...

    async def close(self) -> None:
        """Release connections; idempotent."""
        ...

    def subscribe(self, listener: RegistryListener) -> None:
        """Call ``listener`` after every change of the view."""
        ...

    async def upsert(
        self, record: EndpointRecord, *, held_within_s: float | None = None
    ) -> EndpointRecord | None:
        """Insert or replace the record of ``record.endpoint_id``; return the previous one.

        Writes change the view at once; a shared backend that cannot reach its store buffers
        the write and does not raise for that, unless its buffer is at its bound: then
        :class:`~agent_reach.errors.BackendUnavailable`, nothing changed. With
        ``held_within_s`` (token mode), the write is refused with
        :class:`~agent_reach.errors.EndpointHeld`, nothing changed, when the stored record has
        another non-empty ``owner`` and was seen less than that many seconds ago: checked and
        written in one step in the store (a shared backend's buffered write, made while its
        store is away, cannot be checked there and is not refused).

        A backend made with ``max_records`` refuses a NEW id with
        :class:`~agent_reach.errors.RegistryFull`, nothing changed, while it holds that many
        records (down ones count until purged); an id it holds may always be written again.
        A shared backend checks it in the store, in the same step as the write (on its own
        view while the store is away)."""
        ...

    def touch(
        self, endpoint_id: str, last_seen: float, last_seen_at: float
    ) -> EndpointRecord | None:
        """Record a heartbeat; return the updated record, or None when the id is unknown.

        Synchronous: it changes the view at once (a shared backend writes heartbeats behind,
        in batches), so that a heartbeat is answered without a task or an await."""
        ...

    async def remove(self, endpoint_id: str, *, owner: str | None = None) -> EndpointRecord | None:
        """Delete the record at once; return it, or None when the id is unknown (then nothing
        is stored: removing unknown ids costs no space). A shared backend buffers the removal
        as :meth:`upsert` does a write (BackendUnavailable, nothing changed, at the bound).
        With ``owner`` (token mode: the generation of the endpoint token removing it), only a
        record of that owner is removed: EndpointHeld, nothing removed, when the record has
        another, checked where the record is written (in Redis: in the same script, so that a
        registration made through another gateway, not yet in this view, is not removed)."""
        ...

    async def purge(self, seen_before: float) -> int:
        """Delete every record last seen before ``seen_before``; return how many."""
        ...

    def get(self, endpoint_id: str) -> EndpointRecord | None:
        """The record of ``endpoint_id`` in the local view."""
        ...

    def by_intent(self, intent: str) -> Collection[str]:
        """Ids of the endpoints declaring exactly ``intent`` (empty when none); O(1)."""
        ...

    def intents(self) -> Collection[str]:
        """Every intent at least one endpoint declares: a live view (not to be kept across
        awaits), ``in`` on it O(1)."""
        ...

    def records(self) -> Iterable[EndpointRecord]:
        """Every record of the view, in registration order."""
        ...

    def __len__(self) -> int:
        """Number of records in the view."""
        ...


def check_max_records(max_records: int | None) -> int | None:
    """``max_records`` as given, or ConfigError when it is not None or a positive integer."""
    if max_records is not None and (
        isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1
    ):
        raise ConfigError(f"max_records must be a positive integer or None, got {max_records!r}")
    return max_records


def registry_full(endpoint_id: str, count: int | str, limit: int) -> RegistryFull:
    """The refusal of a new id by a registry that holds ``count`` records, its ``limit``."""
    return RegistryFull(
        f"the registry holds {count} records, its limit ({limit}), and {endpoint_id} is not "
        "one of them: deregister or purge endpoints, or raise the limit (an id already "
        "registered may always register again)"
    )
