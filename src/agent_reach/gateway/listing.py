"""``GET /v1/agents`` in bounded steps: the v1 listing of every agent, or one page of them.

At 50,000 endpoints the v1 listing is 14 MB of JSON; built and encoded in one go it held the
event loop for 200 ms (``/healthz`` waited as long). So a listing is an :class:`AgentListing`:
an async iterator of pieces of one JSON document, each piece the records of one chunk
described and encoded, with the event loop given back between chunks; the edge sends each
piece as it comes. A worker thread would not help: building the dicts and msgspec's encoder
hold the GIL throughout, so the loop would wait as long (measured: a 17 MB encode in
``asyncio.to_thread`` held it 18 ms). A page (``limit``, ``cursor``, ``intent``, ``status``:
:class:`~agent_reach.wire.bodies.AgentsQuery`) is found the same way: the matching records
are scanned a chunk at a time, keeping the ``limit`` + 1 smallest ids after the cursor.

Invariants:
- A listing reads the view once, when it is made (the records of that moment, or those of
  the intent's ids chunk by chunk), and derives every status at the one ``now`` of that moment.
- The loop is held for one chunk at a time: :data:`DESCRIBE_CHUNK` records described and
  encoded, or :data:`SCAN_CHUNK` records matched (about a millisecond each; at 50,000
  endpoints no listing or page held the loop more than 2 ms at a time, on a laptop).
- Pages are in endpoint_id order (ASCII ids: code-point order). A cursor is the position after
  the last id of its page (keyset), so a walk through the pages lists an agent registered all
  along exactly once, whatever registers or leaves meanwhile; one that registers or leaves
  during the walk is listed at most once.
- ``total`` counts the agents that match the filters (not the cursor) when the page is built.
- The v1 listing (no page asked for) is every record, in the view's (registration) order.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from agent_reach.core.model import ROUTABLE, EndpointRecord
from agent_reach.wire.answers import IntentsAnswer
from agent_reach.wire.bodies import AgentsQuery, encode, next_cursor

if TYPE_CHECKING:
    from agent_reach.gateway.cards import Card
    from agent_reach.gateway.router import Router

__all__ = [
    "DESCRIBE_CHUNK",
    "JUDGE_CHUNK",
    "SCAN_CHUNK",
    "TAG_CHUNK",
    "AgentListing",
    "Routable",
    "describe",
    "intents_pieces",
    "sorted_in_turns",
]

DESCRIBE_CHUNK = 250  # records described and encoded per step (~3.5 µs each)
SCAN_CHUNK = 1000  # records matched against a page's filters per step (~0.6 µs each)
# tags per step of the listings of every tag (/v1/intents, the A2A card's skills): sorted or
# merged, described, encoded
TAG_CHUNK = 1000
# endpoints looked at per step by those listings (a tag's endpoints are not a bounded number:
# one tag of 50,000 replicas, or 1,000 tags of 10, is ~30-100 ms of derivations in one go)
JUDGE_CHUNK = 1000
_ID = attrgetter("endpoint_id")
_OPENING = b'{"agents":['


async def sorted_in_turns(items: Iterable[str]) -> list[str]:
    """``sorted(items)``, :data:`TAG_CHUNK` items sorted or merged per turn of the loop. A
    sort of 50,000 tags in hash order held the loop ~30 ms in one go (a set's order: the
    reachable tags); sorted runs merged lazily hold it ~1 ms at a time."""
    held = list(items)
    if len(held) <= TAG_CHUNK:
        return sorted(held)
    runs = []
    for start in range(0, len(held), TAG_CHUNK):
        runs.append(sorted(held[start : start + TAG_CHUNK]))
        await asyncio.sleep(0)
    out: list[str] = []
    merged = heapq.merge(*runs)
    while piece := list(islice(merged, TAG_CHUNK)):
        out += piece
        await asyncio.sleep(0)
    return out


class Routable:
    """Which endpoints of a tag can take a request now (healthy or degraded), for a listing of
    many tags: each endpoint judged once, at one ``now``, and the event loop given a turn
    every :data:`JUDGE_CHUNK` endpoints looked at, inside a tag as between tags (the ids of a
    tag larger than that are copied first: the registry may change meanwhile)."""

    __slots__ = ("_known", "_left", "_now", "_router")

    def __init__(self, router: Router) -> None:
        self._router = router
        self._now = router.now()
        self._known: dict[str, bool] = {}  # endpoint id -> healthy or degraded now
        self._left = JUDGE_CHUNK  # endpoints to look at before the next turn of the loop

    async def count(self, tag: str, *, any_one: bool = False) -> tuple[int, int]:
        """``tag``'s declaring endpoints and how many of them are routable now (with
        ``any_one``: 1 at the first routable one found, the rest not looked at)."""
        ids = self._router.registry.by_intent(tag)
        if len(ids) <= self._left:  # within this turn: nothing can change meanwhile
            self._left -= len(ids) + 1
            n = self._judge(ids, any_one)
            if self._left <= 0:
                await self._turn()
            return len(ids), n
        held = list(ids)
        # the rest of this turn's chunk first, then whole chunks, a turn after each
        start, end = 0, max(0, self._left)
        n = 0
        while start < len(held):
            n += self._judge(held[start:end], any_one)
            await self._turn()
            if any_one and n:
                break
            start, end = end, end + JUDGE_CHUNK
        return len(held), n

    def _judge(self, ids: Iterable[str], any_one: bool) -> int:
        known, registry, router, now = self._known, self._router.registry, self._router, self._now
        n = 0
        for endpoint_id in ids:
            ok = known.get(endpoint_id)
            if ok is None:
                record = registry.get(endpoint_id)
                ok = known[endpoint_id] = (
                    record is not None and router.health(record, now).status in ROUTABLE
                )
            if ok:
                n += 1
                if any_one:
                    break
        return n

    async def _turn(self) -> None:
        self._left = JUDGE_CHUNK
        await asyncio.sleep(0)  # the loop serves others between chunks


def describe(
    router: Router, cards: Mapping[str, Card], record: EndpointRecord, now: float
) -> dict[str, Any]:
    """The contract's AGENT object of ``record``, with ``a2a`` for an agent registered by its
    Agent Card (what was taken from the card, what was not)."""
    agent = router.describe(record, now)
    card = cards.get(record.endpoint_id) if cards else None
    if card is not None:
        agent["a2a"] = card.shown()
    return agent


class AgentListing:
    """One answer of ``GET /v1/agents``, made when asked for (the view is read then) and built
    as it is iterated (``async for piece in listing``): bytes that, joined, are the JSON
    answer. ``query`` None: the v1 ``{"agents": [...]}``; else the page it asks for,
    ``{"agents": [...], "next_cursor", "total"}``. Iterate it once."""

    def __init__(
        self, router: Router, cards: Mapping[str, Card], query: AgentsQuery | None
    ) -> None:
        self._router = router
        self._cards = cards
        self._query = query
        self._now = router.now()
        registry = router.registry
        self._intent = None if query is None else query.intent
        # a page of one intent: its ids (looked up a chunk at a time); else every record
        self._ids: list[str] = []
        self._records: list[EndpointRecord] = []
        if self._intent is not None:
            self._ids = list(registry.by_intent(self._intent))
        else:
            self._records = list(registry.records())

    def __aiter__(self) -> AsyncGenerator[bytes, None]:
        if self._query is None:
            return self._every()
        return self._page(self._query)

    async def _every(self) -> AsyncGenerator[bytes, None]:
        """The v1 listing: every record, a chunk a piece."""
        records = self._records
        for start in range(0, len(records), DESCRIBE_CHUNK):
            yield self._piece(records, start)
            await asyncio.sleep(0)  # the loop serves others between chunks
        yield (b"" if records else _OPENING) + b"]}"

    async def _page(self, query: AgentsQuery) -> AsyncGenerator[bytes, None]:
        """One page: the matching records scanned a chunk at a time, then described."""
        after, statuses, keep = query.after, query.statuses, query.limit + 1
        router, now = self._router, self._now
        total = 0
        best: list[EndpointRecord] = []  # the (at most) ``keep`` smallest ids after ``after``
        for chunk in self._chunks():
            if statuses is not None:
                chunk = [r for r in chunk if router.health(r, now).status.value in statuses]
            total += len(chunk)
            bound = _ID(best[-1]) if len(best) == keep else None
            fresh = [
                r
                for r in chunk
                if (after is None or r.endpoint_id > after)
                and (bound is None or r.endpoint_id < bound)
            ]
            if fresh:
                best = sorted([*best, *fresh], key=_ID)[:keep]
            await asyncio.sleep(0)
        page = best[: query.limit]
        cursor = next_cursor(page[-1].endpoint_id) if len(best) == keep else None
        for start in range(0, len(page), DESCRIBE_CHUNK):
            yield self._piece(page, start)
            await asyncio.sleep(0)
        tail = b'],"next_cursor":' + encode(cursor) + b',"total":' + str(total).encode() + b"}"
        yield (b"" if page else _OPENING) + tail

    def _chunks(self) -> Iterator[list[EndpointRecord]]:
        """The candidate records (every one, or the intent's), :data:`SCAN_CHUNK` at a time."""
        intent = self._intent
        if intent is None:
            records = self._records
            for start in range(0, len(records), SCAN_CHUNK):
                yield records[start : start + SCAN_CHUNK]
            return
        ids, get = self._ids, self._router.registry.get
        for start in range(0, len(ids), SCAN_CHUNK):
            found = (get(e) for e in ids[start : start + SCAN_CHUNK])
            # a record replaced meanwhile may no longer declare the intent
            yield [r for r in found if r is not None and intent in r.capabilities]

    def _piece(self, records: Sequence[EndpointRecord], start: int) -> bytes:
        """The AGENT objects of the chunk of ``records`` from ``start``, encoded: after the
        answer's opening (first chunk) or a comma (the others)."""
        router, cards, now = self._router, self._cards, self._now
        chunk = records[start : start + DESCRIBE_CHUNK]
        encoded = encode([describe(router, cards, r, now) for r in chunk])
        return (_OPENING if start == 0 else b",") + encoded[1:-1]  # without its brackets


async def intents_pieces(answer: IntentsAnswer) -> AsyncGenerator[bytes, None]:
    """``encode(answer)`` in pieces, :data:`TAG_CHUNK` intents each, the loop turning between."""
    intents = answer.intents
    yield b'{"mode":' + encode(answer.mode) + b',"intents":['
    for start in range(0, len(intents), TAG_CHUNK):
        piece = encode(intents[start : start + TAG_CHUNK])[1:-1]
        yield piece if start == 0 else b"," + piece
        await asyncio.sleep(0)
    yield b"]}"
