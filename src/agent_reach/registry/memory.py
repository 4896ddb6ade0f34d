"""The embedded in-memory registry: one process, no I/O, the default (``memory://``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from itertools import islice

from agent_reach.clock import SystemClock
from agent_reach.core.model import EndpointRecord
from agent_reach.errors import EndpointHeld
from agent_reach.registry.base import (
    RegistryChange,
    RegistryListener,
    RegistryState,
    check_max_records,
    registry_full,
)

__all__ = ["MemoryRegistry"]

_EMPTY: dict[str, None] = {}


class MemorySharedMap:
    """A :class:`~agent_reach.registry.base.SharedMap` in this process."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    async def get(self, key: str) -> str | None:
        return self._values.get(key)

    async def put(self, key: str, value: str) -> None:
        self._values[key] = value

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)

    async def items(self) -> dict[str, str]:
        return dict(self._values)


class MemoryClaimMap:
    """A :class:`~agent_reach.registry.base.ClaimMap` in this process, on the clock ``now``
    (the registry's bound liveness clock: a fake clock in tests moves its expiries).

    An expired entry is invisible at once and dropped when the map has doubled since its last
    pass over them, so that entries nobody reads again do not pile up (amortized O(1) a claim).
    At most ``max_entries`` are held: past it, after the expired ones, the least recently
    claimed live ones are dropped, a sixteenth of the bound at once (counted in ``evicted``),
    so that a caller opening conversations faster than they expire cannot grow the map.
    """

    _MIN_PASS = 1024  # no pass over the entries below this many
    MAX_ENTRIES = 100_000  # ~40 MB of A2A owners (an hour of 28 new conversations a second)

    def __init__(self, now: Callable[[], float], max_entries: int = MAX_ENTRIES) -> None:
        self._now = now
        # key -> (value, expires at), least recently claimed first
        self._values: dict[str, tuple[str, float]] = {}
        self._next_pass = self._MIN_PASS
        self.max_entries = max_entries
        self.evicted = 0  # live entries dropped at the bound (a metric)

    def _live(self, key: str, now: float) -> str | None:
        found = self._values.get(key)
        if found is None:
            return None
        if found[1] <= now:
            del self._values[key]
            return None
        return found[0]

    async def get(self, key: str) -> str | None:
        return self._live(key, self._now())

    async def claim(self, key: str, value: str, ttl_s: float) -> str:
        now = self._now()
        held = self._live(key, now)
        if held is not None and held != value:
            return held
        values = self._values
        values.pop(key, None)  # renewed: last in the order
        values[key] = (value, now + ttl_s)
        full = len(values) > self.max_entries
        if full or len(values) >= self._next_pass:
            values = self._values = {k: v for k, v in values.items() if v[1] > now}
            keep = max(1, self.max_entries - max(1, self.max_entries // 16))
            if full and len(values) > keep:  # the least recently claimed live ones go: room
                # for a sixteenth of the bound before the next pass
                for old in list(islice(values, len(values) - keep)):
                    del values[old]
                    self.evicted += 1
            self._next_pass = max(self._MIN_PASS, 2 * len(values))
        return value

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)


class MemoryRegistry:
    """Records in a dict, with an intent -> ordered set of ids index kept in step.

    ``max_records`` caps the records held: an upsert of a new id when that many are held
    raises :class:`~agent_reach.errors.RegistryFull` and changes nothing; a held id may always
    be upserted again. Down records count until they are purged.
    """

    def __init__(self, *, max_records: int | None = None) -> None:
        self.max_records = check_max_records(max_records)
        self._now: Callable[[], float] | None = None
        self._records: dict[str, EndpointRecord] = {}
        self._maps: dict[str, MemorySharedMap] = {}
        self._claims: dict[str, MemoryClaimMap] = {}
        self._index: dict[str, dict[str, None]] = {}
        self._listeners: list[RegistryListener] = []

    def shared_map(self, name: str) -> MemorySharedMap:
        """The map ``name`` of this process (made at first use)."""
        found = self._maps.get(name)
        if found is None:
            found = self._maps[name] = MemorySharedMap()
        return found

    def claim_map(self, name: str) -> MemoryClaimMap:
        """The claim map ``name`` of this process (made at first use), on the bound clock."""
        found = self._claims.get(name)
        if found is None:
            found = self._claims[name] = MemoryClaimMap(self._clock)
        return found

    def _clock(self) -> float:
        # read at each call: a map made before bind() follows the clock bound later
        return SystemClock().monotonic() if self._now is None else self._now()

    def bind(self, now: Callable[[], float]) -> None:
        self._now = now  # one process, one clock: nothing to map; read for held_within_s

    async def start(self) -> None:
        return None

    def state(self) -> RegistryState:
        return RegistryState("memory", True, "embedded in-memory registry", None)

    async def close(self) -> None:
        return None

    def subscribe(self, listener: RegistryListener) -> None:
        self._listeners.append(listener)

    def _announce(self, change: RegistryChange) -> None:
        for listener in self._listeners:
            listener(change)

    def _unindex(self, record: EndpointRecord) -> None:
        for tag in record.capabilities:
            members = self._index.get(tag)
            if members is not None:
                members.pop(record.endpoint_id, None)
                if not members:
                    del self._index[tag]

    async def upsert(
        self, record: EndpointRecord, *, held_within_s: float | None = None
    ) -> EndpointRecord | None:
        before = self._records.get(record.endpoint_id)
        if held_within_s is not None and before is not None and self._now is not None:
            held_by_another = before.owner and before.owner != record.owner
            if held_by_another and self._now() - before.last_seen < held_within_s:
                raise EndpointHeld(record.endpoint_id)
        limit = self.max_records
        if before is None and limit is not None and len(self._records) >= limit:
            raise registry_full(record.endpoint_id, len(self._records), limit)
        if before is not None and before.capabilities != record.capabilities:
            self._unindex(before)
        self._records[record.endpoint_id] = record
        for tag in record.capabilities:
            self._index.setdefault(tag, {})[record.endpoint_id] = None
        self._announce(RegistryChange(record.endpoint_id, before, record))
        return before

    def touch(
        self, endpoint_id: str, last_seen: float, last_seen_at: float
    ) -> EndpointRecord | None:
        before = self._records.get(endpoint_id)
        if before is None:
            return None
        after = EndpointRecord(  # positional: cheaper than dataclasses.replace on this path
            endpoint_id,
            before.capabilities,
            before.endpoint_url,
            before.description,
            last_seen,
            last_seen_at,
            before.owner,
        )
        self._records[endpoint_id] = after
        self._announce(RegistryChange(endpoint_id, before, after))
        return after

    async def remove(self, endpoint_id: str, *, owner: str | None = None) -> EndpointRecord | None:
        before = self._records.get(endpoint_id)
        if before is None:
            return None
        if owner is not None and before.owner != owner:
            raise EndpointHeld(endpoint_id)
        del self._records[endpoint_id]
        self._unindex(before)
        self._announce(RegistryChange(endpoint_id, before, None))
        return before

    async def purge(self, seen_before: float) -> int:
        stale = [r.endpoint_id for r in self._records.values() if r.last_seen < seen_before]
        for endpoint_id in stale:
            await self.remove(endpoint_id)
        return len(stale)

    def get(self, endpoint_id: str) -> EndpointRecord | None:
        return self._records.get(endpoint_id)

    def by_intent(self, intent: str) -> Collection[str]:
        return self._index.get(intent, _EMPTY).keys()

    def intents(self) -> Collection[str]:
        return self._index.keys()

    def records(self) -> Iterable[EndpointRecord]:
        return self._records.values()

    def __len__(self) -> int:
        return len(self._records)
