"""Gateway settings: one frozen value made at the entry point, passed down explicitly."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from agent_reach.core.model import Thresholds

__all__ = ["DEFAULT_GATEWAY_URL", "GatewaySettings", "gateway_url"]

DEFAULT_PURGE_AFTER_S = 3600.0
DEFAULT_GATEWAY_URL = "http://127.0.0.1:7700"
GATEWAY_ENV = "AGENT_REACH_GATEWAY"


def gateway_url(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The gateway URL clients and agents use: ``explicit``, else ``$AGENT_REACH_GATEWAY``,
    else ``http://127.0.0.1:7700``; without a trailing slash.

    The one place the SDKs read that variable (when called, never at import).
    """
    url = explicit or (os.environ if env is None else env).get(GATEWAY_ENV) or DEFAULT_GATEWAY_URL
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"gateway URL must start with http:// or https://, got {url!r}")
    return url


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """Everything a gateway is configured with (CLI flags and ``AGENT_REACH_*`` variables).

    ``degraded_after``, ``suspect_after`` and ``down_after`` default to 1, 2 and 3 heartbeat
    intervals when left as None.
    """

    host: str = "127.0.0.1"
    port: int = 7700
    registry: str = "memory://"
    heartbeat_interval: float = 10.0
    degraded_after: float | None = None
    suspect_after: float | None = None
    down_after: float | None = None
    slow_threshold_ms: float = 2000.0
    overhead_reserve_ms: float = 1000.0
    confidence_threshold: float = 0.8
    purge_after: float | None = None  # None: max(1 hour, down-after)
    max_body_bytes: int = 1 << 20
    default_timeout_ms: int = 8000
    answer_margin_ms: float = 5.0
    trace_capacity: int = 10_000
    retry_budget_ratio: float = 0.2
    retry_budget_min_per_s: float = 10.0
    log_level: str = "INFO"

    @property
    def thresholds(self) -> Thresholds:
        """The health thresholds these settings imply (validated)."""
        t = Thresholds.from_interval(
            self.heartbeat_interval,
            degraded_after=self.degraded_after,  # type: ignore[arg-type]
            suspect_after=self.suspect_after,  # type: ignore[arg-type]
            down_after=self.down_after,  # type: ignore[arg-type]
            slow_threshold_ms=self.slow_threshold_ms,
        )
        t.check()
        return t

    @property
    def purge_after_s(self) -> float:
        """Seconds without a heartbeat after which a (down) record is deleted."""
        if self.purge_after is not None:
            return self.purge_after
        return max(DEFAULT_PURGE_AFTER_S, self.thresholds.down_after)

    def check(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        t = self.thresholds  # validates the health thresholds
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if not 0 < self.confidence_threshold <= 1:
            raise ValueError("confidence-threshold must be in (0, 1]")
        if self.overhead_reserve_ms < 0:
            raise ValueError("overhead-reserve-ms must be >= 0")
        if self.purge_after is not None and self.purge_after < t.down_after:
            raise ValueError(
                f"purge-after ({self.purge_after}) must be at least down-after ({t.down_after}):"
                " only down records are purged"
            )
        if self.max_body_bytes < 1024:
            raise ValueError("max-body-bytes must be at least 1024")
