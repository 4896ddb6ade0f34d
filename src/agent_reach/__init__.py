"""Agent-Reach: the address book, routing switch and heartbeat line between agents."""

from __future__ import annotations

from agent_reach.errors import (
    AgentError,
    AgentReachError,
    AllAttemptsFailed,
    DeadlineExceeded,
    EndpointNotRegistered,
    Forbidden,
    GatewayUnavailable,
    InvalidRequest,
    NoAvailableAgent,
    NoCapableAgent,
    PayloadTooLarge,
    RateLimited,
    ReachError,
    RecipientIncapable,
    RecipientNotFound,
    TraceNotFound,
    Unauthorized,
)
from agent_reach.sdk.client import ReachClient, SyncReachClient
from agent_reach.settings import GatewaySettings

__all__ = [
    "AgentError",
    "AgentReachError",
    "AllAttemptsFailed",
    "DeadlineExceeded",
    "EndpointNotRegistered",
    "Forbidden",
    "GatewaySettings",
    "GatewayUnavailable",
    "InvalidRequest",
    "NoAvailableAgent",
    "NoCapableAgent",
    "PayloadTooLarge",
    "RateLimited",
    "ReachClient",
    "ReachError",
    "RecipientIncapable",
    "RecipientNotFound",
    "SyncReachClient",
    "TraceNotFound",
    "Unauthorized",
]
