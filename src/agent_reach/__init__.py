"""Agent-Reach: the address book, routing switch and heartbeat line between agents."""

from __future__ import annotations

from agent_reach.errors import (
    AgentError,
    AgentReachError,
    AllAttemptsFailed,
    DeadlineExceeded,
    EndpointNotRegistered,
    InvalidRequest,
    NoAvailableAgent,
    NoCapableAgent,
    PayloadTooLarge,
    ReachError,
    RecipientIncapable,
    RecipientNotFound,
    TraceNotFound,
)
from agent_reach.settings import GatewaySettings

__all__ = [
    "AgentError",
    "AgentReachError",
    "AllAttemptsFailed",
    "DeadlineExceeded",
    "EndpointNotRegistered",
    "GatewaySettings",
    "InvalidRequest",
    "NoAvailableAgent",
    "NoCapableAgent",
    "PayloadTooLarge",
    "ReachError",
    "RecipientIncapable",
    "RecipientNotFound",
    "TraceNotFound",
]
