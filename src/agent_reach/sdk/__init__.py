"""SDKs for agents (and, later, callers)."""

from agent_reach.sdk.agent import Agent, ReachContext, Reject

__all__ = ["Agent", "ReachContext", "Reject"]
