"""Registry backends behind one protocol, picked by URL."""

from __future__ import annotations

from agent_reach.clock import Clock
from agent_reach.errors import ConfigError
from agent_reach.registry.base import (
    RegistryBackend,
    RegistryChange,
    RegistryListener,
    RegistryState,
)
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import redacted

__all__ = [
    "MemoryRegistry",
    "RegistryBackend",
    "RegistryChange",
    "RegistryListener",
    "RegistryState",
    "open_registry",
]


def open_registry(
    url: str,
    *,
    prefix: str = "agent-reach",
    max_records: int | None = None,
    clock: Clock | None = None,
) -> RegistryBackend:
    """The backend for ``url``: ``memory://`` (the default, one process) or ``redis://``,
    ``rediss://``, ``unix://`` (shared by many gateways; ``prefix`` separates networks on one
    Redis). ``max_records`` caps the records (None: no cap; see
    :meth:`RegistryBackend.upsert`); ``clock`` is what a shared backend's background loops
    sleep on (default: the system clock).

    Raises :class:`~agent_reach.errors.ConfigError` for any other URL, an unusable prefix or
    ``max_records``, or a Redis URL when redis-py is not installed. Nothing is connected
    here: :meth:`RegistryBackend.start` does that."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        return MemoryRegistry(max_records=max_records)
    if scheme in ("redis", "rediss", "unix"):
        try:
            from agent_reach.registry.redis import RedisRegistry
        except ImportError as exc:  # the optional extra
            raise ConfigError(
                f"registry {redacted(url)!r} needs redis-py: "
                "pip install 'agent-reach-gateway[redis]'"
            ) from exc
        return RedisRegistry(url, prefix=prefix, max_records=max_records, clock=clock)
    raise ConfigError(
        f"unsupported registry URL {redacted(url)!r}: use memory:// or redis://HOST:PORT/DB"
    )
