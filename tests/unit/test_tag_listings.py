"""The listings of every tag (``GET /v1/intents``, the MCP watch of the tags reachable now) at
a large registry: right, and made a chunk of tags at a time, the event loop turning between
(at 50,000 tags each held the loop ~90-180 ms in one go).

A real node on a fake clock; a task beside the listing counts the loop's turns."""

from __future__ import annotations

from agent_reach.gateway.listing import TAG_CHUNK
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import Caller
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody
from tests.support import turns_during

TAGS = 5_000


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
