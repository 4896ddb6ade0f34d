"""Plain values shared by the core, the registry and the gateway.

Invariants:
- Records are immutable; a heartbeat or an upsert replaces the record.
- ``last_seen`` is on the *liveness clock* (monotonic seconds, stall-corrected, see
  :mod:`agent_reach.core.health`); ``last_seen_at`` is wall time, for people only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from agent_reach.errors import ConfigError

__all__ = ["ROUTABLE", "EndpointRecord", "Outcome", "Status", "Thresholds"]


class Status(enum.StrEnum):
    """The four health levels of an endpoint, best first."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    SUSPECT = "suspect"
    DOWN = "down"


ROUTABLE = (Status.HEALTHY, Status.DEGRADED)  # the statuses intent routing sends to


class Outcome(enum.StrEnum):
    """What one delivery attempt came to."""

    OK = "ok"
    TIMEOUT = "timeout"
    CONNECT_ERROR = "connect_error"
    AGENT_ERROR = "agent_error"
    SERVER_ERROR = "server_error"


class EndpointRecord(NamedTuple):
    """What the registry knows of one endpoint (a tuple: one is made per heartbeat)."""

    endpoint_id: str
    capabilities: tuple[str, ...]
    endpoint_url: str
    description: str
    last_seen: float
    last_seen_at: float
    owner: str = ""  # token mode: the registration (endpoint token ``gen``) that holds the id


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Health thresholds in seconds (heartbeat age) and milliseconds (latency).

    Defaults follow the contract: degraded after 1, suspect after 2, down after 3 heartbeat
    periods; slow when the mean of the last 5 deliveries is over 2000 ms.
    """

    heartbeat_interval: float = 10.0
    degraded_after: float = 10.0
    suspect_after: float = 20.0
    down_after: float = 30.0
    slow_threshold_ms: float = 2000.0
    sample_ttl: float = 60.0

    @classmethod
    def from_interval(cls, interval: float, **overrides: float) -> Thresholds:
        """Thresholds at 1/2/3 heartbeat periods, with explicit values taking precedence."""
        values: dict[str, float] = {
            "heartbeat_interval": interval,
            "degraded_after": interval,
            "suspect_after": 2 * interval,
            "down_after": 3 * interval,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def check(self) -> None:
        """Raise ValueError unless 0 < degraded <= suspect <= down and the rest are positive."""
        if self.heartbeat_interval <= 0:
            raise ConfigError("heartbeat-interval must be > 0")
        if not 0 < self.degraded_after <= self.suspect_after <= self.down_after:
            raise ConfigError(
                "need 0 < degraded-after <= suspect-after <= down-after, got "
                f"{self.degraded_after} / {self.suspect_after} / {self.down_after}"
            )
        if self.slow_threshold_ms <= 0 or self.sample_ttl <= 0:
            raise ConfigError("slow-threshold-ms and the sample window must be > 0")
