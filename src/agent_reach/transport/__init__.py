"""Transports behind one protocol; a mux picks one by the endpoint URL's scheme."""

from __future__ import annotations

from agent_reach.transport.base import Delivery, Transport
from agent_reach.transport.http import HttpTransport
from agent_reach.transport.mux import TransportMux, http_mux, scheme_of

__all__ = ["Delivery", "HttpTransport", "Transport", "TransportMux", "http_mux", "scheme_of"]
