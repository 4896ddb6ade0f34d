"""GET /v1/agents in pages and filters (an extension beyond CONTRACT.md v1), with the v1 listing
kept whole, and a big listing that does not hold up the gateway: real gateways on 127.0.0.1,
real HTTP, the SDK and the CLI."""

from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web

from agent_reach.edges.http.openapi import openapi_document
from agent_reach.errors import InvalidRequest
from agent_reach.sdk import ReachClient
from tests.support import Proc, cli, gateway, http, http_full, wait_until

N = 2000
AGENT_KEYS = {
    "endpoint_id",
    "capabilities",
    "endpoint_url",
    "description",
    "status",
    "last_seen_at",
    "avg_latency_ms",
    "p95_latency_ms",
}


def name(i: int) -> str:
    # not zero-padded: "ls-10" sorts before "ls-2", as the ids' code points say
    return f"agent://ls-{i}"


def intents(i: int) -> list[str]:
    return ["list.all", "list.three"] if i % 3 == 0 else ["list.all"]


async def register_all(url: str, numbers: list[int], concurrency: int = 64) -> None:
    """Register ``numbers`` (in that order, ``concurrency`` at a time) through ``url``."""
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            body = {
                "endpoint_id": name(i),
                "capabilities": intents(i),
                "endpoint_url": f"http://127.0.0.1:{9000 + i % 1000}/reach",
                "description": f"listing test agent number {i}",
            }
            async with gate, session.post(f"{url}/v1/register", json=body) as answer:
                assert answer.status == 200, await answer.text()

        await asyncio.gather(*(one(i) for i in numbers))


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    """A gateway with N agents, registered in an order that is not their ids' order."""
    with gateway("--register-rate-limit", "0", "--heartbeat-interval", "60") as proc:
        numbers = list(range(N))
        random.Random(17).shuffle(numbers)
        asyncio.run(register_all(proc.url, numbers))
        yield proc


def get(gw: Proc, query: str = "") -> tuple[int, Any]:
    return http("GET", f"{gw.url}/v1/agents{query}")


def walk(gw: Proc, params: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Every page of ``params`` in turn: the ids listed, and each page's answer (bounded)."""
    ids: list[str] = []
    pages: list[dict[str, Any]] = []
    cursor = None
    for _ in range(N + 2):
        query = f"?{params}" + (f"&cursor={cursor}" if cursor else "")
        status, page = get(gw, query)
        assert status == 200, page
        pages.append(page)
        ids += [a["endpoint_id"] for a in page["agents"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids, pages
    raise AssertionError("the pages did not end")


def test_a_plain_listing_is_v1_every_agent_in_one_answer(gw: Proc) -> None:
    status, body, headers = http_full("GET", f"{gw.url}/v1/agents")
    assert status == 200
    assert list(body) == ["agents"]  # no next_cursor, no total: the contract's answer
    ids = [a["endpoint_id"] for a in body["agents"]]
    assert sorted(ids) == sorted(name(i) for i in range(N))
    assert all(set(a) == AGENT_KEYS for a in body["agents"])
    # 2,000 agents are over half a megabyte: sent as they are built, not held whole
    assert headers.get("Transfer-Encoding") == "chunked"
    # a parameter v1 never knew changes nothing (a cache-buster, say)
    status, again = get(gw, "?_=12345")
    assert status == 200
    assert list(again) == ["agents"]
    assert len(again["agents"]) == N


def test_a_caller_that_leaves_mid_listing_costs_no_error_line(gw: Proc) -> None:
    """The big answer is being sent when the caller goes (a reset): the gateway stops, logs
    no error, and answers the next caller."""
    host, port = urlsplit(gw.url).hostname, urlsplit(gw.url).port
    assert host is not None and port is not None
    for _ in range(3):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(f"GET /v1/agents HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the answer has begun
            # close at once with a reset (no linger), the rest unread
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    status, body = get(gw)
    assert (status, len(body["agents"])) == (200, N)
    errors = [line for line in gw.log_lines() if line.get("level") == "error"]
    assert errors == []


def test_pages_cover_every_agent_exactly_once_in_id_order(gw: Proc) -> None:
    ids, pages = walk(gw, "limit=137")
    assert len(ids) == N
    assert ids == sorted(name(i) for i in range(N))  # each once, in endpoint_id order
    assert len(pages) == math.ceil(N / 137)
    assert all(set(page) == {"agents", "next_cursor", "total"} for page in pages)
    assert all(page["total"] == N for page in pages)
    assert all(len(page["agents"]) == 137 for page in pages[:-1])
    assert all(set(a) == AGENT_KEYS for a in pages[0]["agents"])
    # the largest page holds 1,000; without limit, 100
    status, page = get(gw, "?limit=1000")
    assert (status, len(page["agents"]), page["total"]) == (200, 1000, N)
    status, page = get(gw, "?cursor=" + pages[0]["next_cursor"])
    assert status == 200
    assert [a["endpoint_id"] for a in page["agents"]] == ids[137 : 137 + 100]


def test_a_walk_lists_once_every_agent_there_all_along_while_others_come_and_go(
    gw: Proc,
) -> None:
    """Keyset pages: registrations and removals during the walk never make an agent that
    stays appear twice or go missing."""
    steady = sorted(name(i) for i in range(N) if i % 10 != 7)
    leaving = [i for i in range(N) if i % 10 == 7]
    newcomers = [N + i for i in range(300)]
    ids: list[str] = []
    cursor = None
    for step in range(N):
        query = "?limit=150" + (f"&cursor={cursor}" if cursor else "")
        status, page = get(gw, query)
        assert status == 200, page
        ids += [a["endpoint_id"] for a in page["agents"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        # between pages: some leave, some come, on both sides of where the walk is
        for i in leaving[step * 20 : step * 20 + 20]:
            assert http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": name(i)})[0] == 200
        asyncio.run(register_all(gw.url, newcomers[step * 25 : step * 25 + 25]))
    try:
        assert len(ids) == len(set(ids))  # nobody twice
        assert set(steady) <= set(ids)  # nobody who stayed missing
        assert ids == sorted(ids)
    finally:  # the module's gateway as it was: N agents
        asyncio.run(register_all(gw.url, leaving))
        for i in newcomers:
            http("POST", f"{gw.url}/v1/deregister", {"endpoint_id": name(i)})
    assert len(get(gw)[1]["agents"]) == N


def test_the_intent_filter_pages_the_agents_that_declare_it(gw: Proc) -> None:
    wanted = sorted(name(i) for i in range(N) if i % 3 == 0)
    ids, pages = walk(gw, "intent=list.three&limit=250")
    assert ids == wanted
    assert all(page["total"] == len(wanted) for page in pages)
    # whole tags only, and a tag nobody declares is an empty page, not an error
    for tag in ("list", "list.thre", "nobody.declares"):
        status, page = get(gw, f"?intent={tag}")
        assert (status, page) == (200, {"agents": [], "next_cursor": None, "total": 0})
    # an empty value is no filter (a form's blank field): the v1 listing
    status, body = get(gw, "?intent=")
    assert (status, list(body), len(body["agents"])) == (200, ["agents"], N)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=ten", "limit"),
        ("?limit=2.5", "limit"),
        ("?cursor=not-a-cursor", "cursor"),
        ("?cursor=MTpub3QtYW4taWQ", "cursor"),  # base64 of "1:not-an-id"
        ("?intent=Weather.Query", "intent"),
        ("?status=ok", "status"),
        ("?status=healthy,", "status"),
        ("?status=healthy&status=down", "status"),
        ("?limit=5&limt=6", "limt"),
    ],
)
def test_bad_parameters_are_422_naming_the_field_and_change_nothing(
    gw: Proc, query: str, field: str
) -> None:
    status, answer = get(gw, query)
    assert status == 422, answer
    assert (answer["ok"], answer["error"], answer["field"]) == (False, "invalid_request", field)
    assert answer["detail"]
    status, page = get(gw, "?limit=1")
    assert (status, page["total"]) == (200, N)


@pytest.fixture(scope="module")
def aging() -> Iterator[Proc]:
    """A gateway where an agent is healthy for 3 s after its heartbeat and down after 4 s."""
    flags = ("--degraded-after", "3", "--suspect-after", "3.5", "--down-after", "4")
    with gateway("--register-rate-limit", "0", "--heartbeat-interval", "1", *flags) as proc:
        asyncio.run(register_all(proc.url, list(range(12))))
        yield proc


def test_the_status_filter_pages_the_agents_of_those_statuses(aging: Proc) -> None:
    everyone = sorted(name(i) for i in range(12))
    # no heartbeats: within the bound all are down
    wait_until(lambda: get(aging, "?status=down")[1]["total"] == 12, timeout=15)
    for i in range(4):
        assert http("POST", f"{aging.url}/v1/heartbeat", {"endpoint_id": name(i)})[0] == 200
    fresh = sorted(name(i) for i in range(4))
    ids, pages = walk(aging, "status=healthy&limit=3")
    assert ids == fresh
    assert [p["total"] for p in pages] == [4, 4]
    assert walk(aging, "status=down")[0] == sorted(set(everyone) - set(fresh))
    assert walk(aging, "status=healthy,down&limit=5")[0] == everyone
    assert get(aging, "?status=suspect,degraded")[1]["total"] == 0
    # filters together: declares list.three (0, 3, 6, 9) and is healthy (0 .. 3)
    ids, _ = walk(aging, "status=healthy&intent=list.three")
    assert ids == [name(0), name(3)]


async def test_the_sdk_takes_the_filters_and_walks_the_pages(gw: Proc) -> None:
    async with ReachClient(gw.url) as client:
        every = await client.agents()  # v1: one call, the whole list
        assert sorted(a.endpoint_id for a in every) == sorted(name(i) for i in range(N))
        threes = await client.agents(intent="list.three", page_size=97)
        assert [a.endpoint_id for a in threes] == sorted(name(i) for i in range(N) if i % 3 == 0)
        healthy = await client.agents(status=["healthy", "degraded"])
        assert len(healthy) == N
        assert await client.agents(status="down") == []
        with pytest.raises(InvalidRequest) as refused:
            await client.agents(status="sleepy")
        assert refused.value.fields.get("field") == "status"


@pytest.fixture
async def old_gateway() -> AsyncIterator[str]:
    """A gateway of before the pages, as a client may meet one: it answers every agent to
    any query (the v1 listing; a stand-in, since this gateway's code always pages)."""
    agents = [
        {
            "endpoint_id": f"agent://old-{i}",
            "capabilities": ["list.three"] if i % 2 else ["list.all"],
            "endpoint_url": "http://127.0.0.1:9/reach",
            "description": "",
            "status": "healthy" if i < 3 else "down",
            "last_seen_at": 1.0,
            "avg_latency_ms": None,
            "p95_latency_ms": None,
        }
        for i in range(6)
    ]

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"agents": agents})

    app = web.Application()
    app.router.add_get("/v1/agents", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_sdk_filters_itself_what_a_gateway_without_pages_answers(
    old_gateway: str,
) -> None:
    async with ReachClient(old_gateway) as client:
        found = await client.agents(intent="list.three", status="healthy")
        assert [a.endpoint_id for a in found] == ["agent://old-1"]
        assert len(await client.agents(page_size=2)) == 6


def test_the_cli_pages_through_with_the_gateway_filtering(gw: Proc) -> None:
    run = cli("agents", "--gateway", gw.url, "--json", "--intent", "list.three")
    assert (run.code, run.err) == (0, "")
    listing = run.json()
    assert list(listing) == ["agents"]
    wanted = sorted(name(i) for i in range(N) if i % 3 == 0)
    assert [a["endpoint_id"] for a in listing["agents"]] == wanted  # 667: a page and a bit
    run = cli("agents", "--gateway", gw.url, "--json", "--status", "suspect", "--status", "down")
    assert (run.code, run.json()) == (0, {"agents": []})
    run = cli("agents", "--gateway", gw.url, "--json")
    assert (run.code, len(run.json()["agents"])) == (0, N)  # two pages of 1,000


def test_the_openapi_document_describes_the_pages() -> None:
    document = openapi_document()
    operation = document["paths"]["/v1/agents"]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert set(params) == {"limit", "cursor", "intent", "status"}
    assert not any(p["required"] for p in params.values())  # a plain GET stays the v1 one
    assert (params["limit"]["schema"]["minimum"], params["limit"]["schema"]["maximum"]) == (
        1,
        1000,
    )
    assert "422" in operation["responses"]
    page = document["components"]["schemas"]["AgentsPage"]
    assert page["required"] == ["agents"]  # next_cursor and total only on a page
    assert {"agents", "next_cursor", "total"} == set(page["properties"])


BIG = 20_000
# at once: four v1 listings (each, built in one go, held the loop ~70 ms at 20,000 agents),
# and two pages that scan every record for their status
LISTINGS = ("", "", "", "", "?status=healthy,degraded&limit=1000", "?status=down&limit=1000")
# alone, the slowest /healthz is 24-50 ms; beside the suite's other worker it was once 172 ms
# (under a bound of 100 ms then). 200 ms still fails the listings built in one go, which held
# it ~230 ms alone, more beside other work
HEALTHZ_BOUND_S = 0.2


@pytest.fixture
def big() -> Iterator[Proc]:
    # no fallback matcher: its index, rebuilt after the registrations, would be measured too
    flags = ("--register-rate-limit", "0", "--heartbeat-interval", "60", "--matcher", "none")
    with gateway(*flags) as proc:
        asyncio.run(register_all(proc.url, list(range(BIG)), concurrency=128))
        yield proc


async def test_healthz_answers_while_big_listings_are_built(big: Proc) -> None:
    """While listings of 20,000 agents are built and sent (the v1 answer, 5 MB each, and
    filtered pages), every /healthz is answered within 200 ms: a listing gives the loop back a
    chunk at a time. (Built in one go, as before, the four v1 ones held it ~230 ms.)"""
    async with aiohttp.ClientSession() as session:

        async def listing(query: str) -> tuple[float, bytes]:
            async with session.get(f"{big.url}/v1/agents{query}") as answer:
                assert answer.status == 200
                body = await answer.read()
            return time.monotonic(), body

        started = time.monotonic()
        tasks = [asyncio.create_task(listing(query)) for query in LISTINGS]
        probes: list[tuple[float, float]] = []  # (sent at, seconds to the answer)
        for _ in range(2000):  # bounded: the listings end long before
            if all(t.done() for t in tasks):
                break
            sent = time.monotonic()
            async with session.get(f"{big.url}/healthz") as answer:
                assert answer.status == 200
                await answer.read()
            probes.append((sent, time.monotonic() - sent))
        done = await asyncio.gather(*tasks)
    last = max(end for end, _ in done)
    during = [wait for sent, wait in probes if started <= sent < last]
    worst = max(during, default=0.0)
    print(
        f"\n{len(LISTINGS)} listings of {BIG} agents (v1: {len(done[0][1]) / 1e6:.1f} MB) in"
        f" {(last - started) * 1000:.0f} ms; /healthz meanwhile: {len(during)} probes,"
        f" slowest {worst * 1000:.1f} ms (bound {HEALTHZ_BOUND_S * 1000:.0f} ms)"
    )
    assert len(during) >= 3, "the probes did not overlap the listings"
    assert worst < HEALTHZ_BOUND_S
    answers = [json.loads(body) for _, body in done]
    assert [len(a["agents"]) for a in answers] == [BIG] * 4 + [1000, 0]
    assert [a.get("total") for a in answers[4:]] == [BIG, 0]
