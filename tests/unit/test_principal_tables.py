"""The callers the gateway's access control keeps (open mode: by address) are bounded, and a
clear at the bound is counted (``agent_reach_bound_hits_total{bound="principals"}``)."""

from __future__ import annotations

from agent_reach.auth.tokens import Kind
from agent_reach.gateway.access import _ANONYMOUS_KEPT, Access
from agent_reach.gateway.service import Caller
from agent_reach.settings import GatewaySettings


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
