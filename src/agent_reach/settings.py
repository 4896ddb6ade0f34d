"""Gateway settings: one frozen value made at the entry point, passed down explicitly."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent_reach.core.model import Thresholds

__all__ = ["DEFAULT_GATEWAY_URL", "GatewaySettings", "gateway_url", "gateway_urls", "redacted"]

DEFAULT_PURGE_AFTER_S = 3600.0
DEFAULT_GATEWAY_URL = "http://127.0.0.1:7700"
GATEWAY_ENV = "AGENT_REACH_GATEWAY"


def redacted(url: str) -> str:
    """``url`` without its password (for log lines and start-up messages)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, host = rest.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user + ':' if user else ''}***@{host}"


def gateway_url(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The gateway URL clients and agents use: ``explicit``, else ``$AGENT_REACH_GATEWAY``,
    else ``http://127.0.0.1:7700``; without a trailing slash.

    For callers that talk to one gateway: when several are given (a comma-separated list), the
    first one. :func:`gateway_urls` gives them all.
    """
    return gateway_urls(explicit, env)[0]


def gateway_urls(
    explicit: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The gateway URLs clients and agents use, in the order to try them.

    ``explicit`` is one URL, a comma-separated list of URLs, or a sequence of them; when it is
    None or empty, ``$AGENT_REACH_GATEWAY`` (same forms, e.g.
    ``http://10.0.0.1:7700,http://10.0.0.2:7700``), else ``http://127.0.0.1:7700``. Each URL
    must be http(s) with a host (and a valid port, if any); spaces and trailing slashes are
    stripped, empty items between commas skipped, and repeats dropped (the first place counts).
    Raises ValueError naming the first URL that is not usable.

    The one place the SDKs read that variable (when called, never at import).
    """
    given: Sequence[str] = (explicit,) if isinstance(explicit, str) else explicit or ()
    if not any(item.strip(" ,") for item in given):
        given = ((os.environ if env is None else env).get(GATEWAY_ENV) or DEFAULT_GATEWAY_URL,)
    urls: list[str] = []
    for item in given:
        for part in item.split(","):
            url = part.strip()
            if url and (url := _check_gateway_url(url).rstrip("/")) not in urls:
                urls.append(url)
    if not urls:
        raise ValueError(f"no gateway URL in {given!r}")
    return tuple(urls)


def _check_gateway_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"gateway URL must start with http:// or https://, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number or too big)
    except ValueError as exc:
        raise ValueError(f"gateway URL {url!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"gateway URL {url!r} has no host")
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
    registry_prefix: str = "agent-reach"
    workers: int = 1
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
        if self.workers > 1 and self.registry.startswith("memory:"):
            raise ValueError(
                f"--workers {self.workers} needs a shared registry: each process would have its"
                " own memory:// registry, and an agent registered through one would be unknown to"
                " the others; use --registry redis://HOST:PORT/DB"
            )
        if self.max_body_bytes < 1024:
            raise ValueError("max-body-bytes must be at least 1024")
