"""Registry backends behind one protocol, picked by URL."""

from __future__ import annotations

from agent_reach.registry.base import (
    RegistryBackend,
    RegistryChange,
    RegistryListener,
    RegistryState,
)
from agent_reach.registry.memory import MemoryRegistry

__all__ = [
    "MemoryRegistry",
    "RegistryBackend",
    "RegistryChange",
    "RegistryListener",
    "RegistryState",
    "open_registry",
]


def open_registry(url: str, *, prefix: str = "agent-reach") -> RegistryBackend:
    """The backend for ``url``: ``memory://`` (the default, one process) or ``redis://``,
    ``rediss://``, ``unix://`` (shared by many gateways; ``prefix`` separates networks on one
    Redis). Raises ValueError for anything else, or when redis-py is not installed."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        return MemoryRegistry()
    if scheme in ("redis", "rediss", "unix"):
        try:
            from agent_reach.registry.redis import RedisRegistry
        except ImportError as exc:  # the optional extra
            raise ValueError(
                f"registry {url!r} needs redis-py: pip install 'agent-reach-gateway[redis]'"
            ) from exc
        return RedisRegistry(url, prefix=prefix)
    raise ValueError(f"unsupported registry URL {url!r}: use memory:// or redis://HOST:PORT/DB")
