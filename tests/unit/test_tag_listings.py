"""The listings of every tag (``GET /v1/intents``, the MCP watch of the tags reachable now) at
a large registry: right, and made a chunk of tags at a time, the event loop turning between
(at 50,000 tags each held the loop ~90-180 ms in one go).

A real node on a fake clock; a task beside the listing counts the loop's turns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent_reach.edges.mcp.tools import first_reachable
from agent_reach.gateway.listing import JUDGE_CHUNK, TAG_CHUNK, Routable, intents_pieces
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody, encode
from tests.support import turns_during

TAGS = 5_000
ENDPOINTS = 5_000


async def node_with_tags() -> Node:
    node = Node(GatewaySettings(matcher="none"), clock=FakeClock())
    for n in range(TAGS):
        await node.router.register(
            RegisterBody(
                endpoint_id=f"agent://t{n}",
                capabilities=[f"bulk.tag-{n}"],
                endpoint_url="http://127.0.0.1:9/",
            )
        )
    return node


async def test_the_intents_listing_turns_the_loop_between_chunks() -> None:
    node = await node_with_tags()
    answer, served = await turns_during(node.service.intents(Caller(remote="127.0.0.1")))
    listed = {i.tag: (i.served_by, i.routable) for i in answer.intents}
    assert len(listed) == TAGS and listed["bulk.tag-7"] == (1, 1)
    assert served >= TAGS // TAG_CHUNK - 1, served


async def test_the_reachable_tags_are_judged_a_chunk_at_a_time() -> None:
    node = await node_with_tags()
    reachable, served = await turns_during(node.service.reachable_now())
    assert len(reachable) == TAGS
    assert served >= TAGS // TAG_CHUNK - 1, served


async def node_with_one_tag(endpoints: int, clock: FakeClock) -> Node:
    node = Node(GatewaySettings(matcher="none"), clock=clock)
    for n in range(endpoints):
        await node.router.register(
            RegisterBody(
                endpoint_id=f"agent://r{n}",
                capabilities=["bulk.popular"],
                endpoint_url="http://127.0.0.1:9/",
            )
        )
    return node


async def test_one_tag_of_many_endpoints_is_judged_a_chunk_of_endpoints_at_a_time() -> None:
    """The chunks were of tags: one tag declared by 5,000 replicas was 5,000 healths derived
    in one go (a thousand tags of ten each, ~30 ms at 50,000 endpoints)."""
    clock = FakeClock()
    node = await node_with_one_tag(ENDPOINTS, clock)
    caller = Caller(remote="127.0.0.1")
    answer, served = await turns_during(node.service.intents(caller))
    (info,) = answer.intents
    assert (info.tag, info.served_by, info.routable) == ("bulk.popular", ENDPOINTS, ENDPOINTS)
    assert served >= ENDPOINTS // JUDGE_CHUNK - 1, served
    # every replica down: the watch of reachable tags looks at all of them, a chunk at a time
    clock.advance(10 * float(node.settings.heartbeat_interval))
    reachable, served = await turns_during(node.service.reachable_now())
    assert reachable == frozenset() and served >= ENDPOINTS // JUDGE_CHUNK - 1, served
    (info,) = (await node.service.intents(caller)).intents
    assert (info.served_by, info.routable) == (ENDPOINTS, 0)


async def test_a_registration_during_a_tags_chunks_changes_nothing_counted() -> None:
    clock = FakeClock()
    node = await node_with_one_tag(ENDPOINTS, clock)

    async def churn() -> None:
        for n in range(ENDPOINTS, ENDPOINTS + 20):
            await node.router.register(
                RegisterBody(
                    endpoint_id=f"agent://r{n}",
                    capabilities=["bulk.popular"],
                    endpoint_url="http://127.0.0.1:9/",
                )
            )
            await node.router.deregister(f"agent://r{n - ENDPOINTS}")
            await asyncio.sleep(0)

    beside = asyncio.create_task(churn())
    answer = await node.service.intents(Caller(remote="127.0.0.1"))
    await beside
    (info,) = answer.intents
    # the ids of the tag when it was reached; those deregistered meanwhile are not routable
    assert info.served_by == ENDPOINTS and ENDPOINTS - 20 <= info.routable <= ENDPOINTS


@pytest.mark.parametrize("tags", [0, 1, TAG_CHUNK, TAG_CHUNK + 1, 2 * TAG_CHUNK + 7])
async def test_the_intents_answer_in_pieces_is_the_answer_encoded_whole(tags: int) -> None:
    from agent_reach.wire.answers import IntentInfo, IntentsAnswer
    from agent_reach.wire.bodies import encode

    answer = IntentsAnswer(
        "warn",
        [
            IntentInfo(f"t.n{n}", "words", ["a"], [], known=n % 2 == 0, served_by=n, routable=1)
            for n in range(tags)
        ],
    )
    pieces = [piece async for piece in intents_pieces(answer)]
    assert b"".join(pieces) == encode(answer)
    assert len(pieces) == 2 + -(-tags // TAG_CHUNK)  # opening, a piece a chunk, closing


async def test_a_big_tag_after_small_ones_starts_with_what_is_left_of_the_turn() -> None:
    """998 endpoints of one tag leave 2 of the turn's 1,000 (a tag counts one more); a tag of
    2,000 then goes 2, 1,000, 998 a turn: three turns, never 1,002 in one."""
    node = Node(GatewaySettings(matcher="none"), clock=FakeClock())
    for n in range(998 + 2_000):
        tag = "bulk.small" if n < 998 else "bulk.big"
        await node.router.register(
            RegisterBody(
                endpoint_id=f"agent://r{n}", capabilities=[tag], endpoint_url="http://127.0.0.1:9/"
            )
        )
    routable = Routable(node.router)
    assert await routable.count("bulk.small") == (998, 998)
    counted, served = await turns_during(routable.count("bulk.big"))
    assert counted == (2_000, 2_000)
    assert served >= 3, served


async def test_the_mcp_tools_reachable_intents_are_the_listings_first_live_ones(
    tmp_path: Path,
) -> None:
    """What the MCP tools' descriptions name is read without the listing (8 MB at 50,000 tags,
    decoded at every ``tools/list``): it must be what ``first_reachable`` picks from the whole
    ``/v1/intents`` answer: the dictionary's live entries in file order (deprecated ones left
    out), then the other live tags sorted, with the count of the rest."""
    dictionary = tmp_path / "intents.toml"
    dictionary.write_text(
        '[[intent]]\ntag = "z.first"\ndescription = "Z first"\n\n'
        '[[intent]]\ntag = "a.old"\ndescription = "Old"\ndeprecated = true\n\n'
        '[[intent]]\ntag = "m.idle"\ndescription = "Nobody serves it"\n\n'
        '[[intent]]\ntag = "b.gone"\ndescription = "Its agents are down"\n'
    )
    clock = FakeClock()
    node = Node(GatewaySettings(matcher="none", intents=str(dictionary)), clock=clock)
    node.use_dictionary(node.read_dictionary())

    async def agent(name: str, *tags: str) -> None:
        body = RegisterBody(f"agent://{name}", list(tags), "http://127.0.0.1:9/")
        await node.router.register(body)

    for n in range(30):  # down by the time of the listing
        await agent(f"gone{n}", f"gone.t{n}", "b.gone", "z.first")
    clock.advance(10 * node.settings.heartbeat_interval)
    await agent("z", "z.first")
    await agent("old", "a.old")
    for n in range(60):
        await agent(f"live{n}", f"live.t{59 - n:02d}", "live.shared")
    caller = Caller(remote="127.0.0.1")
    listing = msgspec.json.decode(encode(await node.service.intents(caller)))

    def seen(items: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
        return [(i["tag"], i.get("description") or "", i["routable"]) for i in items]

    for first in (0, 1, 2, 40, 61, 62, 100):
        items, rest = await node.service.reachable_intents(caller, first)
        expected, expected_rest = first_reachable(listing, first)
        assert (seen(items), rest) == (seen(expected), expected_rest), first
    items, rest = await node.service.reachable_intents(caller, 3)
    assert seen(items) == [("z.first", "Z first", 1), ("live.shared", "", 60), ("live.t00", "", 1)]
    assert rest == 59  # live.t01 .. live.t59
