"""Reach tokens (EdDSA-signed JWTs) and delivery assertions (HS256 JWTs, each with its
recipient's delivery key), made and checked by the gateway.

What each token proves (docs/security.md, "Tokens"):

==========  ==================================  =========================================
kind        subject (``sub``)                   lets its holder
==========  ==================================  =========================================
operator    a person or tool, ``operator:NAME``  admin actions: issue tokens, deregister
                                                any id, read any trace, reload
enroll      a label for people                  register ids matching ``endpoints`` with
                                                intents matching ``intents``
endpoint    one endpoint id                     heartbeat, deregister and re-register that
                                                id (this registration only: ``gen``), and
                                                send as that id
client      a sender id, ``agent://NAME``       send as that id
peer        a domain name (federation)          publish that domain's summary to the
                                                directory, forward requests from that
                                                domain, read the traces it forwarded
delivery    the sender (or ``""``)              -- (the gateway's assertion to a recipient)
==========  ==================================  =========================================

Invariants:
- Bearer tokens carry ``aud = "agent-reach"``; a delivery assertion carries the recipient's
  endpoint id as ``aud`` and ``kind = "delivery"``: one can never be used as the other.
- Every token expires (``exp`` is required); the verifier allows :data:`LEEWAY_S` of clock skew.
- A delivery assertion is made with the delivery key of its recipient's registration
  (:meth:`~agent_reach.auth.keys.SigningKey.delivery_key`): only the gateways and that agent
  hold it, so it proves the delivery to that agent and to no one else.
- A verified token is remembered (bounded) until it expires or the keys change, so a caller's
  token costs one signature check, not one per request.
"""

from __future__ import annotations

import binascii
import enum
import hashlib
import itertools
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
import msgspec

from agent_reach.auth.keys import DELIVERY_ALG, URLSAFE, KeyRing, SigningKey, b64url
from agent_reach.core.names import is_domain, is_endpoint_id
from agent_reach.errors import Unauthorized

__all__ = [
    "AUDIENCE",
    "LEEWAY_S",
    "Claims",
    "Kind",
    "TokenService",
    "TokenVerifier",
    "body_hash",
]

AUDIENCE = "agent-reach"
ISSUER = "agent-reach"
LEEWAY_S = 5.0
CACHE_SIZE = 10_000
# the MACs of delivery keys kept (~0.5 KB each), by (key, recipient, registration, sender,
# intent): past that they are all derived again (a few µs each)
DELIVERY_KEYS_KEPT = 20_000
MAX_TOKEN_BYTES = 4096
_ALGORITHMS = ["EdDSA"]
_encode = msgspec.json.Encoder().encode
_b2a = binascii.b2a_base64
_DELIVERY = "delivery"  # Kind.DELIVERY.value, without the enum's descriptor on every delivery


class Kind(enum.StrEnum):
    """What a token is for."""

    OPERATOR = "operator"
    ENROLL = "enroll"
    ENDPOINT = "endpoint"
    CLIENT = "client"
    PEER = "peer"
    DELIVERY = "delivery"


@dataclass(frozen=True, slots=True)
class Claims:
    """A verified token."""

    kind: Kind
    subject: str
    expires_at: float
    issued_at: float
    token_id: str
    endpoints: tuple[str, ...] = ()  # enroll: the endpoint id patterns it may register
    intents: tuple[str, ...] = ()  # enroll, endpoint: the intent patterns it may claim
    generation: str = ""  # endpoint: the registration it belongs to

    def remaining_s(self, now: float) -> float:
        """Seconds until it expires."""
        return self.expires_at - now


class TokenVerifier(Protocol):
    """Checks a bearer token."""

    def verify(self, token: str, kinds: Collection[Kind]) -> Claims:
        """The token's claims; :class:`~agent_reach.errors.Unauthorized` (with the reason as
        its detail) when it is malformed, tampered, expired, signed by an unknown key, or of a
        kind not in ``kinds``."""
        ...


_SHA256 = hashlib.sha256()  # copied, not made anew: OpenSSL 3 looks the digest up on each new


def body_hash(body: bytes) -> str:
    """The ``bh`` claim of a delivery assertion: SHA-256 of the delivered body, base64url."""
    digest = _SHA256.copy()
    digest.update(body)
    return b64url(digest.digest()).decode("ascii")


class _Mac:
    """HMAC-SHA256 (RFC 2104) with one key, its two padded key blocks hashed once: a MAC is
    then two copies and three calls, 0.86 µs for an assertion's 380 bytes against 1.81 µs
    for ``hmac.digest`` (which hashes both key blocks again and, on OpenSSL 3, looks the
    digest up each time). What ``hmac.HMAC`` does in Python, with the states kept."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) > 64:  # RFC 2104 hashes a longer key first; delivery keys are 32 bytes
            raise ValueError("a key of at most 64 bytes (one SHA-256 block)")
        block = key.ljust(64, b"\x00")
        self._inner = _SHA256.copy()
        self._inner.update(bytes(b ^ 0x36 for b in block))
        self._outer = _SHA256.copy()
        self._outer.update(bytes(b ^ 0x5C for b in block))

    def __call__(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Unauthorized(f"token claim {name!r} is not a list of strings")
    return tuple(value)


class TokenService:
    """Issues and verifies tokens with the keys of ``keys`` (a :class:`KeyRing`).

    ``wall`` is the clock of ``iat``/``exp`` (unix seconds).
    """

    def __init__(
        self,
        keys: KeyRing,
        *,
        issuer: str = ISSUER,
        wall: Callable[[], float] = time.time,
        leeway_s: float = LEEWAY_S,
    ) -> None:
        self.keys = keys
        self.issuer = issuer
        self.wall = wall
        self.leeway_s = leeway_s
        self._cache: dict[str, Claims] = {}
        self._cache_version = keys.version
        # (kid, recipient, registration, sender, intent) -> the start of the assertions'
        # signing input and the MAC of the delivery key: derived once, not on every delivery
        self._delivery: dict[tuple[str, str, str, str, str], tuple[bytes, _Mac]] = {}
        # an assertion's jti: this service's random prefix and a count (unique without a
        # system call for randomness on every delivery; a jti needs to be unique, not secret)
        self._jti_prefix = os.urandom(8).hex()
        self._jti_count = itertools.count()

    # --- issuing ---------------------------------------------------------------------------

    def issue(
        self,
        kind: Kind,
        subject: str,
        ttl_s: float,
        *,
        endpoints: Sequence[str] = (),
        intents: Sequence[str] = (),
        generation: str = "",
    ) -> tuple[str, float]:
        """A new bearer token and its expiry (unix seconds)."""
        if kind is Kind.DELIVERY:
            raise ValueError("delivery assertions are made by sign_delivery")
        if ttl_s <= 0:
            raise ValueError("a token's lifetime must be positive")
        if kind in (Kind.ENDPOINT, Kind.CLIENT) and not is_endpoint_id(subject):
            raise ValueError(
                f"the subject of a {kind} token is an agent://name id, not {subject!r}"
            )
        if kind is Kind.PEER and not is_domain(subject):
            raise ValueError(f"the subject of a peer token is a domain name, not {subject!r}")
        now = self.wall()
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": subject,
            "kind": kind.value,
            "iat": int(now),
            "exp": now + ttl_s,
            "jti": os.urandom(12).hex(),
        }
        if endpoints:
            claims["endpoints"] = list(endpoints)
        if intents:
            claims["intents"] = list(intents)
        if generation:
            claims["gen"] = generation
        return self._sign(claims), claims["exp"]

    def sign_delivery(
        self,
        *,
        sender: str | None,
        recipient: str,
        owner: str,
        intent: str,
        msg_id: str,
        body: bytes,
        expires_at: float,
    ) -> str:
        """The assertion of one delivery attempt (header ``X-Reach-Assertion``): who sends
        what to whom, bound to the body, valid until the request's deadline; an HS256 JWT
        with the delivery key of ``recipient``'s registration ``owner``.

        Made on every delivery, so it is serialized here (msgspec, and the JWS compact form:
        ``b64(header).b64(claims).b64(mac)``) rather than by PyJWT, which costs several times
        the HMAC; PyJWT verifies these in the agent SDK and in the tests."""
        now = self.wall()
        key = self.keys.signing_key(now)
        sub = sender or ""
        derived = self._delivery.get((key.kid, recipient, owner, sub, intent))
        if derived is None:
            derived = self._derive(key, recipient, owner, sub, intent)
        prefix, mac = derived
        digest = _SHA256.copy()
        digest.update(body)
        # the claims that change with every delivery, after the prefix (b64url() inlined: three
        # per delivery); their JSON object's "{" dropped, the prefix's "," taking its place
        rest = _encode(
            {
                "msg_id": msg_id,
                "bh": _b2a(digest.digest(), newline=False)
                .translate(URLSAFE)
                .rstrip(b"=")
                .decode("ascii"),
                "iat": int(now),
                "exp": expires_at,
                "jti": f"{self._jti_prefix}{next(self._jti_count):x}",
            }
        )
        signing_input = prefix + _b2a(rest[1:], newline=False).translate(URLSAFE).rstrip(b"=")
        mac_b64 = _b2a(mac(signing_input), newline=False).translate(URLSAFE).rstrip(b"=")
        return (signing_input + b"." + mac_b64).decode("ascii")

    def _derive(
        self, key: SigningKey, recipient: str, owner: str, sender: str, intent: str
    ) -> tuple[bytes, _Mac]:
        """What the deliveries from ``sender`` for ``intent`` to ``recipient``'s registration
        ``owner`` share: the encoded JWS header and the claims that do not change, and the
        MAC of the delivery key. The claims' JSON up to its last constant member is padded
        with spaces (between members, where JSON allows them) to a multiple of three bytes,
        so that its base64 joins the rest's as the base64 of the whole."""
        if len(self._delivery) >= DELIVERY_KEYS_KEPT:
            self._delivery.clear()
        header = {"alg": DELIVERY_ALG, "kid": key.delivery_kid(owner), "typ": "JWT"}
        constant = (
            _encode(
                {
                    "iss": self.issuer,
                    "aud": recipient,
                    "sub": sender,
                    "kind": _DELIVERY,
                    "intent": intent,
                }
            )[:-1]
            + b","
        )
        constant += b" " * (-len(constant) % 3)
        derived = self._delivery[key.kid, recipient, owner, sender, intent] = (
            b64url(_encode(header)) + b"." + b64url(constant),
            _Mac(key.delivery_key(recipient, owner)),
        )
        return derived

    def _sign(self, claims: dict[str, Any]) -> str:
        key = self.keys.signing_key(self.wall())
        return jwt.encode(claims, key.private, algorithm="EdDSA", headers={"kid": key.kid})

    # --- verifying -------------------------------------------------------------------------

    def current(self, claims: Claims) -> bool:
        """Whether ``claims``, verified before, still hold: no key change since, not expired."""
        return (
            self._cache_version == self.keys.version
            and claims.expires_at + self.leeway_s >= self.wall()
        )

    def known(self, token: str) -> bool:
        """Whether ``token`` was verified before and is still good (no signature check)."""
        claims = self._cache.get(token)
        return claims is not None and self.current(claims)

    def verify(self, token: str, kinds: Collection[Kind]) -> Claims:
        """See :meth:`TokenVerifier.verify`."""
        if self._cache_version != self.keys.version:  # keys changed: verify everything again
            self._cache.clear()
            self._cache_version = self.keys.version
        now = self.wall()
        claims = self._cache.get(token)
        if claims is None:
            claims = self._decode(token)
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[token] = claims
        if claims.expires_at + self.leeway_s < now:
            self._cache.pop(token, None)
            raise Unauthorized("token expired")
        if claims.kind not in kinds:
            wanted = " or ".join(sorted(k.value for k in kinds))
            raise Unauthorized(f"a {claims.kind} token cannot do this; it needs a {wanted} token")
        return claims

    def _decode(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_BYTES:
            raise Unauthorized("token too long")
        if not token.isascii():  # a JWT is base64url and dots; PyJWT would fail to encode it
            raise Unauthorized("malformed token (not ASCII)")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthorized("malformed token (not a JWT)") from None
        kid = header.get("kid")
        key = self.keys.public_key(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthorized("token signed by an unknown key (kid); see GET /v1/keys")
        try:
            raw = jwt.decode(
                token,
                key,
                algorithms=_ALGORITHMS,
                audience=AUDIENCE,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iat", "sub", "aud", "iss"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("token expired") from None
        except jwt.InvalidSignatureError:
            raise Unauthorized("token signature does not verify (tampered?)") from None
        except jwt.InvalidTokenError as exc:
            raise Unauthorized(f"invalid token: {exc}") from None
        try:
            kind = Kind(str(raw.get("kind")))
        except ValueError:
            raise Unauthorized("token has no valid 'kind' claim") from None
        if kind is Kind.DELIVERY:
            raise Unauthorized("a delivery assertion is not a bearer token")
        subject = raw["sub"]
        if not isinstance(subject, str) or not subject:
            raise Unauthorized("token has no subject")
        if kind in (Kind.ENDPOINT, Kind.CLIENT) and not is_endpoint_id(subject):
            raise Unauthorized(f"a {kind} token's subject must be an agent://name id")
        if kind is Kind.PEER and not is_domain(subject):
            raise Unauthorized("a peer token's subject must be a domain name")
        generation = raw.get("gen", "")
        if not isinstance(generation, str) or (kind is Kind.ENDPOINT and not generation):
            raise Unauthorized("endpoint token without a registration generation")
        return Claims(
            kind=kind,
            subject=subject,
            expires_at=float(raw["exp"]),
            issued_at=float(raw["iat"]),
            token_id=str(raw.get("jti", "")),
            endpoints=_strings(raw.get("endpoints"), "endpoints"),
            intents=_strings(raw.get("intents"), "intents"),
            generation=generation,
        )
