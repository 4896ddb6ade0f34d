"""Where the directory keeps the domains' summaries: in its own memory, or in Redis, shared by
several directory processes.

Layout in Redis (under the hash tag ``{PREFIX}``, as the registry's keys)::

    {P}:directory:summaries   hash   DOMAIN -> {"received_ms": N, "summary": {...}}

Invariants (every store; tests/contract/test_directory_store.py):

- **The directory's clock.** A summary's age counts from when a directory received it, on one
  clock: the process's monotonic clock in memory, Redis's ``TIME`` in Redis, so that several
  directory processes give the same age. The publisher's own ``at`` is carried, never used.
- **Fresh only.** A summary older than ``ttl_s`` is neither returned nor kept: it is dropped
  when found (in Redis by a script that checks its age again, so that a summary another
  directory has just refreshed is never dropped), and the hash itself expires ``ttl_s`` after
  the last publish.
- **Bounded.** At most ``max_domains`` summaries: a new domain past it is refused with
  :class:`~agent_reach.errors.RegistryFull` (nothing written); a known domain may always
  publish again. In Redis the check and the write are one script, so the bound holds across
  directory processes.
- **Our errors only.** Every redis-py exception (and ``OSError``) becomes
  :class:`~agent_reach.errors.BackendUnavailable`; a bad URL or prefix is a
  :class:`~agent_reach.errors.ConfigError` when the store is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import msgspec

from agent_reach.clock import Clock, SystemClock
from agent_reach.errors import BackendUnavailable, ConfigError, RegistryFull
from agent_reach.settings import redacted
from agent_reach.wire.federation import DirectoryEntry, DomainSummary

__all__ = ["MemorySummaryStore", "RedisSummaryStore", "SummaryStore", "open_store"]

CONNECT_TIMEOUT_S = 2.0


class SummaryStore(Protocol):
    """The summaries of the domains, each with the time the directory received it."""

    #: ``memory`` or ``redis`` (``/healthz``, the start line)
    kind: str

    async def start(self) -> None:
        """Connect; :class:`~agent_reach.errors.BackendUnavailable` when the store cannot be
        reached (a directory does not start on a store it has never seen)."""
        ...

    async def publish(self, summary: DomainSummary) -> tuple[list[DirectoryEntry], bool]:
        """Keep ``summary`` (replacing its domain's last one) as received now; return the
        OTHER domains' fresh summaries (by domain) and whether its domain was new.
        RegistryFull for a new domain past ``max_domains``; BackendUnavailable."""
        ...

    async def fresh(self) -> list[DirectoryEntry]:
        """Every fresh summary, by domain; BackendUnavailable."""
        ...

    async def count(self) -> int:
        """The summaries held (a stale one may count until the next publish drops it);
        BackendUnavailable."""
        ...

    async def close(self) -> None:
        """Let go of the store (never raises)."""
        ...


def entry(summary: DomainSummary, age_s: float) -> DirectoryEntry:
    """``summary`` as the directory hands it out, ``age_s`` seconds after it came."""
    return DirectoryEntry(
        domain=summary.domain,
        gateway_url=summary.gateway_url,
        at=summary.at,
        intents=summary.intents,
        age_s=round(max(0.0, age_s), 3),
    )


def _full(max_domains: int, domain: str) -> RegistryFull:
    return RegistryFull(
        f"the directory holds the summaries of {max_domains} domains (--max-domains): "
        f"{domain!r} is refused until one of them goes stale",
        domain=domain,
    )


class MemorySummaryStore:
    """A dict in this process, on ``clock``'s monotonic time."""

    kind = "memory"

    def __init__(self, *, ttl_s: float, max_domains: int, clock: Clock | None = None) -> None:
        self.ttl_s = ttl_s
        self.max_domains = max_domains
        self.clock = clock or SystemClock()
        self._held: dict[str, tuple[float, DomainSummary]] = {}  # domain -> (received, summary)

    def _drop_stale(self, now: float) -> None:
        stale = [d for d, (received, _) in self._held.items() if now - received > self.ttl_s]
        for domain in stale:
            del self._held[domain]

    async def start(self) -> None:
        return None

    async def publish(self, summary: DomainSummary) -> tuple[list[DirectoryEntry], bool]:
        now = self.clock.monotonic()
        self._drop_stale(now)
        added = summary.domain not in self._held
        if added and len(self._held) >= self.max_domains:
            raise _full(self.max_domains, summary.domain)
        others = self._entries(now, but=summary.domain)
        self._held[summary.domain] = (now, summary)
        return others, added

    async def fresh(self) -> list[DirectoryEntry]:
        now = self.clock.monotonic()
        self._drop_stale(now)
        return self._entries(now)

    async def count(self) -> int:
        self._drop_stale(self.clock.monotonic())
        return len(self._held)

    async def close(self) -> None:
        return None

    def _entries(self, now: float, but: str | None = None) -> list[DirectoryEntry]:
        return [
            entry(summary, now - received)
            for domain, (received, summary) in sorted(self._held.items())
            if domain != but
        ]


class _Stored(msgspec.Struct, frozen=True):
    """A value of the Redis hash."""

    received_ms: int
    summary: DomainSummary


# Redis time in ms; then drops the given domains that are stale by it (checked again here: the
# value's prefix is the one this module writes)
_DROP = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = FIRST, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v then
    local ms = tonumber(string.match(v, '^{"received_ms":(%d+),'))
    if ms == nil or now - ms > ttl then redis.call('HDEL', KEYS[1], ARGV[i]) end
  end
end
"""

# ARGV: ttl_ms, max_domains, domain, summary JSON, stale domains...
# returns {now_ms, 0 refused (full) | 1 replaced | 2 added}
PUBLISH = (
    _DROP.replace("FIRST", "5")
    + """
local known = redis.call('HEXISTS', KEYS[1], ARGV[3]) == 1
if not known and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[2]) then
  return {now, 0}
end
local value = '{"received_ms":' .. string.format('%d', now) .. ',"summary":' .. ARGV[4] .. '}'
redis.call('HSET', KEYS[1], ARGV[3], value)
redis.call('PEXPIRE', KEYS[1], ttl + 1000)
if known then return {now, 1} end
return {now, 2}
"""
)

# ARGV: ttl_ms, stale domains...
DROP = _DROP.replace("FIRST", "2") + "return 0\n"


class RedisSummaryStore:
    """The hash ``{PREFIX}:directory:summaries`` on the Redis of ``url`` (a redis-py URL)."""

    kind = "redis"

    def __init__(self, url: str, prefix: str, *, ttl_s: float, max_domains: int) -> None:
        from redis import asyncio as aioredis

        from agent_reach.registry.redis.store import key_prefix

        self.url, self.prefix = url, prefix
        self.key = f"{key_prefix(prefix)}:directory:summaries"
        self.ttl_ms = int(ttl_s * 1000)
        self.max_domains = max_domains
        try:
            self._redis: Any = aioredis.Redis.from_url(
                url,
                socket_timeout=CONNECT_TIMEOUT_S,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                retry_on_timeout=False,
            )
        except ValueError as exc:
            raise ConfigError(f"unusable registry URL {redacted(url)!r}: {exc}") from exc
        self._publish = self._redis.register_script(PUBLISH)
        self._drop = self._redis.register_script(DROP)
        self._decoder = msgspec.json.Decoder(_Stored)
        self._encode = msgspec.json.Encoder().encode

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        from redis.exceptions import RedisError

        try:
            yield
        except (RedisError, OSError) as exc:
            raise BackendUnavailable(f"redis at {redacted(self.url)}: {exc}") from exc

    async def start(self) -> None:
        try:
            with self._io():
                await self._redis.ping()
        except BackendUnavailable as exc:
            await self.close()
            cause = exc.__cause__ or exc
            raise BackendUnavailable(
                f"cannot reach the directory's store at {redacted(self.url)}: {cause}"
            ) from exc

    async def _read(self) -> tuple[list[tuple[int, DomainSummary]], list[str]]:
        """(age in ms, summary) of the fresh summaries by domain, and the stale domains, as
        Redis held them at one instant."""
        with self._io():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.time()
                pipe.hgetall(self.key)
                (seconds, micros), raw = await pipe.execute()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        fresh: list[tuple[str, int, DomainSummary]] = []
        stale: list[str] = []
        for key, value in raw.items():
            domain = key.decode(errors="replace")
            try:
                stored = self._decoder.decode(value)
            except msgspec.MsgspecError:  # not written by this module: of no use to anyone
                stale.append(domain)
                continue
            age_ms = now_ms - stored.received_ms
            if age_ms > self.ttl_ms:
                stale.append(domain)
            else:
                fresh.append((domain, age_ms, stored.summary))
        fresh.sort(key=lambda found: found[0])
        return [(age_ms, summary) for _, age_ms, summary in fresh], stale

    async def publish(self, summary: DomainSummary) -> tuple[list[DirectoryEntry], bool]:
        found, stale = await self._read()
        args: list[bytes | str | int] = [
            self.ttl_ms,
            self.max_domains,
            summary.domain,
            self._encode(summary),
            *stale,
        ]
        with self._io():
            _, outcome = await self._publish(keys=[self.key], args=args)
        if int(outcome) == 0:
            raise _full(self.max_domains, summary.domain)
        others = [entry(s, age / 1000) for age, s in found if s.domain != summary.domain]
        return others, int(outcome) == 2

    async def fresh(self) -> list[DirectoryEntry]:
        found, stale = await self._read()
        if stale:
            with self._io():
                await self._drop(keys=[self.key], args=[self.ttl_ms, *stale])
        return [entry(summary, age / 1000) for age, summary in found]

    async def count(self) -> int:
        with self._io():
            held: int = await self._redis.hlen(self.key)
        return held

    async def close(self) -> None:
        from redis.exceptions import RedisError

        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()


def open_store(
    url: str, *, prefix: str, ttl_s: float, max_domains: int, clock: Clock | None = None
) -> SummaryStore:
    """The store of ``url``: ``memory://`` (one directory process) or ``redis://``,
    ``rediss://``, ``unix://`` (shared by several). ConfigError for any other URL or an
    unusable prefix; nothing is connected here (:meth:`SummaryStore.start` does that)."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        return MemorySummaryStore(ttl_s=ttl_s, max_domains=max_domains, clock=clock)
    if scheme in ("redis", "rediss", "unix"):
        return RedisSummaryStore(url, prefix, ttl_s=ttl_s, max_domains=max_domains)
    raise ConfigError(
        f"unsupported registry URL {redacted(url)!r}: use memory:// or redis://HOST:PORT/DB",
        source="registry",
    )
