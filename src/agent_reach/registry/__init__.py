"""Registry backends behind one protocol, picked by URL."""

from __future__ import annotations

from agent_reach.registry.base import RegistryBackend, RegistryChange, RegistryListener
from agent_reach.registry.memory import MemoryRegistry

__all__ = [
    "MemoryRegistry",
    "RegistryBackend",
    "RegistryChange",
    "RegistryListener",
    "open_registry",
]


def open_registry(url: str) -> RegistryBackend:
    """The backend for ``url``: ``memory://`` (the default). Raises ValueError for others."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "memory":
        return MemoryRegistry()
    raise ValueError(f"unsupported registry URL {url!r}: this build knows memory://")
