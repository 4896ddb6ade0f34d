"""The federation directory (``agent-reach directory``): where each domain's gateway publishes
its summary and takes the others' (CONTRACT.md v1.1, "Federation"; docs/cli.md).

HTTP API, JSON, errors in the contract's shape ``{"ok": false, "error", "detail"}`` from the one
table of :mod:`agent_reach.wire.status`:

- ``PUT /v1/summaries/DOMAIN``, body a :class:`~agent_reach.wire.federation.DomainSummary` whose
  ``domain`` is DOMAIN: kept as received now; the answer is a
  :class:`~agent_reach.wire.federation.DirectoryAnswer` of the OTHER domains' fresh summaries.
- ``GET /v1/summaries``: every fresh summary.
- An answer carries at most about :data:`MAX_ANSWER_SUMMARY_BYTES` of summaries (the smallest first;
  the others are left out of it and logged ``directory.answer_trimmed``): under what a gateway
  reads (64 MiB, past which it would take none), whatever the domains publish.
- ``GET /healthz``: ``{"ok": true, "store": "memory"|"redis", "domains": N}`` (no token).

Invariants:

- A refusal changes nothing: the token, the path, the size and the body are all checked before
  the store is touched.
- Token mode: only a ``peer`` token whose subject is DOMAIN publishes DOMAIN's summary (401
  without a valid token, 403 for another kind or another domain); a ``peer`` or ``operator``
  token reads. Open mode: loopback only unless ``--insecure-open-mode`` (as ``serve``), and what
  a web page could send is refused (:class:`~agent_reach.gateway.guards.BrowserGuard`).
- Nothing unexpected takes the process down: it is a 500 ``internal_error``, logged once with
  its traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from agent_reach.auth.tokens import Claims, Kind, TokenService
from agent_reach.clock import Clock, SystemClock
from agent_reach.core.names import is_domain
from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    ConfigError,
    Forbidden,
    InternalError,
    InvalidRequest,
    KeyDirectoryError,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RegistryFull,
    Unauthorized,
)
from agent_reach.federation.dirstore import SummaryStore, open_store
from agent_reach.observability.logs import Throttle, log
from agent_reach.settings import is_loopback
from agent_reach.wire.bodies import encode
from agent_reach.wire.federation import (
    DirectoryAnswer,
    DirectoryEntry,
    decode_summary,
    estimated_bytes,
)
from agent_reach.wire.status import headers_for, status_for

__all__ = ["MAX_ANSWER_SUMMARY_BYTES", "Directory", "DirectorySettings", "fit_answer"]

KEYS_CHECK_S = 2.0  # token mode: how often the key directory is checked for changes
_BEARERS = frozenset(Kind) - {Kind.DELIVERY}
_PUBLISHERS = frozenset({Kind.PEER})
_READERS = frozenset({Kind.PEER, Kind.OPERATOR})
_JSON = {"Content-Type": "application/json"}
_SUMMARIES = "/v1/summaries"
MAX_ANSWER_SUMMARY_BYTES = 48 << 20  # summaries in one answer, about (estimated_bytes)
T = TypeVar("T")


@dataclass(frozen=True)
class DirectorySettings:
    """The directory's settings; the defaults here are the CLI's."""

    host: str = "127.0.0.1"
    port: int = 7800
    registry: str = "memory://"
    registry_prefix: str = "agent-reach"
    auth: str = "open"
    keys: str | None = None
    summary_ttl: float = 60.0
    max_body_bytes: int = 16 << 20
    max_domains: int = 10_000
    insecure_open_mode: bool = False
    log_level: str = "INFO"

    def check(self) -> None:
        """ConfigError naming the first setting that cannot work."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}", source="port")
        if not 0 < self.summary_ttl < float("inf"):
            raise ConfigError("summary-ttl must be a positive number of seconds")
        if self.max_body_bytes < 1024:
            raise ConfigError("max-body-bytes must be at least 1024")
        if self.max_domains < 1:
            raise ConfigError("max-domains must be at least 1")
        if self.auth not in ("open", "tokens"):
            raise ConfigError(f"auth must be 'open' or 'tokens', got {self.auth!r}")
        if self.auth == "tokens" and not self.keys:
            raise ConfigError(
                "--auth tokens needs --keys DIR (the key directory the peer tokens are signed"
                " with: agent-reach auth keygen --keys DIR)"
            )
        if self.auth == "open" and not is_loopback(self.host) and not self.insecure_open_mode:
            raise ConfigError(
                f"refusing to serve the directory in open mode on {self.host}: without auth "
                "anyone who can reach this address may publish any domain's summary and steer"
                " requests to a gateway of their own. Use --auth tokens (docs/security.md),"
                " bind to 127.0.0.1, or pass --insecure-open-mode to accept the risk"
            )


class Directory:
    """The directory over one store: :meth:`handle` is the aiohttp low-level handler."""

    def __init__(
        self,
        settings: DirectorySettings,
        *,
        store: SummaryStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.store = store or open_store(
            settings.registry,
            prefix=settings.registry_prefix,
            ttl_s=settings.summary_ttl,
            max_domains=settings.max_domains,
            clock=self.clock,
        )
        self.tokens: TokenService | None = None
        self._keys_checked = 0.0
        self._store_ok = True
        self._throttle = Throttle(monotonic=self.clock.monotonic)
        # domain -> ((its summary's at, its number of tags), its estimated size)
        self._sizes: dict[str, tuple[tuple[float, int], int]] = {}
        self._browsers: Any = None
        if settings.auth == "open":
            from agent_reach.gateway.guards import BrowserGuard

            self._browsers = BrowserGuard(is_loopback(settings.host))
        self._routes: dict[tuple[str, str], Callable[[web.BaseRequest, str], Awaitable[Any]]] = {
            ("GET", _SUMMARIES): self._summaries,
            ("GET", "/healthz"): self._health,
        }

    async def start(self) -> None:
        """Load the keys (token mode: KeyDirectoryError, exit 2) and connect the store
        (BackendUnavailable, exit 1)."""
        if self.settings.auth == "tokens":
            from agent_reach.auth.keys import KeyRing

            assert self.settings.keys is not None
            ring = KeyRing(self.settings.keys)
            ring.load()
            self.tokens = TokenService(ring)
            self._keys_checked = self.clock.monotonic()
        await self.store.start()

    async def close(self) -> None:
        """Let go of the store."""
        await self.store.close()

    # --- dispatch and the one error table --------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer ``request``; every error becomes the contract's error body."""
        path = request.path
        try:
            handler, arg = self._resolve(request.method, path)
            body = await handler(request, arg)
        except AgentReachError as exc:
            return _json(exc.to_body(), status_for(exc), headers_for(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "directory.unhandled", path=path, exc_info=True)
            fault = InternalError("unexpected error; see the directory's log")
            return _json(fault.to_body(), status_for(fault))
        return _json(body)

    def _resolve(
        self, method: str, path: str
    ) -> tuple[Callable[[web.BaseRequest, str], Awaitable[Any]], str]:
        exact = self._routes.get((method, path))
        if exact is not None:
            return exact, ""
        prefix = _SUMMARIES + "/"
        if path.startswith(prefix) and len(path) > len(prefix):
            if method != "PUT":
                raise MethodNotAllowed(f"{method} is not allowed on {path}; PUT publishes")
            return self._publish, path[len(prefix) :]
        if path in (_SUMMARIES, "/healthz"):
            raise MethodNotAllowed(f"{method} is not allowed on {path}")
        raise NotFound(f"no such path: {path}")

    # --- handlers: check, call the store, answer -------------------------------------------

    async def _publish(self, request: web.BaseRequest, domain: str) -> DirectoryAnswer:
        claims = self._admit(request, _PUBLISHERS, "publish a summary")
        if not is_domain(domain):
            raise InvalidRequest(f"{domain!r} is not a domain name", field="domain")
        if claims is not None and claims.subject != domain:
            self._denied(request, claims.subject, "publish a summary", domain, 403)
            raise Forbidden(
                f"a domain cannot publish a summary in another domain's name: this peer token"
                f" is {claims.subject!r}'s, not {domain!r}'s"
            )
        summary = decode_summary(await self._body(request))
        if summary.domain != domain:
            raise InvalidRequest(
                f"the summary's domain {summary.domain!r} is not the path's {domain!r}",
                field="domain",
            )
        try:
            others, added = await self._store(self.store.publish(summary))
            self._sizes.pop(domain, None)  # measured again: the publisher chooses its at
        except RegistryFull:
            self._throttle.log(
                logging.WARNING,
                "directory.full",
                domain=domain,
                max_domains=self.settings.max_domains,
            )
            raise
        level = logging.INFO if added else logging.DEBUG
        log(
            level,
            "directory.domain_added" if added else "directory.published",
            domain=domain,
            gateway_url=summary.gateway_url,
            intents=len(summary.intents),
        )
        return DirectoryAnswer(summaries=self._within(others))

    async def _summaries(self, request: web.BaseRequest, _: str) -> DirectoryAnswer:
        self._admit(request, _READERS, "read the summaries")
        return DirectoryAnswer(summaries=self._within(await self._store(self.store.fresh())))

    def _size(self, entry: DirectoryEntry) -> int:
        """:func:`estimated_bytes` of the entry (a bound: counts are checked), computed once
        per summary (a pass over its tags), kept per domain (as many as the store keeps): by
        its ``at`` and its number of tags, and measured again after each publication here."""
        key = (entry.at, len(entry.intents))
        known = self._sizes.get(entry.domain)
        if known is not None and known[0] == key:
            return known[1]
        if len(self._sizes) >= self.settings.max_domains:
            self._sizes.clear()
        size = estimated_bytes(entry)
        self._sizes[entry.domain] = (key, size)
        return size

    def _within(self, entries: list[DirectoryEntry]) -> list[DirectoryEntry]:
        """``entries`` within :data:`MAX_ANSWER_SUMMARY_BYTES`, the smallest first: a few domains
        with huge summaries cannot crowd the others out of every gateway's view."""
        kept = fit_answer(
            entries, [self._size(entry) for entry in entries], MAX_ANSWER_SUMMARY_BYTES
        )
        if len(kept) == len(entries):
            return entries
        self._throttle.log(
            logging.WARNING,
            "directory.answer_trimmed",
            left_out=len(entries) - len(kept),
            domains=len(entries),
            max_bytes=MAX_ANSWER_SUMMARY_BYTES,
        )
        return kept

    async def _health(self, request: web.BaseRequest, _: str) -> dict[str, Any]:
        domains = await self._store(self.store.count())
        return {"ok": True, "store": self.store.kind, "domains": domains}

    # --- access ----------------------------------------------------------------------------

    def _admit(
        self, request: web.BaseRequest, kinds: frozenset[Kind], action: str
    ) -> Claims | None:
        """The caller's claims (None in open mode, once a web page is ruled out)."""
        headers = request.headers
        if self.tokens is None:
            try:
                self._browsers.check(headers.get("Host"), headers.get("Origin"))
            except Forbidden as exc:
                self._denied(request, "anonymous", action, exc.detail, 403)
                raise
            return None
        self._reload_keys()
        authorization = headers.get("Authorization")
        try:
            if not authorization:
                raise Unauthorized(
                    f"a bearer token is needed to {action} (Authorization: Bearer ...)"
                )
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
            claims = self.tokens.verify(token.strip(), _BEARERS)
        except Unauthorized as exc:
            self._denied(request, "anonymous", action, exc.detail, 401)
            raise
        if claims.kind not in kinds:
            wanted = " or ".join(sorted(k.value for k in kinds))
            why = f"{_a(claims.kind)} token cannot {action}; it needs {_a(wanted)} token"
            self._denied(request, claims.subject, action, why, 403)
            raise Forbidden(why)
        return claims

    def _denied(
        self, request: web.BaseRequest, who: str, action: str, why: str, status: int
    ) -> None:
        self._throttle.log(
            logging.WARNING,
            "directory.denied",
            who=who,
            remote=request.remote or "?",
            action=action,
            reason=why,
            status=status,
        )

    def _reload_keys(self) -> None:
        """Token mode: the key directory re-read when it changed (at most every
        :data:`KEYS_CHECK_S`); a bad one is logged and the keys loaded before stay."""
        now = self.clock.monotonic()
        if self.tokens is None or now - self._keys_checked < KEYS_CHECK_S:
            return
        self._keys_checked = now
        ring = self.tokens.keys
        if not ring.changed():
            return
        try:
            if ring.load():
                log(logging.INFO, "directory.keys_reloaded", keys=len(ring.keys))
        except KeyDirectoryError as exc:
            log(logging.WARNING, "directory.keys_refused", error=str(exc))

    # --- the request's body, the store's state ---------------------------------------------

    async def _body(self, request: web.BaseRequest) -> bytes:
        """The body, refused past ``max_body_bytes`` without reading it all."""
        limit = self.settings.max_body_bytes
        length = request.content_length
        if length is not None:
            if length > limit:
                raise PayloadTooLarge(f"body over the {limit} byte limit (--max-body-bytes)")
            return await request.content.read()  # ends at Content-Length
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body over the {limit} byte limit (--max-body-bytes)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _store(self, call: Awaitable[T]) -> T:
        """``call`` on the store, with one log line when the store goes away and one when it
        comes back."""
        try:
            result = await call
        except BackendUnavailable as exc:
            if self._store_ok:
                self._store_ok = False
                log(logging.WARNING, "directory.store_unavailable", error=str(exc))
            raise
        if not self._store_ok:
            self._store_ok = True
            log(logging.WARNING, "directory.store_recovered")
        return result


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(body), status=status, headers={**_JSON, **(headers or {})})


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def fit_answer(
    entries: list[DirectoryEntry], sizes: list[int], max_bytes: int
) -> list[DirectoryEntry]:
    """The entries whose ``sizes`` add up to at most ``max_bytes``, taken smallest first (all
    of them, in their order, when they fit)."""
    if sum(sizes) <= max_bytes:
        return entries
    kept: list[DirectoryEntry] = []
    total = 0
    for size, entry in sorted(zip(sizes, entries, strict=True), key=lambda item: item[0]):
        total += size
        if total > max_bytes:
            break
        kept.append(entry)
    return kept
