"""Keys, tokens and delivery assertions, with an injected wall clock (no sleeping)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from agent_reach.auth.keys import KeyDirectoryError, KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService, body_hash
from agent_reach.errors import Unauthorized
from agent_reach.sdk._assertions import DeliveryVerifier

NOW = 1_800_000_000.0


class Wall:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ring(path: Path, **key: Any) -> KeyRing:
    generate_key(path, **key)
    keys = KeyRing(path)
    keys.load()
    return keys


OWNER = "gen-r"  # agent://r's registration


def recipient_keys(keys: KeyRing) -> dict[str, Any]:
    """The JWKS agent://r's endpoint token gets from ``GET /v1/keys``."""
    return keys.jwks(recipient=("agent://r", OWNER))


def sign(tokens: TokenService, **changes: Any) -> str:
    """An assertion of a delivery to agent://r (``changes`` override its claims)."""
    claims: dict[str, Any] = {
        "sender": None,
        "recipient": "agent://r",
        "owner": OWNER,
        "intent": "a.b",
        "msg_id": "m",
        "body": b"{}",
        "expires_at": time.time() + 10,
        **changes,
    }
    return tokens.sign_delivery(**claims)


def test_generated_keys_are_private_and_published_without_their_secret(tmp_path: Path) -> None:
    keys = ring(tmp_path / "k")
    (path,) = (tmp_path / "k").glob("*.pem")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    (jwk,) = keys.jwks()["keys"]
    assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519" and jwk["alg"] == "EdDSA"
    assert "d" not in jwk and jwk["kid"] in keys.keys


def test_the_newest_active_key_signs_and_a_staged_one_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every key made in one second (the clock held): the case where only the number orders
    # them (with the clock running, the second could turn between two keys: failed once in CI)
    held = time.time()
    monkeypatch.setattr(time, "time", lambda: held)
    keys = ring(tmp_path)
    first = next(iter(keys.keys))
    generate_key(tmp_path, activate_in_s=600)  # staged: published, not signing
    generate_key(tmp_path)  # same second as the first: numbered after it, and newer
    monkeypatch.undo()
    assert keys.load() is True and len(keys.keys) == 3
    now = time.time()
    signing = keys.signing_key(now)
    assert signing.kid != first and signing.sequence == 2
    assert keys.signing_key(now + 3600).active_from > now  # the staged one, once its time comes
    assert keys.jwks()["keys"][0]["kid"] == keys.signing_key().kid
    # the choice is kept between calls, never past the time it holds for, nor a reload
    assert keys.signing_key(now).kid == signing.kid  # the wall clock set back
    staged = keys.signing_key(now + 3600)
    Path(staged.path).unlink()
    assert keys.load() is True
    assert keys.signing_key(now + 3600).kid == signing.kid


@pytest.mark.parametrize(
    "content",
    [b"", b"not a key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"],
)
def test_a_bad_key_file_is_refused_and_the_ring_kept(tmp_path: Path, content: bytes) -> None:
    keys = ring(tmp_path)
    before = dict(keys.keys)
    (tmp_path / "zz.pem").write_bytes(content)
    assert keys.changed()
    with pytest.raises(KeyDirectoryError, match=r"zz\.pem"):
        keys.load()
    assert keys.keys == before


def test_an_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyDirectoryError, match="does not exist"):
        KeyRing(tmp_path / "none").load()
    with pytest.raises(KeyDirectoryError, match=r"no \*\.pem key"):
        KeyRing(tmp_path).load()


def test_tokens_verify_by_kind_and_expire(tmp_path: Path) -> None:
    # PyJWT checks iat/exp against the real clock on first sight; the cache against ``wall``
    start = time.time()
    wall = Wall(start)
    tokens = TokenService(ring(tmp_path), wall=wall)
    token, expires = tokens.issue(
        Kind.ENROLL, "enroll", 60, endpoints=["agent://a-*"], intents=["a.*"]
    )
    assert expires == start + 60
    claims = tokens.verify(token, {Kind.ENROLL})
    assert (claims.kind, claims.endpoints, claims.intents) == (
        Kind.ENROLL,
        ("agent://a-*",),
        ("a.*",),
    )
    with pytest.raises(Unauthorized, match="needs a client token"):
        tokens.verify(token, {Kind.CLIENT})
    wall.now = start + 60 + 4  # within the leeway: still good, also from the cache
    assert tokens.verify(token, {Kind.ENROLL}) == claims
    wall.now = start + 60 + 6
    with pytest.raises(Unauthorized, match="expired"):
        tokens.verify(token, {Kind.ENROLL})  # the cache does not outlive the token


def test_retiring_a_key_invalidates_what_it_signed_at_once(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    old, _ = tokens.issue(Kind.CLIENT, "agent://c", 600)
    assert tokens.verify(old, {Kind.CLIENT})  # now cached
    (old_file,) = tmp_path.glob("*.pem")
    generate_key(tmp_path)
    old_file.unlink()
    assert keys.load() is True
    with pytest.raises(Unauthorized, match="unknown key"):
        tokens.verify(old, {Kind.CLIENT})


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: t + "x",
        lambda t: t.rsplit(".", 1)[0] + ".",
        lambda t: "e30." + t.split(".", 1)[1],  # header {} : no kid
        lambda t: jwt.encode({"sub": "agent://c", "kind": "client"}, "s" * 32, algorithm="HS256"),
        lambda t: "ü" + t,
        lambda t: "a" * 5000,
    ],
)
def test_forged_tokens_are_unauthorized(tmp_path: Path, forge: Any) -> None:
    tokens = TokenService(ring(tmp_path))
    good, _ = tokens.issue(Kind.CLIENT, "agent://c", 600)
    with pytest.raises(Unauthorized):
        tokens.verify(forge(good), set(Kind))


def test_a_delivery_assertion_is_never_a_bearer_token(tmp_path: Path) -> None:
    tokens = TokenService(ring(tmp_path))
    assertion = sign(tokens, sender="agent://c")
    with pytest.raises(Unauthorized):
        tokens.verify(assertion, set(Kind))


def test_assertions_are_standard_jwts(tmp_path: Path) -> None:
    """Made without PyJWT (for speed): PyJWT must read them as any JOSE library would, with
    the recipient's delivery key from its JWKS."""
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    assertion = sign(tokens, msg_id="m1", body=b'{"x":1}', expires_at=time.time() + 30)
    header = jwt.get_unverified_header(assertion)
    signing = keys.signing_key()
    assert header == {"alg": "HS256", "kid": signing.delivery_kid(OWNER), "typ": "JWT"}
    (jwk,) = (k for k in recipient_keys(keys)["keys"] if k["kid"] == header["kid"])
    assert jwk["kty"] == "oct" and jwk["alg"] == "HS256"
    claims = jwt.decode(assertion, jwt.PyJWK(jwk).key, algorithms=["HS256"], audience="agent://r")
    assert claims["sub"] == "" and claims["bh"] == body_hash(b'{"x":1}')
    assert claims["kind"] == "delivery" and claims["msg_id"] == "m1"


def test_delivery_keys_are_per_registration_and_the_same_on_every_gateway(
    tmp_path: Path,
) -> None:
    """Two gateways loading the same key file derive the same delivery keys; another
    endpoint, another registration of the same id or another key file gets another key, and
    the public JWKS (no endpoint token) carries none."""
    keys = ring(tmp_path / "k")
    twin = KeyRing(tmp_path / "k")
    twin.load()
    key, same = keys.signing_key(), twin.signing_key()
    assert key.delivery_key("agent://r", OWNER) == same.delivery_key("agent://r", OWNER)
    derived = {
        key.delivery_key("agent://r", OWNER),
        key.delivery_key("agent://s", OWNER),
        key.delivery_key("agent://r", "gen-other"),
        ring(tmp_path / "other").signing_key().delivery_key("agent://r", OWNER),
    }
    assert len(derived) == 4 and all(len(k) == 32 for k in derived)
    assert key.delivery_kid(OWNER) != key.delivery_kid("gen-other")
    assert all(k["kty"] == "OKP" for k in keys.jwks()["keys"])
    # an assertion made for one endpoint does not verify with another's key
    tokens = TokenService(keys)
    made = sign(tokens)
    other = jwt.PyJWK(keys.signing_key().delivery_jwk("agent://s", OWNER)).key
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(made, other, algorithms=["HS256"], audience="agent://r")


# --- the SDK's verifier ------------------------------------------------------------------------


async def test_the_verifier_refuses_what_the_gateway_did_not_sign_for_it(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    fetched: list[int] = []

    async def fetch() -> dict[str, Any]:
        fetched.append(1)
        return recipient_keys(keys)

    wall = Wall(time.time())
    verifier = DeliveryVerifier("agent://r", fetch, wall=wall)
    body = b'{"intent":"a.b"}'

    def signed(**changes: Any) -> dict[str, str]:
        claims: dict[str, Any] = {
            "sender": "agent://c",
            "recipient": "agent://r",
            "owner": OWNER,
            "intent": "a.b",
            "msg_id": "m1",
            "body": body,
            "expires_at": wall.now + 10,
            **changes,
        }
        return {"x-reach-assertion": tokens.sign_delivery(**claims)}

    async def check(headers: dict[str, str], data: bytes = body) -> tuple[int, str] | None:
        return await verifier.check(data, headers, intent="a.b", msg_id="m1", sender="agent://c")

    first = signed()
    assert await check(first) is None
    assert fetched == [1]  # keys fetched once, for the first unknown kid
    assert (await check(first)) == (401, "replayed delivery assertion")
    assert await check(signed()) is None  # a retry carries a new assertion: accepted
    refusals = {
        "unsigned": await check({}),
        "another endpoint": await check(signed(recipient="agent://other")),
        "expired": await check(signed(expires_at=wall.now - 30)),
        "body": await check(signed(), b'{"intent":"a.b","x":1}'),
        "sender": await check(signed(sender="agent://mallory")),
        "msg_id": await check(signed(msg_id="m2")),
        "intent": await check(signed(intent="a.c")),
    }
    for why, refusal in refusals.items():
        assert refusal is not None and refusal[0] == 401 and why in refusal[1], (why, refusal)


async def test_the_verifier_answers_503_while_it_cannot_fetch_keys(tmp_path: Path) -> None:
    tokens = TokenService(ring(tmp_path))

    async def fetch() -> dict[str, Any]:
        raise OSError("gateway away")

    verifier = DeliveryVerifier("agent://r", fetch)
    assertion = sign(tokens)
    refusal = await verifier.check(
        b"{}", {"x-reach-assertion": assertion}, intent="a.b", msg_id="m", sender=None
    )
    assert refusal is not None and refusal[0] == 503 and "gateway away" in refusal[1]


def test_the_replay_memory_is_bounded() -> None:
    async def fetch() -> dict[str, Any]:
        return {"keys": []}

    wall = Wall()
    verifier = DeliveryVerifier("agent://r", fetch, wall=wall, replay_max=100)
    for n in range(1000):
        assert verifier._note(f"id{n}", NOW + 60) is None
    assert len(verifier._seen) <= 100
    assert verifier._note("id999", NOW + 60) is not None  # recent ones are still remembered
    wall.now = NOW + 120  # all expired: forgotten as new ones come
    assert verifier._note("fresh", NOW + 180) is None
    assert len(verifier._seen) == 1


def test_umask_does_not_loosen_key_files(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = generate_key(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_bad_new_key_file_does_not_keep_a_deleted_key(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    old = next(iter(keys.keys))
    generate_key(tmp_path, activate_in_s=60)
    keys.load()
    (old_file,) = (p for p in tmp_path.glob("*.pem") if keys.keys[old].path == str(p))
    old_file.unlink()
    (tmp_path / "broken.pem").write_bytes(b"junk")
    with pytest.raises(KeyDirectoryError, match="broken"):
        keys.load()
    assert old not in keys.keys and len(keys.keys) == 1  # the deletion took effect


async def test_the_verifier_drops_keys_the_gateway_no_longer_publishes(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    published = recipient_keys(keys)
    clock = [0.0]

    async def fetch() -> dict[str, Any]:
        return published

    verifier = DeliveryVerifier("agent://r", fetch, monotonic=lambda: clock[0])

    async def check() -> tuple[int, str] | None:
        assertion = sign(tokens)
        return await verifier.check(
            b"{}", {"x-reach-assertion": assertion}, intent="a.b", msg_id="m", sender=None
        )

    assert await check() is None
    published = {"keys": []}  # the gateway retired the key
    clock[0] = 30.0
    assert await check() is None  # within a minute the agent still trusts what it fetched
    clock[0] = 61.0
    refusal = await check()
    assert refusal is not None and refusal[0] == 401 and "does not publish" in refusal[1]


def test_retiring_every_key_leaves_nothing_that_signs_or_verifies(tmp_path: Path) -> None:
    """The leaked key deleted and its replacement unreadable: the leaked key is gone anyway,
    and nothing is signed (rather than signed with it) until a good key is there."""
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    leaked, _ = tokens.issue(Kind.CLIENT, "agent://c", 600)
    (old_file,) = tmp_path.glob("*.pem")
    old_file.unlink()
    (tmp_path / "new.pem").write_bytes(b"not a key yet")
    with pytest.raises(KeyDirectoryError):
        keys.load()
    assert keys.keys == {} and keys.jwks() == {"keys": []}
    with pytest.raises(Unauthorized, match="unknown key"):
        tokens.verify(leaked, {Kind.CLIENT})
    with pytest.raises(KeyDirectoryError, match="no usable key"):
        tokens.issue(Kind.CLIENT, "agent://c", 600)


async def test_a_new_registration_is_not_refused_while_its_keys_are_fetched(
    tmp_path: Path,
) -> None:
    """An agent registered anew (its endpoint token expired: a new registration, so new
    delivery keys) within a second of its last fetch gets a retryable 503 for the new key's
    first delivery, not a refusal; the next one, once fetching is allowed, is accepted. A kid
    of no gateway key is refused as before."""
    keys = ring(tmp_path / "k")
    tokens = TokenService(keys)
    registration = [OWNER]
    clock = [0.0]

    async def fetch() -> dict[str, Any]:
        return keys.jwks(recipient=("agent://r", registration[0]))

    verifier = DeliveryVerifier("agent://r", fetch, monotonic=lambda: clock[0])

    async def check(assertion: str) -> tuple[int, str] | None:
        return await verifier.check(
            b"{}", {"x-reach-assertion": assertion}, intent="a.b", msg_id="m", sender=None
        )

    assert await check(sign(tokens)) is None  # fetched at 0.0
    registration[0] = "gen-2"
    clock[0] = 0.5
    refusal = await check(sign(tokens, owner="gen-2"))
    assert refusal is not None and refusal[0] == 503 and "new registration" in refusal[1]
    stranger = TokenService(ring(tmp_path / "stranger"))
    refusal = await check(sign(stranger))
    assert refusal is not None and refusal[0] == 401 and "does not publish" in refusal[1]
    clock[0] = 1.6
    assert await check(sign(tokens, owner="gen-2")) is None
    old = sign(tokens)  # the old registration's key: no longer given to this agent
    refusal = await check(old)  # within a second of the fetch: could be newer, so 503
    assert refusal is not None and refusal[0] == 503
    clock[0] = 2.7  # fetched again, and still not there: refused
    refusal = await check(old)
    assert refusal is not None and refusal[0] == 401 and "does not publish" in refusal[1]


async def test_only_a_newer_registration_of_this_endpoint_gets_a_503(tmp_path: Path) -> None:
    """Within a second of a fetch, an unknown kid is retryable only when it could be this
    endpoint's newer registration; an assertion for another endpoint, or with a gateway key's
    bare kid, is refused at once (a gateway's retries would only burn the deadline)."""
    import jwt

    keys = ring(tmp_path)
    tokens = TokenService(keys)
    clock = [0.0]

    async def fetch() -> dict[str, Any]:
        return recipient_keys(keys)

    verifier = DeliveryVerifier("agent://r", fetch, monotonic=lambda: clock[0])

    async def check(assertion: str) -> tuple[int, str] | None:
        return await verifier.check(
            b"{}", {"x-reach-assertion": assertion}, intent="a.b", msg_id="m", sender=None
        )

    assert await check(sign(tokens)) is None  # fetched at 0.0
    clock[0] = 0.5
    elsewhere = sign(tokens, recipient="agent://other", owner="gen-other")
    refusal = await check(elsewhere)
    assert refusal is not None and refusal[0] == 401, refusal
    (public,) = (k for k in keys.jwks()["keys"])
    bare = jwt.encode(
        {"aud": "agent://r", "sub": "", "kind": "delivery", "exp": NOW * 2, "jti": "x"},
        b"k" * 32,
        algorithm="HS256",
        headers={"kid": public["kid"]},
    )
    refusal = await check(bare)
    assert refusal is not None and refusal[0] == 401, refusal
    assert await check(sign(tokens, owner="gen-2")) == (
        503,
        "delivery key of a new registration: fetched within a second",
    )


async def test_an_answer_without_delivery_keys_keeps_the_keys_held(tmp_path: Path) -> None:
    """Public keys and no delivery key (the answer to a fetch made without the endpoint
    token): not taken as "no delivery keys any more". Deliveries are answered 503 while the
    agent has none, and checked with the keys it holds once it has them."""
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    answers = [keys.jwks(), recipient_keys(keys), keys.jwks()]
    clock = [0.0]

    async def fetch() -> dict[str, Any]:
        return answers.pop(0)

    verifier = DeliveryVerifier("agent://r", fetch, monotonic=lambda: clock[0])

    async def check() -> tuple[int, str] | None:
        return await verifier.check(
            b"{}", {"x-reach-assertion": sign(tokens)}, intent="a.b", msg_id="m", sender=None
        )

    refusal = await check()
    assert refusal is not None and refusal[0] == 503 and "no delivery key" in refusal[1]
    clock[0] = 1.5
    assert await check() is None
    clock[0] = 70.0  # the periodic refresh gets public keys only: the keys held stay
    assert await check() is None
    assert not answers


def test_the_assertions_hmac_is_rfc_2104() -> None:
    """The MAC with its key blocks hashed once gives what the standard library gives."""
    import hmac

    from agent_reach.auth.tokens import _Mac

    with pytest.raises(ValueError, match="64 bytes"):
        _Mac(bytes(65))  # RFC 2104 would hash it first: not what this class does
    for key in (b"", b"k", os.urandom(32), os.urandom(64)):
        mac = _Mac(key)
        for message in (b"", b"x", os.urandom(380), os.urandom(5000)):
            assert mac(message) == hmac.digest(key, message, "sha256")
            assert mac(message) == hmac.digest(key, message, "sha256")  # the states unchanged


def test_assertions_read_whole_whatever_the_lengths_of_their_parts(tmp_path: Path) -> None:
    """The claims that do not change are encoded once, padded to join the rest's base64:
    every length of recipient, sender and intent (each remainder mod 3) must still give one
    JSON object with every claim, verified with the recipient's key."""
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    for n in range(6):
        recipient, sender, intent = (
            f"agent://r{'x' * n}",
            f"agent://s{'y' * (n // 2)}",
            "a.b" + "c" * n,
        )
        for who in (sender, None):
            made = tokens.sign_delivery(
                sender=who,
                recipient=recipient,
                owner=OWNER,
                intent=intent,
                msg_id=f"m{n}",
                body=b"{}" * n,
                expires_at=time.time() + 30,
            )
            secret = jwt.PyJWK(keys.signing_key().delivery_jwk(recipient, OWNER)).key
            claims = jwt.decode(made, secret, algorithms=["HS256"], audience=recipient)
            assert (claims["sub"], claims["intent"], claims["msg_id"]) == (
                who or "",
                intent,
                f"m{n}",
            )
            assert claims["bh"] == body_hash(b"{}" * n) and claims["kind"] == "delivery"
            assert set(claims) == {
                "iss",
                "aud",
                "sub",
                "kind",
                "intent",
                "msg_id",
                "bh",
                "iat",
                "exp",
                "jti",
            }
