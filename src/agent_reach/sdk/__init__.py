"""SDKs for agents (``Agent``) and for callers (``ReachClient``, ``SyncReachClient``)."""

from agent_reach.sdk.agent import Agent, ReachContext, Reject
from agent_reach.sdk.client import ReachClient, Reply, SyncReachClient

__all__ = ["Agent", "ReachClient", "ReachContext", "Reject", "Reply", "SyncReachClient"]
