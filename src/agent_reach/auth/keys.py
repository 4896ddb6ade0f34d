"""The gateway's signing keys: Ed25519 key files in one directory, published as a JWKS, and
the delivery keys derived from them.

Layout of the key directory (``--keys DIR``)::

    ed25519-20261130T151500Z.pem     PKCS#8 private key; the name's time is when it may sign
    ed25519-20261207T090000Z.pem     a newer key: published (and accepted) at once, signing
                                     from its time on
    ed25519-20261207T090000Z-2.pem   one made in the same second: it counts as the newer

Invariants:
- Every key in the directory is published at ``GET /v1/keys`` and accepted when verifying, from
  the moment it is loaded: a token or delivery assertion signed by any of them verifies.
- The key that signs is the newest whose activation time has come (the time in its name; for a
  file named otherwise, its modification time). So a key added with a later time (``agent-reach
  auth keygen --activate-in 120``) is first published by every gateway that loads it, and only
  then used: rotation without a moment where one gateway signs with a key another does not know.
- Removing a file retires its key: what it signed stops verifying at the next reload.
- The key id (``kid``) is the RFC 7638 thumbprint of the public key, so the same key has the
  same id on every gateway whatever its file is called.
- Each key also gives every registration its own **delivery key**: HMAC-SHA256 of the
  endpoint id and the registration (``owner``, the endpoint token's ``gen``) under the private
  key's seed. Deliveries carry an HS256 assertion made with it (one HMAC, not a signature, per
  delivery); the agent fetches it from ``GET /v1/keys`` with its endpoint token. Every gateway
  holding the same key files derives the same delivery keys, and no one without the private
  key (or that registration's endpoint token) can; a key retired retires its delivery keys.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from agent_reach.errors import KeyDirectoryError

__all__ = [
    "DELIVERY_ALG",
    "URLSAFE",
    "KeyDirectoryError",
    "KeyRing",
    "SigningKey",
    "b64url",
    "generate_key",
    "public_jwk",
]

_NAME = re.compile(r"ed25519-(\d{8}T\d{6}Z)(?:-(\d{1,6}))?\.pem\Z")
_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
DELIVERY_ALG = "HS256"  # delivery assertions: HMAC-SHA256 with the recipient's delivery key
_DELIVERY_LABEL = b"agent-reach delivery key v1\x00"


URLSAFE = bytes.maketrans(b"+/", b"-_")  # base64's alphabet to base64url's


def b64url(data: bytes) -> bytes:
    """Base64url without padding, as JOSE writes it (RFC 7515). binascii directly (what
    ``base64.urlsafe_b64encode`` calls through two Python functions): three per delivery in
    token mode."""
    return binascii.b2a_base64(data, newline=False).translate(URLSAFE).rstrip(b"=")


def public_jwk(public: Ed25519PublicKey) -> dict[str, str]:
    """The JWK of an Ed25519 public key, with its RFC 7638 thumbprint as ``kid``."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = b64url(raw).decode("ascii")
    # RFC 7638: the required members, in lexicographic order, no spaces
    thumb = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    kid = b64url(hashlib.sha256(thumb.encode()).digest()).decode("ascii")[:22]
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One key of the ring."""

    kid: str
    private: Ed25519PrivateKey
    public: Ed25519PublicKey
    active_from: float  # unix seconds
    path: str
    sequence: int = 0  # orders keys of the same second (``-N`` after the time in the name)
    seed: bytes = b""  # the private key's 32 raw bytes: what delivery keys are derived from

    def delivery_kid(self, owner: str) -> str:
        """The ``kid`` of this key's delivery key for the registration ``owner``: this key's
        id and a tag of the registration, so that an agent registered anew (a new delivery
        key) sees a kid it has not fetched, and fetches it."""
        tag = b64url(hashlib.sha256(owner.encode()).digest()[:6]).decode("ascii")
        return f"{self.kid}.{tag}"

    def jwk(self) -> dict[str, str]:
        """The public half as a JWK."""
        return public_jwk(self.public)

    def delivery_key(self, endpoint_id: str, owner: str) -> bytes:
        """The delivery key of the registration ``owner`` of ``endpoint_id``: 32 bytes,
        HMAC-SHA256 under this key's seed (deterministic: every gateway with this key file
        derives the same; the agent learns it from ``GET /v1/keys`` with its endpoint token)."""
        message = _DELIVERY_LABEL + endpoint_id.encode() + b"\x00" + owner.encode()
        return hmac.digest(self.seed, message, "sha256")

    def delivery_jwk(self, endpoint_id: str, owner: str) -> dict[str, str]:
        """:meth:`delivery_key` as a JWK (``kty`` ``oct``, ``alg`` HS256): secret, for that
        registration's agent only."""
        return {
            "kty": "oct",
            "k": b64url(self.delivery_key(endpoint_id, owner)).decode("ascii"),
            "kid": self.delivery_kid(owner),
            "alg": DELIVERY_ALG,
            "use": "sig",
        }


def _activation(path: Path) -> tuple[float, int]:
    named = _NAME.match(path.name)
    if named:
        when = datetime.strptime(named.group(1), _TIME_FORMAT).replace(tzinfo=UTC).timestamp()
        return when, int(named.group(2) or 0)
    return path.stat().st_mtime, 0


def _load(path: Path) -> SigningKey:
    try:
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, OSError) as exc:
        raise KeyDirectoryError(f"{path}: not a usable PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyDirectoryError(f"{path}: an Ed25519 key is needed, found {type(private).__name__}")
    public = private.public_key()
    active_from, sequence = _activation(path)
    seed = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    kid = public_jwk(public)["kid"]
    return SigningKey(kid, private, public, active_from, str(path), sequence, seed)


class KeyRing:
    """The keys of one directory: the active signing key, and every key by ``kid``.

    :meth:`load` reads the directory (raising :class:`KeyDirectoryError` when it cannot be used, the
    ring left as it was); :meth:`changed` says whether the directory's files differ from what
    was loaded (cheap: names, sizes and times), so a gateway can poll it.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.keys: dict[str, SigningKey] = {}
        self._seen: tuple[tuple[str, int, int], ...] = ()
        self.version = 0  # bumped by every load that changed the keys
        # the signing key chosen last: (keys it was chosen among, from, until, the key)
        self._chosen: tuple[dict[str, SigningKey], float, float, SigningKey] | None = None

    def _listing(self) -> tuple[tuple[str, int, int], ...]:
        try:
            entries = sorted(self.directory.glob("*.pem"))
        except OSError as exc:
            raise KeyDirectoryError(f"key directory {self.directory}: {exc}") from None
        out = []
        for path in entries:
            try:
                st = path.stat()
            except OSError:
                continue  # removed while listing
            out.append((path.name, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def changed(self) -> bool:
        """Whether the directory's key files differ from the last load."""
        try:
            return self._listing() != self._seen
        except KeyDirectoryError:
            return True

    def load(self) -> bool:
        """(Re)read the directory; True when the set of keys changed."""
        if not self.directory.is_dir():
            raise KeyDirectoryError(
                f"key directory {self.directory} does not exist; make one with "
                f"`agent-reach auth keygen --keys {self.directory}`"
            )
        listing = self._listing()
        keys: dict[str, SigningKey] = {}
        bad: list[str] = []
        for name, _, _ in listing:
            try:
                key = _load(self.directory / name)
            except KeyDirectoryError as exc:
                bad.append(str(exc))
                continue
            keys[key.kid] = key
        if bad:
            # refused, but a key whose file is gone is retired all the same: one bad new file
            # must not keep a deleted (leaked) key verifying
            kept = {kid: key for kid, key in self.keys.items() if kid in keys}
            if kept.keys() != self.keys.keys():  # even when none is left: then nothing signs
                self.keys = kept
                self.version += 1
            raise KeyDirectoryError("; ".join(bad))
        if not keys:
            raise KeyDirectoryError(
                f"key directory {self.directory} holds no *.pem key; make one with "
                f"`agent-reach auth keygen --keys {self.directory}`"
            )
        self._seen = listing
        if keys.keys() == self.keys.keys():
            return False
        self.keys = keys
        self.version += 1
        return True

    def signing_key(self, now: float | None = None) -> SigningKey:
        """The newest key whose activation time has come (else the oldest);
        KeyDirectoryError when no key is left (every key file deleted, the new ones bad)."""
        if not self.keys:
            raise KeyDirectoryError(
                f"no usable key in {self.directory}: nothing can be signed until one is there"
            )
        when = time.time() if now is None else now
        chosen = self._chosen
        if chosen is not None and chosen[0] is self.keys and chosen[1] <= when < chosen[2]:
            return chosen[3]  # made on every delivery in token mode: chosen again only when due
        ready = [k for k in self.keys.values() if k.active_from <= when]
        later = [k.active_from for k in self.keys.values() if k.active_from > when]
        until = min(later, default=math.inf)  # a newer key's time, when it will sign
        if not ready:
            key = min(self.keys.values(), key=lambda k: k.active_from)
            since = -math.inf
        else:
            key = max(ready, key=lambda k: (k.active_from, k.sequence, k.kid))
            since = key.active_from
        self._chosen = (self.keys, since, until, key)
        return key

    def public_key(self, kid: str) -> Ed25519PublicKey | None:
        """The public key of ``kid`` (None when no such key is loaded)."""
        key = self.keys.get(kid)
        return None if key is None else key.public

    def jwks(self, recipient: tuple[str, str] | None = None) -> dict[str, Any]:
        """The JWKS document of ``GET /v1/keys``: every loaded key, the signing one first; with
        ``recipient`` (endpoint id, registration), also that registration's delivery keys, one
        per loaded key (for its agent only: they are secret)."""
        if not self.keys:
            return {"keys": []}
        first = self.signing_key()
        ordered = [first, *(k for k in self.keys.values() if k.kid != first.kid)]
        keys = [k.jwk() for k in ordered]
        if recipient is not None:
            keys += [k.delivery_jwk(*recipient) for k in ordered]
        return {"keys": keys}


def generate_key(directory: str | os.PathLike[str], *, activate_in_s: float = 0.0) -> Path:
    """Write a new Ed25519 key into ``directory`` (made, mode 0700, when missing), active
    ``activate_in_s`` seconds from now; returns its path. The file is written 0600."""
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    when = datetime.fromtimestamp(time.time() + max(0.0, activate_in_s), tz=UTC)
    stem = f"ed25519-{when.strftime(_TIME_FORMAT)}"
    path = folder / f"{stem}.pem"
    sequence = 1
    while path.exists():  # another key of the same second: numbered after it
        sequence += 1
        path = folder / f"{stem}-{sequence}.pem"
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return path
