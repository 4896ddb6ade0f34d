"""Access control at the gateway's edge: who may register, heartbeat, deregister, send, read.

Two modes (docs/security.md):

- **open** (the default, loopback only unless ``--insecure-open-mode``): no credentials; anyone
  who can reach the port may do anything, as before token mode existed.
- **tokens**: every API call but ``/healthz``, ``/metrics``, ``/v1/keys`` and the dashboard's
  static files needs ``Authorization: Bearer TOKEN`` (:mod:`agent_reach.auth.tokens`), and the
  policy file (:mod:`agent_reach.core.policy`) says, deny by default, who may reach which
  intents and which ids may claim which intents.

Invariants:
- A refusal changes nothing: every check here runs before the registry or a transport is
  touched, and raises ``unauthorized`` (401: no or bad credentials) or ``forbidden`` (403: good
  credentials, not allowed) with a reason.
- A live endpoint id belongs to its current registration: the endpoint token names it (``sub``)
  and the registration (``gen``, kept in the record as ``owner``). Only that token heartbeats,
  deregisters or re-registers it; an enrollment may take an id only while it is free (absent or
  down), which the registry checks in one step with the write. An operator may deregister any
  id.
- ``sender`` is the token's subject; a body that names another sender is refused.
- Every denial and every admin action is one JSON log line (``audit.denied``,
  ``audit.admin``) with who, what, why and the trace id where one applies; refusals for a
  limit (429, 503) at most a line a second for each action and status, with ``suppressed``.
- Rate limits (per sender; per remote address for failed authentication, so that a flood of
  bad tokens costs a signature check at most ``rate`` times a second) answer 429 with the
  seconds to wait.
- The key directory and the policy file are re-read when they change (polled every
  ``reload_interval`` seconds, or ``POST /v1/reload``; :mod:`.authfiles`); a bad one is refused
  with the line at fault and the old one stays in force.
- Open mode's browser check and the endpoint URL check live in :mod:`.guards`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, NoReturn

from agent_reach.auth.tokens import Claims, Kind, TokenService
from agent_reach.core.model import EndpointRecord
from agent_reach.core.netguard import AddressGuard
from agent_reach.core.policy import (
    Policy,
    scope_allows,
)
from agent_reach.core.ratelimit import RateLimiter
from agent_reach.errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthorized,
)
from agent_reach.gateway.authfiles import AuthFiles
from agent_reach.gateway.guards import BrowserGuard, endpoint_url_refusal
from agent_reach.gateway.principal import (
    BEARERS,
    EndpointGrant,
    Principal,
    with_article,
)
from agent_reach.gateway.router import RouteScope
from agent_reach.observability.logs import Throttle, log
from agent_reach.settings import GatewaySettings, is_loopback
from agent_reach.wire.bodies import TokenRequest

if TYPE_CHECKING:
    from agent_reach.gateway.service import Caller

__all__ = ["Access", "earlier_registration"]

_NO_POLICY = Policy.empty()
_ANONYMOUS_KEPT = 4096  # open mode: principals kept by address (all dropped past it)
_PRINCIPALS_KEPT = 4096  # token mode: verified principals kept (all dropped past it)


def earlier_registration(endpoint_id: str) -> str:
    """Why an endpoint token may not act on the id's current registration."""
    return f"this endpoint token belongs to an earlier registration of {endpoint_id}"


def _failures_key(address: str) -> str:
    """The bucket of bad credentials from ``address``. Over NATS the address is the request's
    reply inbox, which its sender picks: one inbox a request would get past the limit (and cost
    a signature check each), so every caller over NATS shares one bucket of failures (callers
    with good tokens are not limited by it; one with a token not seen before waits while it is
    empty)."""
    return "unauthenticated@nats" if address.startswith("nats:") else f"unauthenticated@{address}"


class Access:
    """The gateway's access control; see the module docstring.

    ``wall`` is the clock of token times (unix seconds), ``monotonic`` that of rate limits;
    ``on_denied(action, status)`` is called for each denial (the metric).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_denied: Callable[[str, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_denied = on_denied  # (action, status): the denial metric
        # refusals for a limit (429, 503) any client can cause in a flood: a line a second each
        self._limit_lines = Throttle(monotonic=monotonic)
        self.open = settings.open_mode
        self.wall = wall
        self.monotonic = monotonic
        self.files: AuthFiles | None = None
        if not self.open:
            assert settings.keys is not None and settings.policy is not None  # settings.check()
            self.files = AuthFiles(settings.keys, settings.policy, wall=wall)
        self.tokens: TokenService | None = None if self.files is None else self.files.tokens
        self.addresses = AddressGuard.from_csv(settings.endpoint_networks)
        self.limiter: RateLimiter | None = None
        if settings.rate_limit is not None:
            burst = settings.rate_burst or max(1.0, settings.rate_limit)
            self.limiter = RateLimiter(settings.rate_limit, burst)
        self.registrations: RateLimiter | None = None
        if settings.register_rate_limit > 0:
            self.registrations = RateLimiter(
                settings.register_rate_limit, max(1.0, float(settings.register_rate_burst))
            )
        self.endpoint_ttl_s = settings.endpoint_token_ttl
        self._browsers = BrowserGuard(is_loopback(settings.host)) if self.open else None
        self._anonymous: dict[str, Principal] = {}  # open mode: one per address, kept
        # token mode: by (Authorization header, address), verified (TokenService.current)
        self._principals: dict[tuple[str | None, str], Principal] = {}
        self.principals_cleared = 0  # either table cleared at its bound (a metric)

    # --- loading and reloading -------------------------------------------------------------

    def load(self) -> None:
        """First load of keys and policy (token mode; ValueError when they cannot be used: the
        gateway does not start); in open mode, the warning line."""
        if self.files is None:
            log(
                logging.WARNING,
                "auth.open_mode",
                detail="no credentials required: anyone who can reach this address may "
                "register, deregister and send as any agent (docs/security.md)",
                host=self.settings.host,
            )
            return
        self.files.load()

    @property
    def policy(self) -> Policy:
        """The policy in force (empty, so denying everything, in open mode: not consulted)."""
        return self.files.policy if self.files is not None else _NO_POLICY

    def reload(self) -> dict[str, Any]:
        """Re-read the keys and the policy where they changed (:meth:`AuthFiles.reload`)."""
        if self.files is None:
            return {"ok": True, "mode": "open"}
        return self.files.reload()

    def poll(self) -> bool:
        """One look at the key directory and the policy file (token mode; the node's reloader
        calls it every ``reload_interval``): reload what changed, and say whether the policy
        changed (then the node enforces it on the ids registered). A bad file is logged and
        refused (the old one stays): False."""
        if self.files is None:
            return False
        try:
            return bool(self.reload()["policy_changed"])
        except InvalidRequest:
            return False  # logged by reload(); the old keys and policy stay in force

    def claim_allowed(self, record: EndpointRecord) -> tuple[bool, str]:
        """Whether the policy in force still lets ``record`` claim its intents (token mode)."""
        if self.open:
            return True, ""
        decision = self.policy.may_claim(record.endpoint_id, record.capabilities)
        return decision.allowed, decision.reason

    def jwks(self, caller: Caller) -> dict[str, Any]:
        """``GET /v1/keys``: the public keys tokens are signed with, to anyone; with an
        endpoint token, also its registration's delivery keys (what its deliveries' assertions
        are made with: secret, so only to that token). Credentials that do not verify are
        refused (401), not ignored: an agent must not take "no delivery key" for an answer."""
        if self.files is None:
            return {"keys": []}
        if not caller.authorization:
            return self.files.keys.jwks()
        claims = self.authenticate(caller, BEARERS, "read keys").claims
        assert claims is not None
        if claims.kind is not Kind.ENDPOINT:
            return self.files.keys.jwks()
        return self.files.keys.jwks(recipient=(claims.subject, claims.generation))

    # --- browsers, in open mode -------------------------------------------------------------

    def check_browser(
        self, host: str | None, origin: str | None, *, remote: str = "?", action: str = "request"
    ) -> None:
        """Open mode: refuse what a web page could send (:class:`~.guards.BrowserGuard`),
        with an audit line like every other denial."""
        if self._browsers is None:
            return
        try:
            self._browsers.check(host, origin)
        except Forbidden as exc:
            self.denied(f"anonymous@{remote}", action, "", exc.detail)
            raise

    # --- who is calling --------------------------------------------------------------------

    def authenticate(self, caller: Caller, kinds: Collection[Kind], action: str) -> Principal:
        """Authenticate ``caller`` for ``action``: Unauthorized without a valid bearer token,
        Forbidden when its kind may not do ``action`` (open mode: anyone, once the browser
        check has passed)."""
        address = caller.remote or "?"
        if self.open:
            self.check_browser(caller.host, caller.origin, remote=address, action=action)
            principal = self._anonymous.get(address)
            if principal is None:
                if len(self._anonymous) >= _ANONYMOUS_KEPT:
                    self._anonymous.clear()
                    self.principals_cleared += 1
                principal = self._anonymous[address] = Principal(None, address)
            return principal
        assert self.tokens is not None
        authorization = caller.authorization
        known = self._principals.get((authorization, address))
        if known is not None and known.claims is not None and self.tokens.current(known.claims):
            principal = known  # the same credentials from the same address, verified before
        else:
            principal = self._verified(authorization, address, action)
        claims = principal.claims
        assert claims is not None
        if claims.kind not in kinds:
            wanted = " or ".join(sorted(k.value for k in kinds))
            self.deny(
                principal,
                action,
                "",
                f"{with_article(claims.kind)} token cannot {action}; "
                f"it needs {with_article(wanted)} token",
            )
        return principal

    def _verified(self, authorization: str | None, address: str, action: str) -> Principal:
        """The principal of credentials not verified before (or no longer held): their
        signature checked, failures counted per address."""
        assert self.tokens is not None
        if (
            self.limiter is not None
            and not self.tokens.known((authorization or "").partition(" ")[2].strip())
            and self.limiter.available(_failures_key(address), self.monotonic()) < 1
        ):
            # this address sent bad credentials at the limit's rate: no signature check for a
            # token not seen before (one per request is what a flood of forged tokens would
            # cost) until its bucket refills; tokens verified before go on as usual
            why = "over the limit of bad credentials from this address"
            self.denied(f"anonymous@{address}", action, "", why, status=429)
            self._limit_failures(address)
        try:
            if not authorization:
                raise Unauthorized(f"{action} needs a bearer token (Authorization: Bearer ...)")
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
            claims = self.tokens.verify(token.strip(), BEARERS)
        except Unauthorized as exc:
            self.denied(f"anonymous@{address}", action, "", exc.detail, status=401)
            self._limit_failures(address)
            raise
        principal = Principal(claims, address)
        if len(self._principals) >= _PRINCIPALS_KEPT:
            self._principals.clear()
            self.principals_cleared += 1
        self._principals[authorization, address] = principal
        return principal

    def _limit_failures(self, address: str) -> None:
        if self.limiter is not None:
            wait = self.limiter.take(_failures_key(address), self.monotonic())
            if wait > 0:
                raise RateLimited(
                    "too many requests with bad credentials from this address",
                    retry_after_s=math.ceil(wait),
                )

    def limit(self, caller: Principal) -> None:
        """Take one request from the caller's bucket; RateLimited when it is empty."""
        if self.limiter is None:
            return
        key = caller.claims.subject if caller.claims is not None else f"@{caller.remote}"
        wait = self.limiter.take(key, self.monotonic())
        if wait > 0:
            self.denied(caller.who, "send", "", "rate limit", status=429)
            raise RateLimited(
                f"{caller.who} is over its rate limit of {self.settings.rate_limit:g} requests/s",
                retry_after_s=max(1, math.ceil(wait)),
            )

    def limit_registration(self, caller: Principal, endpoint_id: str) -> None:
        """Take one registration from the caller's bucket (its token's subject, else its
        address): RateLimited when it is empty, so that nobody fills the registry at will."""
        if self.registrations is None:
            return
        key = caller.claims.subject if caller.claims is not None else f"@{caller.remote}"
        wait = self.registrations.take(key, self.monotonic())
        if wait > 0:
            self.denied(caller.who, "register", endpoint_id, "registration rate limit", status=429)
            raise RateLimited(
                f"{caller.who} is over the registration rate limit of "
                f"{self.settings.register_rate_limit:g} a second",
                retry_after_s=max(1, math.ceil(wait)),
            )

    # --- audit -----------------------------------------------------------------------------

    def denied(
        self,
        who: str,
        action: str,
        target: str,
        why: str,
        *,
        status: int = 403,
    ) -> None:
        """Log one denial (``audit.denied``) and count it. Refusals for a limit (429 rate
        limited, 503 registry full) are logged at most once a second for each action and
        status, the line's ``suppressed`` counting those held back since the last (each is
        counted in the metric); refusals of identity or permission (401, 403) each have their
        line."""
        if self._on_denied is not None:
            self._on_denied(action, status)
        fields: dict[str, Any] = {}
        if status in (429, 503):
            held = self._limit_lines.take(f"{action} {status}")
            if held is None:
                return
            fields["suppressed"] = held
        log(
            logging.WARNING,
            "audit.denied",
            who=who,
            action=action,
            target=target,
            why=why,
            status=status,
            **fields,
        )  # the request's trace_id is on the line (bound by the service)

    def deny(
        self,
        caller: Principal,
        action: str,
        target: str,
        why: str,
        **fields: Any,
    ) -> NoReturn:
        """Log the denial and raise Forbidden with ``why`` (and ``fields`` in the answer)."""
        self.denied(caller.who, action, target, why)
        raise Forbidden(why, **fields)

    def admin(self, caller: Principal, action: str, target: str, **data: Any) -> None:
        """Log one admin action (``audit.admin``); nothing in open mode."""
        if caller.claims is not None:
            log(logging.INFO, "audit.admin", who=caller.who, action=action, target=target, **data)

    # --- registration and the heartbeat line -----------------------------------------------

    def check_register(
        self,
        caller: Principal,
        endpoint_id: str,
        capabilities: list[str],
    ) -> EndpointGrant:
        """May ``caller`` register ``endpoint_id`` with ``capabilities``? Returns the grant;
        Forbidden otherwise. Whether another live registration holds the id is the registry's
        to check, where it writes (``upsert(held_within_s=...)``: one step with the write)."""
        claims = caller.claims
        if claims is None:
            return EndpointGrant(owner="")
        if claims.kind is Kind.ENROLL:
            scope = scope_allows(claims.endpoints, claims.intents, endpoint_id, capabilities)
            generation = os.urandom(12).hex()
        else:  # an endpoint token re-registers its own id, within its enrollment's intents
            if claims.subject != endpoint_id:
                self.deny(
                    caller,
                    "register",
                    endpoint_id,
                    f"this endpoint token is for {claims.subject}, not {endpoint_id}",
                )
            scope = scope_allows((endpoint_id,), claims.intents, endpoint_id, capabilities)
            generation = claims.generation
        if not scope.allowed:
            self.deny(
                caller, "register", endpoint_id, f"the token does not allow it: {scope.reason}"
            )
        claim = self.policy.may_claim(endpoint_id, capabilities)
        if not claim.allowed:
            self.deny(
                caller, "register", endpoint_id, f"the policy does not allow it: {claim.reason}"
            )
        return self._grant(claims, endpoint_id, generation)

    def _grant(self, claims: Claims, endpoint_id: str, generation: str) -> EndpointGrant:
        assert self.tokens is not None
        token, expires = self.tokens.issue(
            Kind.ENDPOINT,
            endpoint_id,
            self.endpoint_ttl_s,
            intents=claims.intents,
            generation=generation,
        )
        return EndpointGrant(generation, token, expires)

    def check_owner(
        self, caller: Principal, action: str, endpoint_id: str, current: EndpointRecord | None
    ) -> None:
        """May ``caller`` heartbeat or deregister ``endpoint_id`` (an operator may deregister
        anything)? A missing record is left for the service to report (404)."""
        claims = caller.claims
        if claims is None:
            return
        if claims.kind is Kind.OPERATOR:
            if action == "deregister":
                self.admin(caller, "deregister", endpoint_id)
                return
            self.deny(caller, action, endpoint_id, f"an operator token cannot {action}")
        if claims.subject != endpoint_id:
            self.deny(
                caller,
                action,
                endpoint_id,
                f"this endpoint token is for {claims.subject}, not {endpoint_id}",
            )
        if current is not None and current.owner != claims.generation:
            self.deny(caller, action, endpoint_id, earlier_registration(endpoint_id))

    @staticmethod
    def own_generation(caller: Principal) -> str | None:
        """The registration an endpoint token may act on (its generation); None for anything
        else (open mode, an operator)."""
        claims = caller.claims
        if claims is None or claims.kind is Kind.OPERATOR:
            return None
        return claims.generation

    def renewal(self, caller: Principal) -> EndpointGrant | None:
        """A fresh endpoint token when the caller's has less than half its life left."""
        claims = caller.claims
        if claims is None or claims.remaining_s(self.wall()) > self.endpoint_ttl_s / 2:
            return None
        return self._grant(claims, claims.subject, claims.generation)

    async def check_endpoint_url(self, caller: Principal, endpoint_id: str, url: str) -> None:
        """Refuse an endpoint URL the gateway must not deliver to, in both modes
        (:func:`~.guards.endpoint_url_refusal`)."""
        refusal = await endpoint_url_refusal(self.addresses, url, endpoint_id)
        if refusal is not None:
            self.deny(caller, "register", endpoint_id, f"endpoint_url refused: {refusal}")

    # --- issuing tokens (operator) ---------------------------------------------------------

    def issue(self, caller: Principal, request: TokenRequest) -> dict[str, Any]:
        """``POST /v1/tokens``: a new enrollment or client token (an admin action)."""
        if self.files is None:
            raise NotFound("this gateway runs in open mode: it issues no tokens (--auth tokens)")
        kind, subject, token, expires, ttl = self.files.issue(request)
        self.admin(
            caller,
            "token.issue",
            subject,
            kind=kind.value,
            endpoints=request.endpoints,
            intents=request.intents,
            ttl_s=ttl,
        )
        return {
            "ok": True,
            "kind": kind.value,
            "subject": subject,
            "token": token,
            "expires_at": round(expires, 3),
        }

    # --- sending and reading ---------------------------------------------------------------

    def check_send(
        self,
        caller: Principal,
        sender: str | None,
        intent: str,
        hint: str | None,
        *,
        action: str = "send",
    ) -> tuple[str | None, RouteScope | None]:
        """The request's sender (the token's subject) and where the policy lets this sender's
        request for ``intent`` go (None: anywhere); Forbidden when it may not send it at all."""
        claims = caller.claims
        if claims is None:
            return sender, None
        if claims.kind is Kind.OPERATOR:  # dry runs only (send does not take operator tokens)
            return sender, None
        subject = self.sender_of(caller, sender, action, intent)
        allowed = self.policy.may_reach(subject, intent)
        if not allowed.allowed:
            self.deny(caller, action, intent, allowed.reason)
        if hint is not None:
            delivery = self.policy.may_deliver(subject, intent, hint)
            if not delivery.allowed:
                self.deny(caller, action, hint, delivery.reason)
            return subject, None
        return subject, RouteScope(self.policy.allowed_endpoints(subject, intent))

    def check_origin(self, caller: Principal, origin: str) -> str:
        """A forwarded request's origin domain (``X-Reach-Origin``): in token mode it must be
        the peer token's subject (a domain cannot forward in another's name)."""
        claims = caller.claims
        if claims is None:
            return origin
        if claims.kind is not Kind.PEER or claims.subject != origin:
            self.deny(
                caller,
                "forward",
                origin,
                f"a request from domain {origin} needs that domain's peer token, not"
                f" {with_article(claims.kind.value)} token for {claims.subject}",
            )
        return origin

    def sender_of(self, caller: Principal, sender: str | None, action: str, target: str) -> str:
        """Token mode: the request's sender, the token's subject; Forbidden (with an audit
        line about ``target``) when the request names another one. A peer token (a request
        forwarded from its domain) sends as ``agent://NAME@DOMAIN``, its domain's sender."""
        assert caller.claims is not None
        subject = caller.claims.subject
        if caller.claims.kind is Kind.PEER:
            if sender is None or not sender.endswith(f"@{subject}"):
                self.deny(caller, action, target, f"a forwarded sender must be of {subject}")
            assert sender is not None
            return sender
        if sender is not None and sender != subject:
            self.deny(
                caller, action, target, f"sender {sender} is not the token's subject {subject}"
            )
        return subject

    def reachable(
        self, caller: Principal, by_intent: Callable[[str], Collection[str]]
    ) -> Callable[[str], bool] | None:
        """The tags the policy lets ``caller`` send to, at one endpoint at least of those that
        declare them (``by_intent``), for a fallback match to choose among before
        :meth:`check_send` judges the tag it chose (None: any tag)."""
        claims = caller.claims
        if claims is None or claims.kind is Kind.OPERATOR:
            return None
        policy, subject = self.policy, claims.subject

        def reachable(tag: str) -> bool:
            if not policy.may_reach(subject, tag).allowed:
                return False
            allowed = policy.allowed_endpoints(subject, tag)
            return allowed is None or any(allowed(e) for e in by_intent(tag))

        return reachable

    def trace_reader(
        self, caller: Principal, trace_id: str, sender: str | None = None
    ) -> Callable[[tuple[str | None, str | None]], bool] | None:
        """Which events of a trace ``caller`` may read, by the (sender, origin) of the request
        each belongs to: None for all (open mode; an operator, an admin action), else those of
        the caller's own requests (a peer: those the domain forwarded, of ``sender`` alone when
        it names one: the peer reads for that sender of its own). Decided per request: several
        may share a trace id, and whoever used it first owns none of the others."""
        claims = caller.claims
        if claims is None:
            return None
        if claims.kind is Kind.OPERATOR:
            self.admin(caller, "trace.read", trace_id)
            return None
        subject = claims.subject
        if claims.kind is Kind.PEER:  # the domain that forwarded them reads its part
            if sender is not None:
                return lambda reader: reader == (sender, subject)
            return lambda reader: reader[1] == subject
        return lambda reader: reader[0] == subject

    def trace_refused(self, caller: Principal, trace_id: str) -> None:
        """Log the read of a trace held here none of whose requests is the caller's."""
        self.denied(
            caller.who,
            "trace.read",
            trace_id,
            "not a trace of the caller's requests",
            status=404,
        )
