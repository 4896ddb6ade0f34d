"""The transport protocol: how a request reaches an agent and its answer comes back.

A transport never raises for what an agent does: every result, good or bad, is a
:class:`Delivery`. It enforces the attempt timeout it is given and a cap on answer size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from agent_reach.core.model import Outcome

__all__ = ["Delivery", "Transport"]


class Delivery(NamedTuple):
    """The result of one attempt.

    ``reached`` is False when nothing reached the agent (connection refused): such a retry is
    not charged to the retry budget. ``eject`` asks for the passive check (refused or reset).
    """

    outcome: Outcome
    status: int | None = None
    body: bytes | None = None
    detail: str = ""
    reached: bool = True
    eject: bool = False
    # the agent's own account of the attempt (its Server-Timing header), when it gave one
    agent_ms: float | None = None
    agent_note: str = ""


class Transport(Protocol):
    """Delivers one request body to one endpoint URL."""

    async def start(self) -> None:
        """Open pools; idempotent."""
        ...

    async def close(self) -> None:
        """Close pools; idempotent."""
        ...

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """POST ``body`` to ``url`` and wait at most ``timeout_s`` for the whole answer.

        Outcomes: ``ok`` (2xx with a JSON body); ``agent_error`` (4xx, or an answer the gateway
        cannot use: 1xx/3xx, a 2xx that is not JSON, compressed or too large; never retried);
        ``server_error`` (5xx); ``timeout``; ``connect_error``.
        """
        ...
