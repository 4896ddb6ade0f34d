"""The gateway's Agent Card under many ``Host`` headers: the skills (the costly part: one per
routable tag, 50,000 of them in a large registry) are built at most once a second, whatever the
base URL a caller names; each base URL still gets a card naming it, with an ETag of its own.

A real node and the real A2A edge on a fake clock; the requests are aiohttp's test requests."""

from __future__ import annotations

import asyncio
import json

from aiohttp.test_utils import make_mocked_request

from agent_reach.edges.a2a.edge import (
    CARD_COST_FACTOR,
    CARD_MAX_TTL_S,
    CARD_PATH,
    CARD_TTL_S,
    A2aEdge,
)
from agent_reach.gateway.node import Node
from agent_reach.gateway.service import TAG_CHUNK
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody
from tests.support import turns_during


async def register(node: Node, name: str, tag: str) -> None:
    await node.router.register(
        RegisterBody(
            endpoint_id=f"agent://{name}", capabilities=[tag], endpoint_url="http://127.0.0.1:9/"
        )
    )


async def card(edge: A2aEdge, host: str, etag: str | None = None) -> tuple[int, dict, str]:
    headers = {"Host": host} | ({"If-None-Match": etag} if etag else {})
    response = await edge.card(make_mocked_request("GET", CARD_PATH, headers=headers))
    body = json.loads(response.body) if response.status == 200 else {}
    return response.status, body, response.headers["ETag"]


async def test_a_new_host_costs_no_new_build_of_the_skills() -> None:
    clock = FakeClock()
    node = Node(GatewaySettings(), clock=clock)
    await register(node, "a", "weather.query")
    edge = A2aEdge(node)
    etags = set()
    for n in range(40):  # open mode on loopback: any port of a loopback name
        status, body, etag = await card(edge, f"localhost:{8000 + n}")
        assert status == 200
        assert body["supportedInterfaces"][0]["url"] == f"http://localhost:{8000 + n}/a2a"
        assert [s["id"] for s in body["skills"]] == ["weather.query"]
        etags.add(etag)
    assert edge.skill_builds == 1  # it was one build per base URL
    assert len(etags) == 40
    assert edge.cards_cleared == 2  # 16 base URLs kept at most
    exported = node.metrics.render().decode()
    assert 'agent_reach_bound_hits_total{bound="a2a_cards"} 2.0' in exported
    assert 'agent_reach_bound_hits_total{bound="a2a_owners"} 0.0' in exported  # memory://
    # the same base URL, its own ETag: not modified
    _, _, etag = await card(edge, "localhost:8039")
    assert (await card(edge, "localhost:8039", etag))[0] == 304
    # a second on, a new tag is in every card, and the ETags change
    await register(node, "b", "note.create")
    edge.cost_clock = lambda: 0.0  # a build that takes no time: held CARD_TTL_S
    clock.advance(CARD_MAX_TTL_S)
    status, body, new_etag = await card(edge, "localhost:8039", etag)
    assert status == 200 and new_etag != etag
    assert sorted(s["id"] for s in body["skills"]) == ["note.create", "weather.query"]
    assert edge.skill_builds == 2


async def test_a_build_serves_the_loop_between_chunks_and_concurrent_requests_share_it() -> None:
    node = Node(GatewaySettings(), clock=FakeClock())
    tags = 5_000
    for n in range(tags):
        await register(node, f"a{n}", f"bulk.tag-{n}")
    edge = A2aEdge(node)
    requests = asyncio.gather(*(card(edge, f"localhost:{9000 + n}") for n in range(10)))
    answers, served = await turns_during(requests)
    assert edge.skill_builds == 1  # one build for the ten requests that came while it ran
    assert all(len(body["skills"]) == tags for _, body, _ in answers)
    # the loop turned between chunks: judging the tags, describing them, making the skills
    # (a build in one go turned it once at most)
    assert served >= 3 * (tags // TAG_CHUNK) - 3, served


async def test_a_costly_build_is_held_longer_within_a_bound() -> None:
    clock = FakeClock()
    node = Node(GatewaySettings(), clock=clock)
    await register(node, "a", "weather.query")
    edge = A2aEdge(node)
    spent = iter([0.0, 0.5, 10.0, 20.0, 30.0, 30.05])  # builds of 0.5, 10 and 0.05 s

    edge.cost_clock = lambda: next(spent)
    await card(edge, "localhost:1")
    clock.advance(CARD_COST_FACTOR * 0.5 - 0.1)  # 10 x 0.5 s: not yet
    await card(edge, "localhost:2")
    assert edge.skill_builds == 1
    clock.advance(0.2)
    await card(edge, "localhost:3")
    assert edge.skill_builds == 2
    clock.advance(CARD_MAX_TTL_S)  # a build of 10 s is held 10 s at most, not 100
    await card(edge, "localhost:4")
    assert edge.skill_builds == 3
    clock.advance(CARD_TTL_S - 0.1)  # a quick one (0.05 s): held CARD_TTL_S
    await card(edge, "localhost:5")
    assert edge.skill_builds == 3


async def test_a_build_that_fails_fails_its_waiters_and_the_next_request_builds_afresh() -> None:
    node = Node(GatewaySettings(), clock=FakeClock())
    await register(node, "a", "weather.query")
    edge = A2aEdge(node)
    calls = 0

    def failing_clock() -> float:  # the build's first step: the fault lands inside the build
        nonlocal calls
        calls += 1
        raise RuntimeError("build broke")

    edge.cost_clock = failing_clock
    both = await asyncio.gather(
        card(edge, "localhost:8000"), card(edge, "localhost:8001"), return_exceptions=True
    )
    assert [repr(r) for r in both] == [repr(RuntimeError("build broke"))] * 2
    assert calls == 1  # the second request awaited the same build
    assert edge.skill_builds == 0
    edge.cost_clock = lambda: 0.0
    status, body, _ = await card(edge, "localhost:8000")  # nothing held: built again
    assert status == 200 and [s["id"] for s in body["skills"]] == ["weather.query"]
    assert edge.skill_builds == 1


async def test_the_skills_are_encoded_a_chunk_at_a_time_into_one_json_list_and_its_digest() -> None:
    import hashlib

    node = Node(GatewaySettings(), clock=FakeClock())
    tags = 2 * TAG_CHUNK + 7  # two full chunks and a short one
    for n in range(tags):
        await register(node, f"a{n}", f"bulk.tag-{n:05d}")
    edge = A2aEdge(node)
    status, body, _ = await card(edge, "localhost:8000")
    assert status == 200
    assert [s["id"] for s in body["skills"]] == [f"bulk.tag-{n:05d}" for n in range(tags)]
    assert edge._skills is not None
    _, skills, digest = edge._skills
    assert digest == hashlib.sha256(bytes(skills)).hexdigest()  # the digest of those bytes
