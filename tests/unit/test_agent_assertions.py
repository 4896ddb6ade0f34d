"""The agent SDK's delivery verifier (agent_reach.sdk._assertions) when deliveries arrive
together: one key fetch in flight, awaited by every check that needs it, and no final 401 for
a key that only a fetch held back could have brought. The gateway's ``GET /v1/keys`` (an
external edge) is a function answering as the test says; the monotonic clock is a list."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import TokenService
from agent_reach.sdk._assertions import DeliveryVerifier

ENDPOINT, OWNER = "agent://r", "gen-r"


def ring(path: Path) -> KeyRing:
    generate_key(path)
    keys = KeyRing(path)
    keys.load()
    return keys


def published(keys: KeyRing) -> dict[str, Any]:
    """What ``GET /v1/keys`` answers agent://r's endpoint token."""
    return keys.jwks(recipient=(ENDPOINT, OWNER))


class Gateway:
    """``fetch_keys``: each call waits for ``gate`` (when set up), then gives the next of
    ``answers`` (an exception is raised)."""

    def __init__(self, *answers: dict[str, Any] | Exception, gated: bool = False) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.gate: asyncio.Event | None = asyncio.Event() if gated else None

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def signed(tokens: TokenService, msg_id: str) -> str:
    """The assertion of a delivery ``msg_id`` to agent://r, made with the key signing now."""
    return tokens.sign_delivery(
        sender=None,
        recipient=ENDPOINT,
        owner=OWNER,
        intent="a.b",
        msg_id=msg_id,
        body=b"{}",
        expires_at=time.time() + 30,
    )


def verify(verifier: DeliveryVerifier, msg_id: str, assertion: str) -> Any:
    """The check of that delivery (a coroutine)."""
    headers = {"x-reach-assertion": assertion}
    return verifier.check(b"{}", headers, intent="a.b", msg_id=msg_id, sender=None)


def checker(verifier: DeliveryVerifier, tokens: TokenService) -> Callable[[str], Any]:
    """A check of a fresh delivery ``msg_id`` to agent://r, signed with ``tokens``' key."""
    return lambda msg_id: verify(verifier, msg_id, signed(tokens, msg_id))


async def test_deliveries_arriving_together_all_wait_for_one_fetch(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    gateway = Gateway(published(keys), gated=True)
    check = checker(DeliveryVerifier(ENDPOINT, gateway, monotonic=lambda: 0.0), TokenService(keys))
    checks = [asyncio.create_task(check(m)) for m in ("m1", "m2", "m3")]
    await asyncio.sleep(0)  # each takes its first step: the first fetches, the others wait
    assert not any(c.done() for c in checks)
    assert gateway.gate is not None
    gateway.gate.set()
    # before: m2 and m3 found a fetch begun "within a second" and were refused, 401
    assert await asyncio.gather(*checks) == [None, None, None]
    assert gateway.calls == 1


async def test_a_check_that_goes_away_does_not_take_the_fetch_with_it(tmp_path: Path) -> None:
    keys = ring(tmp_path)
    gateway = Gateway(published(keys), gated=True)
    check = checker(DeliveryVerifier(ENDPOINT, gateway, monotonic=lambda: 0.0), TokenService(keys))
    first, second = asyncio.create_task(check("m1")), asyncio.create_task(check("m2"))
    await asyncio.sleep(0)
    first.cancel()  # its caller went away (the gateway gave up on the attempt)
    await asyncio.gather(first, return_exceptions=True)
    assert gateway.gate is not None
    gateway.gate.set()
    assert await second is None and gateway.calls == 1


async def test_a_key_newer_than_the_fetch_in_flight_is_fetched_again_not_refused(
    tmp_path: Path,
) -> None:
    """A gateway key rotation while a fetch is in flight: the delivery signed with the new key
    joined a fetch begun before it arrived, whose answer may predate the key. It is refused
    only after a fetch begun after it arrived, and here that one has the key."""
    keys = ring(tmp_path)
    tokens = TokenService(keys)
    before = published(keys)  # the answer of the fetch in flight: the old key only
    by_old = signed(tokens, "m1")
    generate_key(tmp_path)  # the new key, signing from now on
    keys.load()
    by_new = signed(tokens, "m2")
    clock = [0.0]
    gateway = Gateway(before, published(keys), gated=True)
    verifier = DeliveryVerifier(ENDPOINT, gateway, monotonic=lambda: clock[0])
    signed_before = asyncio.create_task(verify(verifier, "m1", by_old))
    await asyncio.sleep(0)  # fetching
    signed_after = asyncio.create_task(verify(verifier, "m2", by_new))
    await asyncio.sleep(0)  # waits for that fetch
    clock[0] = 1.5  # the fetch took long: another may begin when it ends
    assert gateway.gate is not None
    gateway.gate.set()
    assert await signed_before is None
    assert await signed_after is None  # before: 401, "a key the gateway does not publish"
    assert gateway.calls == 2


async def test_within_a_second_of_a_failed_fetch_a_delivery_gets_503_not_401(
    tmp_path: Path,
) -> None:
    """At the agent's start a delivery can come before the registration's answer (no endpoint
    token yet: the fetch fails). The next one, within the second, was refused 401 for a key
    "the gateway does not publish"; it is a 503 (retried) like the first."""
    keys = ring(tmp_path)
    clock = [0.0]
    gateway = Gateway(RuntimeError("no endpoint token yet"), published(keys))
    check = checker(
        DeliveryVerifier(ENDPOINT, gateway, monotonic=lambda: clock[0]), TokenService(keys)
    )
    refusal = await check("m1")
    assert refusal is not None and refusal[0] == 503 and "no endpoint token" in refusal[1]
    clock[0] = 0.3
    refusal = await check("m2")  # fetching held back: still unknown, still retryable
    assert refusal is not None and refusal[0] == 503 and "no endpoint token" in refusal[1]
    assert gateway.calls == 1
    clock[0] = 1.2
    assert await check("m3") is None and gateway.calls == 2
