"""Gateway settings: one frozen value made at the entry point, passed down explicitly."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from agent_reach.core.model import Thresholds
from agent_reach.core.names import is_domain
from agent_reach.core.netguard import AddressGuard
from agent_reach.errors import ConfigError
from agent_reach.wire.federation import gateway_url_refusal

__all__ = [
    "DEFAULT_GATEWAY_URL",
    "DEFAULT_NATS_PREFIX",
    "NATS_OPERATIONS",
    "SERVE_ENV",
    "GatewaySettings",
    "NatsGateway",
    "gateway_token",
    "gateway_url",
    "gateway_urls",
    "is_loopback",
    "nats_gateway",
    "nats_servers",
    "not_over_nats",
    "redacted",
]

DEFAULT_PURGE_AFTER_S = 3600.0
DEFAULT_GATEWAY_URL = "http://127.0.0.1:7700"
GATEWAY_ENV = "AGENT_REACH_GATEWAY"
SERVE_ENV = "AGENT_REACH_SERVE"  # where SDK agents serve deliveries: http, or NATS servers
DEFAULT_NATS_PREFIX = "agent-reach"  # the gateway's --nats-prefix default
# what the gateway serves over NATS (edges/nats): PREFIX.v1.<operation>
# the gateway's API over NATS (PREFIX.v1.OP); keys (the JWKS) beyond the contract, for agents
# that verify deliveries with nothing but NATS
NATS_OPERATIONS = ("register", "heartbeat", "deregister", "send", "keys")
_HTTP_SCHEMES = ("http://", "https://")
_NATS_SCHEMES = ("nats://", "tls://")


def _nats_host(url: str) -> str | None:
    """The host of a NATS server URL (None when it has none: refused elsewhere)."""
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is reachable only from this machine."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve anywhere


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

    Or, for gateways reached over NATS: ``nats://[USER:PASSWORD@]HOST:PORT[/PREFIX]`` (or
    ``tls://``), PREFIX being the gateways' ``--nats-prefix`` (default ``agent-reach``).
    Several such URLs are the servers of one NATS system (the gateways serving PREFIX share
    the requests as a queue group; the client does not fail over between them), so they must
    name one prefix; :func:`nats_gateway` reads them. A list is either http(s) or NATS.

    Raises ConfigError naming the first URL that is not usable (or the two that do not go
    together). The one place the SDKs read that variable (when called, never at import).
    """
    given: Sequence[str] = (explicit,) if isinstance(explicit, str) else explicit or ()
    if not any(item.strip(" ,") for item in given):
        given = ((os.environ if env is None else env).get(GATEWAY_ENV) or DEFAULT_GATEWAY_URL,)
    urls: list[str] = []
    for item in given:
        for part in item.split(","):
            url = part.strip()
            if url and (url := _check_gateway_url(url).rstrip("/")) not in urls:
                if urls:
                    _check_together(urls[0], url)
                urls.append(url)
    if not urls:
        raise ConfigError(f"no gateway URL in {given!r}")
    nats_gateway(urls)  # NATS ones: one prefix
    return tuple(urls)


@dataclass(frozen=True, slots=True)
class NatsGateway:
    """Gateways reached over one NATS system: its ``servers``
    (``nats://[USER:PASSWORD@]HOST:PORT``, no path) and the gateways' ``prefix``."""

    servers: tuple[str, ...]
    prefix: str

    def subject(self, operation: str) -> str:
        """The subject of one of :data:`NATS_OPERATIONS`: ``PREFIX.v1.OPERATION``."""
        return f"{self.prefix}.v1.{operation}"


def nats_servers(serve: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The NATS servers an agent serves its deliveries through; () for its own HTTP server.

    ``serve`` is ``"http"`` or ``nats://HOST:PORT`` (``tls://`` too; several comma-separated,
    of one NATS system); when it is None, ``$AGENT_REACH_SERVE`` (same forms; empty or unset:
    HTTP). ConfigError for anything else. The one place the SDK reads that variable (when an
    Agent is made, never at import): the switch that moves the demo agents and the end-to-end
    suite to NATS without a change of code.
    """
    source = "serve"
    if serve is None:
        serve, source = (os.environ if env is None else env).get(SERVE_ENV, ""), SERVE_ENV
    given = serve.strip()
    if given.lower() in ("", "http"):
        return ()
    servers = tuple(part.strip() for part in given.split(",") if part.strip())
    if not all(url.startswith(("nats://", "tls://")) for url in servers):
        raise ConfigError(
            f"{source} must be 'http' or nats://HOST:PORT[,nats://...], got {given!r}",
            source=source,
        )
    return servers


def nats_gateway(urls: Sequence[str]) -> NatsGateway | None:
    """The NATS system and prefix of gateway URLs (as :func:`gateway_urls` gives them), or
    None when they are http(s) ones. ConfigError for a list that is not one or the other, or
    whose NATS URLs name different prefixes."""
    if not urls or not urls[0].startswith(_NATS_SCHEMES):
        for url in urls:
            _check_together(urls[0], url)
        return None
    servers: list[str] = []
    prefixes: dict[str, str] = {}
    for url in urls:
        _check_together(urls[0], url)
        server, prefix = _nats_parts(url)
        prefixes.setdefault(prefix, url)
        if server not in servers:
            servers.append(server)
    if len(prefixes) > 1:
        named = ", ".join(f"{prefix!r} ({url})" for prefix, url in prefixes.items())
        raise ConfigError(
            f"NATS gateway URLs name different prefixes: {named}; they are the servers of one"
            " NATS system and must share the gateways' --nats-prefix"
        )
    return NatsGateway(tuple(servers), next(iter(prefixes)))


def not_over_nats(what: str) -> ConfigError:
    """The refusal of a call or command (``what``: ``GET /v1/agents``, ``agents``) that the
    gateway does not serve over NATS."""
    return ConfigError(
        f"{what} is not served over NATS: over NATS the gateway serves only register,"
        " heartbeat, deregister, send and its public keys; use an http:// gateway for the rest"
    )


def _check_gateway_url(url: str) -> str:
    nats = url.startswith(_NATS_SCHEMES)
    if not (nats or url.startswith(_HTTP_SCHEMES)):
        raise ConfigError(
            "gateway URL must start with http:// or https:// (or nats:// or tls:// for"
            f" gateways over NATS), got {redacted(url)!r}"
        )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number or too big
    except ValueError as exc:
        raise ConfigError(f"gateway URL {redacted(url)!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"gateway URL {redacted(url)!r} has no host")
    if nats:
        if port == 0 or parts.query or parts.fragment:
            raise ConfigError(
                f"gateway URL {redacted(url)!r}: use nats://[USER:PASSWORD@]HOST:PORT[/PREFIX]"
            )
        _nats_parts(url)  # the prefix
    return url


def _check_together(first: str, url: str) -> None:
    if first.startswith(_NATS_SCHEMES) != url.startswith(_NATS_SCHEMES):
        raise ConfigError(
            f"gateway URLs cannot mix http(s) and NATS: got {redacted(url)!r} after"
            f" {redacted(first)!r} (a list is either gateways over HTTP or the servers of one"
            " NATS system)"
        )


_PREFIX_TOKEN = re.compile(r"[!-~]+")  # printable ASCII, no space


def _nats_parts(url: str) -> tuple[str, str]:
    """(the server address of a NATS gateway URL, the prefix of its path or the default)."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    prefix = path.rstrip("/") or DEFAULT_NATS_PREFIX
    tokens = prefix.split(".")
    if (
        prefix.startswith("$")
        or not all(_PREFIX_TOKEN.fullmatch(token) for token in tokens)
        or any(c in prefix for c in "*>/%")
    ):
        raise ConfigError(
            f"gateway URL {redacted(url)!r}: the prefix {prefix!r} (the gateways'"
            " --nats-prefix) must be a NATS subject without wildcards, spaces or a leading $"
        )
    return f"{scheme}://{netloc}", prefix


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
    # the intent dictionary (docs/intents.md): a TOML file, and what registration does with
    # tags outside it (None: "warn" with a file, "open" without)
    intents: str | None = None
    intent_mode: str | None = None
    matcher: str = "semantic"  # the fallback matcher: semantic, lexical or none
    purge_after: float | None = None  # None: max(1 hour, down-after)
    max_body_bytes: int = 1 << 20
    default_timeout_ms: int = 8000
    answer_margin_ms: float = 5.0
    trace_capacity: int = 10_000
    retry_budget_ratio: float = 0.1
    retry_budget_min_per_s: float = 10.0
    log_level: str = "INFO"
    # access control (docs/security.md)
    auth: str = "open"  # "open" (loopback only, unless insecure_open_mode) or "tokens"
    keys: str | None = None  # token mode: the signing keys' directory
    policy: str | None = None  # token mode: the policy file (TOML)
    insecure_open_mode: bool = False  # open mode off loopback: anyone may do anything
    rate_limit: float | None = None  # requests a second per sender (None: no limit)
    rate_burst: float | None = None  # bucket size [max(1, rate_limit)]
    endpoint_networks: str | None = None  # CIDRs endpoint URLs may point into [any but denied]
    endpoint_token_ttl: float = 900.0  # seconds an endpoint token lives (renewed by heartbeats)
    reload_interval: float = 2.0  # seconds between checks of the key directory and policy file
    # NATS (docs/nats.md): servers, comma-separated nats://HOST:PORT (None: no NATS)
    nats: str | None = None
    nats_prefix: str = "agent-reach"  # subjects of the gateway's own API over NATS
    # A2A (docs/a2a.md): a JWKS file of the keys signed Agent Cards are verified with
    a2a_card_keys: str | None = None
    # MCP at /mcp (docs/mcp.md): sessions open at once (0: no /mcp), seconds one may sit idle
    mcp_max_sessions: int = 100
    mcp_session_idle: float = 600.0
    # bounds on what callers can make the gateway hold (docs/operations.md)
    max_connections: int = 0  # open HTTP connections at most (0: the open-files limit - 256)
    idle_timeout: float = 30.0  # seconds a connection may send nothing (before or between)
    read_timeout: float = 30.0  # seconds a request may take to arrive whole, from its first byte
    max_inflight: int = 1024  # requests in delivery at once across the gateway (admission)
    max_inflight_per_endpoint: int = 64  # attempts open to one endpoint (more wait for a slot)
    max_endpoints: int = 100_000  # records the registry holds at most (down ones count too)
    register_rate_limit: float = 50.0  # registrations a second per address/subject (0: none)
    register_rate_burst: float = 500.0  # that bucket's size
    # federation (docs/federation.md)
    domain: str = "local"
    directory: str | None = None  # the directory's URL (None: no federation)
    summary_interval: float = 5.0  # seconds between two publications of the summary
    advertise_url: str | None = None  # where other domains forward to [http://HOST:PORT]
    peer_token: str | None = None  # token mode: presented to the directory and to peers

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
        """Raise ConfigError naming the first setting that cannot work."""
        t = self.thresholds  # validates the health thresholds
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}")
        if not 0 < self.confidence_threshold <= 1:
            raise ConfigError("confidence-threshold must be in (0, 1]")
        if self.intent_mode not in (None, "open", "warn", "strict"):
            raise ConfigError(
                f"intent-mode must be open, warn or strict, got {self.intent_mode!r}",
                source="intent-mode",
            )
        if self.intent_mode in ("warn", "strict") and not self.intents:
            raise ConfigError(
                f"intent-mode {self.intent_mode} needs a dictionary: --intents FILE",
                source="intent-mode",
            )
        if self.matcher not in ("semantic", "lexical", "none") and ":" not in self.matcher:
            raise ConfigError(
                f"matcher must be semantic, lexical, none or MODULE:CALLABLE, got {self.matcher!r}",
                source="matcher",
            )
        if self.overhead_reserve_ms < 0:
            raise ConfigError("overhead-reserve-ms must be >= 0")
        if self.purge_after is not None and self.purge_after < t.down_after:
            raise ConfigError(
                f"purge-after ({self.purge_after}) must be at least down-after ({t.down_after}):"
                " only down records are purged"
            )
        if self.workers > 1 and self.registry.startswith("memory:"):
            raise ConfigError(
                f"--workers {self.workers} needs a shared registry: each process would have its"
                " own memory:// registry, and an agent registered through one would be unknown to"
                " the others; use --registry redis://HOST:PORT/DB"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError("max-body-bytes must be at least 1024")
        if self.max_connections < 0:
            raise ConfigError("max-connections must be 0 (the open-files limit less 256) or more")
        if not 0 < self.idle_timeout < float("inf"):
            raise ConfigError("idle-timeout must be a positive number of seconds")
        if not 0 < self.read_timeout < float("inf"):
            raise ConfigError("read-timeout must be a positive number of seconds")
        if self.mcp_max_sessions < 0:
            raise ConfigError("mcp-max-sessions must be 0 (no /mcp) or more")
        if not 0 < self.mcp_session_idle < float("inf"):
            raise ConfigError("mcp-session-idle must be a positive number of seconds")
        self._check_federation()
        self._check_access()

    def _check_federation(self) -> None:
        if not is_domain(self.domain):
            raise ConfigError(
                f"domain {self.domain!r} must be named as an endpoint NAME is:"
                " [a-z0-9][a-z0-9._-]{0,127}",
                source="domain",
            )
        for name, url in (("directory", self.directory), ("advertise-url", self.advertise_url)):
            refusal = None if url is None else gateway_url_refusal(url)
            if refusal is not None:
                raise ConfigError(f"{name} {refusal}, got {url!r}", source=name)
        if not 0 < self.summary_interval < float("inf"):
            raise ConfigError("summary-interval must be a positive number of seconds")
        if self.directory and self.advertise_url is None and self.host in ("0.0.0.0", "::", ""):
            raise ConfigError(
                f"--directory with --host {self.host or '(all)'} needs --advertise-url: other"
                " domains cannot forward to a wildcard address",
                source="advertise-url",
            )

    def _check_access(self) -> None:
        if self.auth not in ("open", "tokens"):
            raise ConfigError(f"auth must be 'open' or 'tokens', got {self.auth!r}")
        if self.auth == "tokens":
            if not self.keys:
                raise ConfigError(
                    "--auth tokens needs --keys DIR (make one with `agent-reach auth keygen"
                    " --keys DIR`)"
                )
            if not self.policy:
                raise ConfigError(
                    "--auth tokens needs --policy FILE: token mode denies by default, and"
                    " without a policy nothing could register or send (docs/security.md)"
                )
        elif not is_loopback(self.host) and not self.insecure_open_mode:
            raise ConfigError(
                f"refusing to serve in open mode on {self.host}: without auth anyone who can"
                " reach this address may register, deregister and send as any agent. Use"
                " --auth tokens (docs/security.md), bind to 127.0.0.1, or pass"
                " --insecure-open-mode to accept the risk"
            )
        if self.auth == "open" and not self.insecure_open_mode:
            for url in self.nats_servers:
                host = _nats_host(url)
                if host is not None and not is_loopback(host):
                    raise ConfigError(
                        f"refusing to serve in open mode over NATS at {redacted(url)}: without"
                        " auth any client of that NATS system may register, deregister and"
                        " send as any agent. Use --auth tokens (docs/security.md), a NATS"
                        " server on 127.0.0.1, or pass --insecure-open-mode to accept the risk",
                        source="nats",
                    )
        if self.rate_limit is not None and self.rate_limit <= 0:
            raise ConfigError("rate-limit must be > 0 requests a second")
        if self.rate_burst is not None and self.rate_burst < 1:
            raise ConfigError("rate-burst must be at least 1")
        if self.auth == "tokens" and self.endpoint_token_ttl < 2 * self.heartbeat_interval:
            raise ConfigError(
                "endpoint-token-ttl must be at least two heartbeat intervals: heartbeats renew"
                " the token once half of it is left"
            )
        if self.reload_interval <= 0:
            raise ConfigError("reload-interval must be > 0")
        for url in self.nats_servers:
            if not url.startswith(("nats://", "tls://")):
                raise ConfigError(f"nats: {url!r} is not a nats:// URL", source="nats")
        if (
            not self.nats_prefix
            or any(c in self.nats_prefix for c in " *>")
            or (self.nats_prefix.startswith("$"))
        ):
            raise ConfigError(
                f"nats-prefix {self.nats_prefix!r} must be a subject without wildcards",
                source="nats-prefix",
            )
        if self.max_inflight < 1:
            raise ConfigError("max-inflight must be at least 1", source="max-inflight")
        if self.max_inflight_per_endpoint < 1:
            raise ConfigError(
                "max-inflight-per-endpoint must be at least 1", source="max-inflight-per-endpoint"
            )
        if self.max_endpoints < 1:
            raise ConfigError("max-endpoints must be at least 1")
        if self.register_rate_limit < 0:
            raise ConfigError("register-rate-limit must be >= 0 (0: no limit)")
        if self.register_rate_burst < 1:
            raise ConfigError("register-rate-burst must be at least 1")
        try:
            AddressGuard.from_csv(self.endpoint_networks)
        except ValueError as exc:  # names the bad network
            raise ConfigError(f"endpoint-networks: {exc}", source="endpoint-networks") from None

    @property
    def effective_intent_mode(self) -> str:
        """``intent_mode``, or its default: ``warn`` with a dictionary, ``open`` without."""
        if self.intent_mode is not None:
            return self.intent_mode
        return "warn" if self.intents else "open"

    @property
    def nats_servers(self) -> list[str]:
        """The NATS servers of ``--nats`` (empty: no NATS)."""
        return [u.strip() for u in (self.nats or "").split(",") if u.strip()]

    @property
    def open_mode(self) -> bool:
        """Whether anyone may do anything (no tokens)."""
        return self.auth == "open"


TOKEN_ENV = "AGENT_REACH_TOKEN"


def gateway_token(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token clients and agents present to a gateway in token mode: ``explicit``,
    else ``$AGENT_REACH_TOKEN``, else None (open mode). The one place the SDKs read it."""
    if explicit:
        return explicit.strip()
    value = (os.environ if env is None else env).get(TOKEN_ENV, "").strip()
    return value or None
