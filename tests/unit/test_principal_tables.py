"""What the gateway's access control keeps by caller: the principals (open mode: by address)
are bounded, and a clear at the bound is counted (``agent_reach_bound_hits_total{bound=
"principals"}``); bad credentials are limited by address, all of NATS as one."""

from __future__ import annotations

from pathlib import Path

from agent_reach.auth.tokens import Kind
from agent_reach.errors import RateLimited, Unauthorized
from agent_reach.gateway.access import _ANONYMOUS_KEPT, Access
from agent_reach.gateway.service import Caller
from agent_reach.settings import GatewaySettings
from tests.support import secured_setup


def test_open_modes_callers_by_address_are_bounded_and_a_clear_is_counted() -> None:
    access = Access(GatewaySettings())
    kinds = {Kind.CLIENT}
    first = access.authenticate(Caller(remote="10.0.0.0"), kinds, "send")
    assert access.authenticate(Caller(remote="10.0.0.0"), kinds, "send") is first  # kept
    for n in range(1, _ANONYMOUS_KEPT):
        access.authenticate(Caller(remote=f"10.0.{n // 256}.{n % 256}"), kinds, "send")
    assert access.principals_cleared == 0
    access.authenticate(Caller(remote="10.1.0.0"), kinds, "send")  # one past: all dropped
    assert access.principals_cleared == 1
    assert access.authenticate(Caller(remote="10.0.0.0"), kinds, "send") is not first


POLICY = """\
[[reach]]
senders = ["agent://caller-*"]
intents = ["weather.*"]
"""


def test_over_nats_bad_credentials_share_one_bucket_whatever_the_reply_inbox(
    tmp_path: Path,
) -> None:
    # the NATS edge's address is the request's reply inbox, which its sender picks: a new inbox
    # a request got past the limit of bad credentials (one signature check each, unbounded)
    s = secured_setup(tmp_path, POLICY)
    settings = GatewaySettings(
        auth="tokens", keys=str(s.keys), policy=str(s.policy), rate_limit=1, rate_burst=2
    )
    access = Access(settings, monotonic=lambda: 1000.0)
    access.load()

    def code(remote: str, token: str) -> int:
        caller = Caller(remote=remote, authorization=f"Bearer {token}")
        try:
            access.authenticate(caller, {Kind.CLIENT}, "send")
        except Unauthorized:
            return 401
        except RateLimited:
            return 429
        return 200

    forged = [code(f"nats:_INBOX.r{n}", f"forged-{n}") for n in range(5)]
    assert forged == [401, 401, 429, 429, 429]
    assert code("10.0.0.1", "forged-http") == 401  # an HTTP address has its own bucket
    good = s.token(Kind.CLIENT, "agent://caller-1")
    assert code("10.0.0.1", good) == 200
    assert code("nats:_INBOX.other", good) == 200  # verified before: not held by the bucket
