"""Token mode's per-call costs, in process: µs per call of each piece, next to baselines.

Measured (each figure: ``--repeats`` bounded loops, timeit-style with the garbage collector off;
the median per call and the min-max over repeats):

- gateway, per send: ``TokenService.verify`` of a cached token (every request after a caller's
  first), ``Access`` per-send checks as ``/v1/send`` runs them (``caller`` + ``limit`` +
  ``check_send``, cached token, 20-rule policy), ``Policy.may_reach`` (memoized: the steady
  state), ``Policy.allowed_endpoints`` (not memoized: runs on every send without a hint),
  ``RateLimiter.take`` (with the monotonic clock read, as the gateway does), and
  ``TokenService.sign_delivery`` (once per delivery attempt: an HS256 JWT with the recipient's
  delivery key);
- gateway, now and then: ``TokenService.verify`` of a token never seen (a caller's first request,
  or every request after a key change), ``Policy.may_reach`` on a memo miss (the matching rule is
  the 20th), ``AddressGuard.refusal_for_address`` (registration, and DNS answers of endpoint
  names; a literal IP in an endpoint URL is never resolved);
- agent, per delivery: the SDK's ``DeliveryVerifier.check`` of a fresh assertion (keys already
  fetched through an async fetch function returning a JWKS dict);
- baselines in the same process: a dict lookup, ``msgspec`` encoding and decoding of the send
  body, SHA-256 of the delivered body (the ``bh`` claim), raw Ed25519 sign and verify
  (``cryptography``) of a message of an assertion's size (the floor under PyJWT's EdDSA, what
  a bearer token's first sight costs), and HMAC-SHA256 of the same (a delivery assertion's).

Calls that consume their input (a token's first sight, an assertion's single use) run over
``--fresh`` inputs made before timing, per repeat; the rest are calibrated to about
``--seconds`` a repeat. Prints a table, or one JSON object with ``--json`` (benchmarks/run.py).
Usage: ``python benchmarks/auth_bench.py [--repeats 5] [--json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hmac
import importlib.metadata
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService, body_hash
from agent_reach.core.netguard import AddressGuard
from agent_reach.core.policy import parse_policy
from agent_reach.core.ratelimit import RateLimiter
from agent_reach.gateway.access import Access
from agent_reach.gateway.principal import SENDERS
from agent_reach.gateway.service import Caller
from agent_reach.sdk._assertions import ASSERTION_HEADER, DeliveryVerifier
from agent_reach.settings import GatewaySettings
from agent_reach.wire.bodies import SendBody, decode

SENDER = "agent://bench-caller"
RECIPIENT = "agent://bench-agent"
OWNER = "5e" * 12  # the recipient's registration (an endpoint token's gen)
INTENT = "bench.echo"
SEND_BODY = json.dumps({"intent": INTENT, "payload": {"city": "Chengdu", "n": 1}}).encode()
DELIVERY = json.dumps(  # what the gateway delivers (and signs the SHA-256 of)
    {
        "msg_id": "msg_" + "5f" * 16,
        "trace_id": "trace_" + "1c" * 16,
        "sender": SENDER,
        "recipient_hint": None,
        "intent": INTENT,
        "payload": {"city": "Chengdu", "n": 1},
        "priority": "normal",
        "timeout_ms": 8000,
    }
).encode()
MSG_ID = "msg_" + "5f" * 16


def policy_text(rules: int = 20) -> str:
    """``rules`` [[reach]] rules for other teams, the last one for the benchmark's caller."""
    out = []
    for i in range(rules - 1):
        out.append(f'[[reach]]\nsenders = ["agent://team{i}-*"]\nintents = ["svc{i}.*"]\n')
    out.append('[[reach]]\nsenders = ["agent://bench-*"]\nintents = ["bench.*"]\n')
    out.append('[[claim]]\nendpoints = ["agent://*"]\nintents = ["*"]\n')
    return "\n".join(out)


@dataclass
class Item:
    """One measured call: µs per call over repeats."""

    group: str
    name: str
    per_call_us: list[float] = field(default_factory=list)
    n: int = 0

    def summary(self) -> dict[str, Any]:
        us = self.per_call_us
        return {
            "group": self.group,
            "name": self.name,
            "us_median": statistics.median(us),
            "us_min": min(us),
            "us_max": max(us),
            "calls_per_repeat": self.n,
        }


def _loop(fn: Callable[[], object], n: int) -> float:
    """Seconds for ``n`` calls of ``fn``."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def repeat_calls(
    group: str, name: str, fn: Callable[[], object], repeats: int, seconds: float
) -> Item:
    """``fn`` called in a loop calibrated to about ``seconds`` a repeat (100 to 1,000,000)."""
    fn()  # warm: caches, lazy imports
    probe = 20
    per = _loop(fn, probe) / probe
    n = int(min(1_000_000, max(100, seconds / max(per, 1e-9))))
    item = Item(group, name, n=n)
    for _ in range(repeats):
        item.per_call_us.append(_loop(fn, n) / n * 1e6)
    return item


def repeat_fresh(
    group: str,
    name: str,
    make: Callable[[int], list[Any]],
    use: Callable[[Any], object],
    repeats: int,
    fresh: int,
) -> Item:
    """``use`` on ``fresh`` inputs made by ``make`` (untimed) before each repeat."""
    item = Item(group, name, n=fresh)
    use(make(1)[0])  # warm
    for _ in range(repeats):
        inputs = make(fresh)
        t0 = time.perf_counter()
        for x in inputs:
            use(x)
        item.per_call_us.append((time.perf_counter() - t0) / fresh * 1e6)
    return item


async def _check_all(
    verifier: DeliveryVerifier, assertions: list[str], sender: str | None
) -> float:
    t0 = time.perf_counter()
    for a in assertions:
        refused = await verifier.check(
            DELIVERY, {ASSERTION_HEADER: a}, intent=INTENT, msg_id=MSG_ID, sender=sender
        )
        if refused is not None:
            raise RuntimeError(f"DeliveryVerifier refused a good delivery: {refused}")
    return time.perf_counter() - t0


def bench(args: argparse.Namespace, keydir: Path) -> list[Item]:
    generate_key(keydir)
    ring = KeyRing(keydir)
    ring.load()
    tokens = TokenService(ring)
    reps, secs, fresh = args.repeats, args.seconds, args.fresh
    items: list[Item] = []

    def calls(group: str, name: str, fn: Callable[[], object]) -> None:
        items.append(repeat_calls(group, name, fn, reps, secs))
        print(f"  {name}: {items[-1].summary()['us_median']:.3f} µs", file=sys.stderr)

    def fresh_calls(
        group: str, name: str, make: Callable[[int], list[Any]], use: Callable[[Any], object]
    ) -> None:
        items.append(repeat_fresh(group, name, make, use, reps, fresh))
        print(f"  {name}: {items[-1].summary()['us_median']:.3f} µs", file=sys.stderr)

    # --- baselines ------------------------------------------------------------------------
    table = {f"agent://endpoint-{i}": i for i in range(10_000)}
    calls("baseline", "dict lookup (10k str keys)", lambda: table.get("agent://endpoint-4321"))
    body = decode(SEND_BODY, SendBody)
    encode = msgspec.json.Encoder().encode
    calls("baseline", "msgspec encode of the send body (SendBody)", lambda: encode(body))
    calls(
        "baseline",
        "msgspec decode of the send body (SendBody)",
        lambda: decode(SEND_BODY, SendBody),
    )
    calls(
        "baseline",
        f"SHA-256 of the delivered body ({len(DELIVERY)} B)",
        lambda: body_hash(DELIVERY),
    )
    key = ring.signing_key()
    message = b"x" * 380  # header.claims of a delivery assertion, base64url: about this size
    signature = key.private.sign(message)
    calls("baseline", "Ed25519 sign, raw (cryptography, 380 B)", lambda: key.private.sign(message))
    calls(
        "baseline",
        "Ed25519 verify, raw (cryptography, 380 B)",
        lambda: key.public.verify(signature, message),
    )
    secret = key.delivery_key(RECIPIENT, OWNER)
    calls(
        "baseline",
        "HMAC-SHA256, raw (hashlib, 380 B)",
        lambda: hmac.digest(secret, message, "sha256"),
    )

    # --- gateway, per send ----------------------------------------------------------------
    token, _ = tokens.issue(Kind.CLIENT, SENDER, 3600)
    calls(
        "gateway, per send",
        "TokenService.verify, cached token",
        lambda: tokens.verify(token, SENDERS),
    )
    policy = parse_policy(policy_text(20))
    calls(
        "gateway, per send",
        "Policy.may_reach, 20 rules, memoized",
        lambda: policy.may_reach(SENDER, INTENT),
    )
    calls(
        "gateway, per send",
        "Policy.allowed_endpoints, 20 rules (match in the 20th)",
        lambda: policy.allowed_endpoints(SENDER, INTENT),
    )
    limiter = RateLimiter(1e9, 1e9)
    mono = time.monotonic
    calls(
        "gateway, per send",
        "RateLimiter.take (+ monotonic clock read)",
        lambda: limiter.take(SENDER, mono()),
    )
    header = f"Bearer {token}"
    for rules in (1, 20):
        policy_file = keydir.parent / f"policy-{rules}.toml"
        policy_file.write_text(policy_text(rules))
        settings = GatewaySettings(
            auth="tokens", keys=str(keydir), policy=str(policy_file), rate_limit=1e9
        )
        access = Access(settings)
        access.load()

        def per_send(access: Access = access) -> object:
            principal = access.authenticate(
                Caller(remote="127.0.0.1", authorization=header), SENDERS, "send"
            )
            access.limit(principal)
            return access.check_send(principal, None, INTENT, None)

        calls(
            "gateway, per send",
            f"Access: caller + limit + check_send (cached token, {rules} rule"
            + ("s)" if rules > 1 else ")"),
            per_send,
        )
    deadline = time.time() + 8.0
    calls(
        "gateway, per send",
        "TokenService.sign_delivery (once per attempt)",
        lambda: tokens.sign_delivery(
            sender=SENDER,
            recipient=RECIPIENT,
            owner=OWNER,
            intent=INTENT,
            msg_id=MSG_ID,
            body=DELIVERY,
            expires_at=deadline,
        ),
    )

    # --- gateway, now and then ------------------------------------------------------------
    def new_tokens(k: int) -> list[str]:
        return [tokens.issue(Kind.CLIENT, SENDER, 3600)[0] for _ in range(k)]

    fresh_calls(
        "gateway, occasional",
        "TokenService.verify, first sight (signature checked)",
        new_tokens,
        lambda t: tokens.verify(t, SENDERS),
    )
    serial = iter(range(10**9))

    def new_senders(k: int) -> list[str]:
        return [f"agent://bench-caller-{next(serial)}" for _ in range(k)]

    fresh_calls(
        "gateway, occasional",
        "Policy.may_reach, 20 rules, memo miss (match in the 20th)",
        new_senders,
        lambda s: policy.may_reach(s, INTENT),
    )
    guard = AddressGuard()
    calls(
        "gateway, occasional",
        "AddressGuard.refusal_for_address('127.0.0.1'), default guard",
        lambda: guard.refusal_for_address("127.0.0.1"),
    )

    # --- agent, per delivery --------------------------------------------------------------
    jwks = ring.jwks(recipient=(RECIPIENT, OWNER))  # what the recipient's endpoint token gets

    async def fetch_keys() -> Mapping[str, Any]:
        return jwks

    def assertions(k: int) -> list[str]:
        exp = time.time() + 600
        return [
            tokens.sign_delivery(
                sender=SENDER,
                recipient=RECIPIENT,
                owner=OWNER,
                intent=INTENT,
                msg_id=MSG_ID,
                body=DELIVERY,
                expires_at=exp,
            )
            for _ in range(k)
        ]

    verifier = DeliveryVerifier(RECIPIENT, fetch_keys)
    item = Item("agent, per delivery", "DeliveryVerifier.check (SDK), fresh assertion", n=fresh)
    asyncio.run(_check_all(verifier, assertions(1), SENDER))  # fetches the keys
    for _ in range(reps):
        batch = assertions(fresh)
        item.per_call_us.append(asyncio.run(_check_all(verifier, batch, SENDER)) / fresh * 1e6)
    items.append(item)
    print(f"  {item.name}: {item.summary()['us_median']:.3f} µs", file=sys.stderr)
    return items


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("pyjwt", "cryptography", "msgspec"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def table(items: list[dict[str, Any]]) -> Iterator[str]:
    yield "| group | call | µs per call |"
    yield "|---|---|---|"
    for it in items:
        lo, hi = it["us_min"], it["us_max"]
        spread = "" if f"{lo:.2f}" == f"{hi:.2f}" else f" ({lo:.2f}-{hi:.2f})"
        yield f"| {it['group']} | {it['name']} | {it['us_median']:.2f}{spread} |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed loops per call (default 5)")
    p.add_argument(
        "--seconds", type=float, default=0.2, help="about this long per loop (default 0.2)"
    )
    p.add_argument(
        "--fresh", type=int, default=1000, help="inputs per loop of the one-use calls (1000)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (for run.py)")
    args = p.parse_args()
    if args.repeats < 1 or args.fresh < 1 or not 0 < args.seconds <= 5:
        p.error("--repeats and --fresh must be >= 1, --seconds within (0, 5]")
    gc.collect()
    gc.disable()  # as timeit does: no collection pauses inside the loops
    try:
        with tempfile.TemporaryDirectory(prefix="auth-bench-") as tmp:
            items = [i.summary() for i in bench(args, Path(tmp) / "keys")]
    finally:
        gc.enable()
    result = {"versions": versions(), "repeats": args.repeats, "items": items}
    if args.json:
        json.dump(result, sys.stdout)
    else:
        print(", ".join(f"{k} {v}" for k, v in result["versions"].items()))
        print("\n".join(table(items)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
