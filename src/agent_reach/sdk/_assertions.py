"""Checking the gateway's signature on each delivery (token mode), before any handler runs.

In token mode the gateway signs every delivery attempt with an assertion (header
``X-Reach-Assertion``, an HS256 JWT made with this registration's delivery key): the sender,
the recipient (``aud``), the intent, the ``msg_id``, a SHA-256 of the body (``bh``) and an
expiry, the attempt's deadline. An agent that verifies deliveries refuses, with 401
``unauthorized`` (which the gateway does not retry):

- an unsigned delivery, or one signed by a key the gateway does not give this agent
  (``GET /v1/keys`` with its endpoint token: its delivery keys, one per gateway key);
- an expired assertion, or one addressed to another endpoint (mis-addressed);
- one whose intent, ``msg_id``, sender or body differ from the delivery it came with;
- an assertion seen before (replayed): each attempt carries a new one, so a retry by the
  gateway is never refused, while a copy of a captured delivery is.

The keys are fetched from the gateway when an assertion names a key not yet known (at most once
a second), and again every ``keys_max_age_s`` (60 s), so that a key the gateway retired (a
leaked one, deleted from its key directory) stops verifying here too within a minute; while they
cannot be fetched at first (no endpoint token yet, the gateway away, an answer with public keys
and no delivery key), deliveries are answered 503 (retryable), not refused, and a failed
periodic refresh keeps the keys it had. A gateway that answers no keys at all has retired every
key: the keys held are dropped.

Replays are remembered until their assertion expires, at most ``replay_max`` of them (past that
the oldest go first: a replay older than the newest ``replay_max`` deliveries is not caught).

Invariants of the key fetch:

- At most one fetch is in flight; every check meanwhile that needs a key not held awaits that
  one (deliveries arriving together, at the agent's start or at a gateway key rotation, were
  refused 401 while the first one's fetch ran). A check that goes away does not cancel it.
- An unknown key is refused (401, final) only when a fetch begun after the delivery
  arrived answered without it. When no such fetch may be made yet (at most one a second), the
  answer is 503 (retryable) if the last fetch failed or the key may be a newer registration's
  of this endpoint, else 401 (a key of no gateway key held, or of another endpoint).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import jwt

from agent_reach.auth.tokens import body_hash
from agent_reach.observability.logs import log

__all__ = ["ASSERTION_HEADER", "DeliveryVerifier"]

ASSERTION_HEADER = "x-reach-assertion"
_ALGORITHMS = ["HS256"]  # only the delivery keys' algorithm: no other key is taken for one


class DeliveryVerifier:
    """Verifies the assertions of the deliveries to ``endpoint_id``.

    ``fetch_keys`` returns the gateway's JWKS document as this agent sees it (``GET /v1/keys``
    with its endpoint token): of its keys, only the delivery keys (``oct``, HS256) are kept.
    """

    def __init__(
        self,
        endpoint_id: str,
        fetch_keys: Callable[[], Awaitable[Mapping[str, Any]]],
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        leeway_s: float = 2.0,
        refetch_min_s: float = 1.0,
        replay_max: int = 1_000_000,
        keys_max_age_s: float = 60.0,
    ) -> None:
        self.endpoint_id = endpoint_id
        self._fetch = fetch_keys
        self._wall = wall
        self._monotonic = monotonic
        self.leeway_s = leeway_s
        self.refetch_min_s = refetch_min_s
        self.replay_max = replay_max
        self.keys_max_age_s = keys_max_age_s
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None  # the last attempt
        self._fresh_at: float | None = None  # the last success
        self._failed: str | None = None  # why the last attempt failed (None: it did not)
        self._fetches = 0  # fetches begun: a check compares with the count when it began
        self._flight: tuple[int, asyncio.Task[str | None]] | None = None  # the last fetch
        self._seen: dict[str, float] = {}  # assertion id -> its expiry, oldest first

    async def check(
        self,
        body: bytes,
        headers: Mapping[str, str],
        *,
        intent: str,
        msg_id: str,
        sender: str | None,
    ) -> tuple[int, str] | None:
        """None when the delivery is properly signed for this endpoint; else the status to
        answer (401: refused; 503: keys unavailable now) and why."""
        assertion = headers.get(ASSERTION_HEADER)
        if not assertion:
            return 401, "unsigned delivery: no X-Reach-Assertion (this agent verifies deliveries)"
        try:
            kid = jwt.get_unverified_header(assertion).get("kid")
        except jwt.InvalidTokenError:
            return 401, "malformed delivery assertion"
        arrived = self._fetches  # a fetch numbered above this one began after the delivery
        if self._fresh_at is not None and self._monotonic() - self._fresh_at > self.keys_max_age_s:
            await self._refresh()  # a failure keeps the keys held: logged, not fatal here
        if not isinstance(kid, str):
            return 401, "delivery assertion without a key id (kid)"
        key = self._keys.get(kid)
        if key is None:
            key, refusal = await self._find(kid, assertion, arrived)
            if refusal is not None:
                return refusal
        try:
            claims = jwt.decode(
                assertion,
                key,
                algorithms=_ALGORITHMS,
                audience=self.endpoint_id,
                leeway=self.leeway_s,
                options={"require": ["exp", "aud", "sub", "jti"]},
            )
        except jwt.ExpiredSignatureError:
            return 401, "delivery assertion expired"
        except jwt.InvalidAudienceError:
            return (
                401,
                f"delivery assertion is addressed to another endpoint, not {self.endpoint_id}",
            )
        except jwt.InvalidSignatureError:
            if _addressee(assertion) != self.endpoint_id:  # another's key: name why, to help
                return (
                    401,
                    f"delivery assertion is addressed to another endpoint, not {self.endpoint_id}",
                )
            return 401, "delivery assertion signature does not verify"
        except jwt.InvalidTokenError as exc:
            return 401, f"invalid delivery assertion: {exc}"
        mismatch = _mismatch(claims, body, intent, msg_id, sender)
        if mismatch is not None:
            return 401, f"delivery assertion does not match the delivery: {mismatch}"
        return self._note(str(claims["jti"]), float(claims["exp"]))

    def _note(self, assertion_id: str, expires_at: float) -> tuple[int, str] | None:
        seen = self._seen
        if assertion_id in seen:
            return 401, "replayed delivery assertion"
        now = self._wall()
        while seen:  # forget the expired ones (oldest first), and the oldest past the bound
            oldest_id, oldest_exp = next(iter(seen.items()))
            if oldest_exp + self.leeway_s >= now and len(seen) < self.replay_max:
                break
            del seen[oldest_id]
        seen[assertion_id] = expires_at
        return None

    async def _find(
        self, kid: str, assertion: str, arrived: int
    ) -> tuple[Any, tuple[int, str] | None]:
        """(the key ``kid`` names, None), fetching the keys for it, or (None, the refusal).
        ``arrived``: the fetches begun before the delivery arrived."""
        while (flight := self._fetching()) is not None:
            number, fetch = flight
            unavailable = await asyncio.shield(fetch)  # the others' fetch too: not cancelled
            if unavailable is not None:
                return None, (503, unavailable)
            key = self._keys.get(kid)
            if key is not None:
                return key, None
            if number > arrived:  # asked after the delivery was signed: not published
                return None, (
                    401,
                    "delivery assertion signed by a key the gateway does not publish "
                    "(for this endpoint)",
                )
            # a fetch begun before the delivery arrived may predate its key: one more, if
            # fetching is not held back now
        # held back (at most once a second): 503 while the keys cannot be had, or the key may
        # be this endpoint's newer registration's (registered anew since the last fetch)
        if self._failed is not None:
            return None, (503, self._failed)
        if self._newer_registration(kid, assertion):
            return None, (503, "delivery key of a new registration: fetched within a second")
        return None, (
            401,
            "delivery assertion signed by a key the gateway does not publish (for this endpoint)",
        )

    def _newer_registration(self, kid: str, assertion: str) -> bool:
        """Whether ``assertion`` could be made with a delivery key of a registration of this
        endpoint newer than the keys held: its kid is ``KID.TAG`` with KID a gateway key held
        and TAG another registration's, and it is addressed (unverified) to this endpoint."""
        gateway_key, dot, tag = kid.partition(".")
        if not dot or not tag:
            return False
        held = {t for k, _, t in (h.partition(".") for h in self._keys) if k == gateway_key}
        return bool(held) and tag not in held and _addressee(assertion) == self.endpoint_id

    async def _refresh(self) -> None:
        """The periodic refresh: a fetch, awaited, unless one is in flight (the keys held
        serve meanwhile) or began within ``refetch_min_s``."""
        if self._in_flight() is None and (flight := self._fetching()) is not None:
            await asyncio.shield(flight[1])

    def _in_flight(self) -> tuple[int, asyncio.Task[str | None]] | None:
        """The fetch in flight (on this event loop), if any, with its number."""
        flight = self._flight
        if flight is None or flight[1].done():
            return None
        return flight if flight[1].get_loop() is asyncio.get_running_loop() else None

    def _fetching(self) -> tuple[int, asyncio.Task[str | None]] | None:
        """The fetch in flight, else a new one, else None: one began within
        ``refetch_min_s``."""
        flight = self._in_flight()
        if flight is not None:
            return flight
        now = self._monotonic()
        if self._fetched_at is not None and now - self._fetched_at < self.refetch_min_s:
            return None
        self._fetched_at = now
        self._fetches += 1
        self._flight = (self._fetches, asyncio.ensure_future(self._fetch_keys(now)))
        return self._flight

    async def _fetch_keys(self, now: float) -> str | None:
        """One fetch of the keys, begun at ``now``: None when they were taken, else why they
        cannot be had."""
        try:
            document = await self._fetch()
            listed = document.get("keys", [])
            keys = {}
            for jwk in listed:
                if jwk.get("kty") != "oct" or jwk.get("alg") not in _ALGORITHMS:
                    continue  # the public keys of bearer tokens: not for deliveries
                parsed = jwt.PyJWK(jwk)
                if parsed.key_id:
                    keys[parsed.key_id] = parsed.key
            if listed and not keys:
                # public keys and no delivery key: the gateway did not take this answer as
                # the agent's (no endpoint token went with it), not "no keys any more"
                raise LookupError("the gateway's answer holds no delivery key for this agent")
        except Exception as exc:  # any failure to fetch or parse: retryable, logged
            log(logging.WARNING, "agent.keys_unavailable", error=repr(exc))
            self._failed = f"cannot fetch the gateway's keys to verify this delivery: {exc}"
            return self._failed
        self._keys = keys
        self._fresh_at = now
        self._failed = None
        log(logging.INFO, "agent.keys_fetched", keys=sorted(keys))
        return None


def _addressee(assertion: str) -> Any:
    """The ``aud`` an assertion names, unverified (for the reason of a refusal only)."""
    try:
        return jwt.decode(assertion, options={"verify_signature": False}).get("aud")
    except jwt.InvalidTokenError:
        return None


def _mismatch(
    claims: Mapping[str, Any], body: bytes, intent: str, msg_id: str, sender: str | None
) -> str | None:
    if claims.get("kind") != "delivery":
        return "not a delivery assertion"
    if claims.get("intent") != intent:
        return "intent"
    if claims.get("msg_id") != msg_id:
        return "msg_id"
    if claims.get("sub") != (sender or ""):
        return "sender"
    if claims.get("bh") != body_hash(body):
        return "body"
    return None
