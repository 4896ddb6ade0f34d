"""The in-process claim map (the A2A owners on ``memory://``) is bounded: past ``max_entries``
the expired entries go first, then the least recently claimed live ones, a sixteenth of the
bound at once (counted); a renewed claim is recent again. On a fake clock, nothing sleeps."""

from __future__ import annotations

from agent_reach.registry.memory import MemoryClaimMap
from agent_reach.testing import FakeClock


async def test_past_the_bound_the_least_recently_claimed_go_and_are_counted() -> None:
    clock = FakeClock()
    owners = MemoryClaimMap(clock.monotonic, max_entries=32)
    for n in range(32):
        assert await owners.claim(f"ctx:{n}", f"owner-{n}", 60.0) == f"owner-{n}"
    assert await owners.claim("ctx:0", "owner-0", 60.0) == "owner-0"  # renewed: recent again
    assert owners.evicted == 0
    assert await owners.claim("ctx:new", "owner-new", 60.0) == "owner-new"  # one past
    # 33 live: down to 30 (a sixteenth of 32 is 2 of room), the oldest claims first
    assert owners.evicted == 3
    assert [await owners.get(f"ctx:{n}") for n in (1, 2, 3)] == [None, None, None]
    assert await owners.get("ctx:0") == "owner-0"
    assert await owners.get("ctx:4") == "owner-4"
    assert await owners.get("ctx:new") == "owner-new"


async def test_expired_entries_make_room_before_any_live_one_goes() -> None:
    clock = FakeClock()
    owners = MemoryClaimMap(clock.monotonic, max_entries=32)
    for n in range(16):
        await owners.claim(f"short:{n}", "a", 1.0)
    for n in range(16):
        await owners.claim(f"long:{n}", "b", 60.0)
    clock.advance(2.0)  # the short ones expired
    await owners.claim("ctx:new", "c", 60.0)
    assert owners.evicted == 0
    assert all([await owners.get(f"long:{n}") == "b" for n in range(16)])


async def test_a_bound_of_one_keeps_the_claim_just_made() -> None:
    owners = MemoryClaimMap(FakeClock().monotonic, max_entries=1)
    await owners.claim("ctx:a", "x", 60.0)
    assert await owners.claim("ctx:b", "y", 60.0) == "y"
    assert await owners.get("ctx:b") == "y" and await owners.get("ctx:a") is None
    assert await owners.claim("ctx:b", "z", 60.0) == "y"  # held: first claim wins still


async def test_a_flood_of_new_claims_keeps_the_map_within_its_bound() -> None:
    clock = FakeClock()
    owners = MemoryClaimMap(clock.monotonic, max_entries=1000)
    for n in range(20_000):
        await owners.claim(f"ctx:{n}", "x", 3600.0)
    assert len(owners._values) <= 1000
    assert owners.evicted == 20_000 - len(owners._values)
