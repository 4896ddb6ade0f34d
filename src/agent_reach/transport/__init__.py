"""Transports behind one protocol, picked by URL."""

from __future__ import annotations

from agent_reach.transport.base import Delivery, Transport
from agent_reach.transport.http import HttpTransport

__all__ = ["Delivery", "HttpTransport", "Transport", "open_transport"]


def open_transport(url: str, *, max_response_bytes: int = 1 << 20) -> Transport:
    """The transport for endpoint URLs of this scheme: ``http``/``https``."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("http", "https"):
        return HttpTransport(max_response_bytes=max_response_bytes)
    raise ValueError(f"unsupported transport URL {url!r}: this build knows http:// and https://")
