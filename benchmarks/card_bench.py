"""What the gateway's Agent Card costs at a large registry, by what the request names.

``python benchmarks/card_bench.py [--tags 50000] [--shape one|mixed] [--requests 200]
[--rounds 5]``

A real node with ``--tags`` registered endpoints and the real A2A edge, in process. Shape
``one``: each endpoint declares a tag of its own (``bench.tag-N``, registered in N's order: a
sort of input in long sorted runs, the kind case). Shape ``mixed``: each declares a tag of its
own named by a hash (no order to help a sort) and one of ``--tags`` / 10 shared tags (ten
endpoints each): ``--tags`` x 1.1 tags in all. Three kinds of card request, interleaved round
after round, each timed on the calling
thread (wall and CPU ms a request, median of the rounds):

- ``same``: the same ``Host`` again and again: served from the card kept for that base URL;
- ``new host``: a ``Host`` never asked before each time (a caller picks it): the base URL's card
  is made from the skills built at most once a second (one copy of the encoded skills);
- ``build``: the clock moved on before each: the skills are built again (what every
  ``new host`` request cost before the skills were shared across base URLs);

and, for one build a round, the longest the event loop waited meanwhile (a task beside it
that only yields, timing its turns): what every other request could wait behind a build.

Bounded: rounds x 3 x requests; a build at 50,000 tags is ~25 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from aiohttp.test_utils import make_mocked_request

from agent_reach.edges.a2a.edge import CARD_PATH, A2aEdge
from agent_reach.gateway.node import Node
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody


async def timed(edge: A2aEdge, hosts: list[str], clock: FakeClock | None) -> tuple[float, float]:
    """Wall and CPU ms a card request, over ``hosts`` (the clock moved first when given)."""
    wall = cpu = 0.0
    for host in hosts:
        if clock is not None:
            clock.advance(3600.0)  # past any hold of the last build
        request = make_mocked_request("GET", CARD_PATH, headers={"Host": host})
        w, c = time.perf_counter(), time.process_time()
        response = await edge.card(request)
        wall += time.perf_counter() - w
        cpu += time.process_time() - c
        assert response.status == 200
    return wall * 1000 / len(hosts), cpu * 1000 / len(hosts)


async def longest_hold(edge: A2aEdge, clock: FakeClock, host: str) -> float:
    """The longest gap, in ms, between two turns of a task beside one build."""
    longest = 0.0
    stop = False

    async def beside() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not stop:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    task = asyncio.create_task(beside())
    await asyncio.sleep(0)
    clock.advance(3600.0)  # past any hold of the last build
    await edge.card(make_mocked_request("GET", CARD_PATH, headers={"Host": host}))
    stop = True
    await task
    return longest * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tags", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", choices=["one", "mixed"], default="one")
    args = parser.parse_args()
    clock = FakeClock()
    # no fallback matcher: its index build (a thread) would share the CPU with what is timed
    node = Node(GatewaySettings(max_endpoints=args.tags + 1, matcher="none"), clock=clock)
    shared = max(1, args.tags // 10)
    for n in range(args.tags):
        if args.shape == "one":
            caps = [f"bench.tag-{n}"]
        else:
            own = hashlib.sha1(str(n).encode()).hexdigest()[:10]
            caps = [f"bench.own-{own}", f"bench.shared-{n % shared}"]
        await node.router.register(
            RegisterBody(
                endpoint_id=f"agent://bench-{n}",
                capabilities=caps,
                endpoint_url="http://127.0.0.1:9/reach",
            )
        )
    edge = A2aEdge(node)
    size = len((await edge.card(make_mocked_request("GET", CARD_PATH))).body)
    tags = len(node.registry.intents())
    print(f"{tags} tags ({args.shape}), a card of {size / 1e6:.1f} MB; ms a request (wall / CPU)")
    results: dict[str, list[tuple[float, float]]] = {"same": [], "new host": [], "build": []}
    holds = []
    port = 1024
    builds = max(1, args.requests // 10)  # builds are the slow kind: fewer of them a round
    for _ in range(args.rounds):
        results["same"].append(await timed(edge, ["localhost:1"] * args.requests, None))
        hosts = [f"localhost:{port + i}" for i in range(args.requests)]
        port += args.requests
        results["new host"].append(await timed(edge, hosts, None))
        hosts = [f"localhost:{port + i}" for i in range(builds)]
        port += builds
        results["build"].append(await timed(edge, hosts, clock))
        holds.append(await longest_hold(edge, clock, f"localhost:{port}"))
        port += 1
    for kind, rounds in results.items():
        wall = statistics.median(r[0] for r in rounds)
        cpu = statistics.median(r[1] for r in rounds)
        print(f"  {kind:9s} {wall:8.3f} / {cpu:8.3f}")
    rounds = ", ".join(f"{h:.1f}" for h in holds)
    print(f"the loop's longest wait during a build: {statistics.median(holds):.1f} ms ({rounds})")


if __name__ == "__main__":
    asyncio.run(main())
