"""Who a request comes from once authenticated, and what a registration grants it.

The token kinds each use case accepts live here too, so that the service and the access
checks name them the same way (docs/security.md, "What each token proves").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_reach.auth.tokens import Claims, Kind

__all__ = [
    "BEARERS",
    "ENDPOINTS",
    "OPERATORS",
    "PEERS",
    "READERS",
    "REGISTRANTS",
    "SENDERS",
    "EndpointGrant",
    "Principal",
    "with_article",
]

SENDERS = frozenset({Kind.ENDPOINT, Kind.CLIENT})
REGISTRANTS = frozenset({Kind.ENROLL, Kind.ENDPOINT})
READERS = frozenset({Kind.OPERATOR, Kind.ENDPOINT, Kind.CLIENT})
OPERATORS = frozenset({Kind.OPERATOR})
ENDPOINTS = frozenset({Kind.ENDPOINT})
PEERS = frozenset({Kind.PEER})  # another domain's gateway (federation)
BEARERS = frozenset(Kind) - {Kind.DELIVERY}  # every kind a bearer token may be


@dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request once authenticated: its verified token (None in open mode) and
    address (the edge's :class:`~agent_reach.gateway.service.Principal` is what it claimed)."""

    claims: Claims | None
    remote: str

    @property
    def who(self) -> str:
        """The caller for log lines: the token's subject, else its address."""
        if self.claims is None:
            return f"anonymous@{self.remote}"
        return self.claims.subject


@dataclass(frozen=True, slots=True)
class EndpointGrant:
    """What a registration gives its agent in token mode: the record's owner generation and the
    endpoint token that proves it (renewed through heartbeat answers)."""

    owner: str
    token: str = ""
    expires_at: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The answer's extra fields (none in open mode)."""
        if not self.token:
            return {}
        return {"token": self.token, "token_expires_at": round(self.expires_at, 3)}


def with_article(word: str) -> str:
    """``word`` with its indefinite article."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"
