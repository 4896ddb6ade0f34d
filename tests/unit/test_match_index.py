"""The fallback index: built off the request path when the known tags change, never replaced
by an older build, and read at route time without building."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from agent_reach.core.names import is_intent
from agent_reach.intents import MatchIndexHolder, SegmentPrefixMatcher
from agent_reach.intents.lexical import SegmentPrefixIndex
from agent_reach.intents.matcher import EMPTY_INDEX, TagTexts


class Counting(SegmentPrefixMatcher):
    """The lexical matcher, counting its builds."""

    def __init__(self) -> None:
        self.builds = 0

    def build(self, known: Collection[str], texts: TagTexts) -> SegmentPrefixIndex:
        self.builds += 1
        return super().build(known, texts)


class Slow:
    """An asynchronous matcher whose builds finish when the test says, in any order."""

    def __init__(self) -> None:
        self.gates: list[asyncio.Event] = []

    async def _build(self, known: tuple[str, ...], gate: asyncio.Event) -> SegmentPrefixIndex:
        await gate.wait()
        return SegmentPrefixIndex(known)

    def build(self, known: Collection[str], texts: TagTexts) -> object:
        gate = asyncio.Event()
        self.gates.append(gate)
        return self._build(tuple(known), gate)


async def test_changes_in_a_burst_share_one_build_made_off_the_callers_path() -> None:
    tags = {"weather.query.daily"}
    matcher = Counting()
    holder = MatchIndexHolder(matcher, lambda: tags, lambda tag: [])
    assert holder.index is EMPTY_INDEX  # nothing before the first build: exact matches only
    for n in range(50):
        tags.add(f"weather.query.n{n}")
        holder.changed()
    assert matcher.builds == 0  # not inside the change: soon after
    await asyncio.sleep(0)
    assert matcher.builds == 1
    assert set(holder.index.scores("weather.query")) == tags


async def test_an_older_build_finishing_late_never_replaces_a_newer_index() -> None:
    tags = ["alpha.one"]
    matcher = Slow()
    swaps: list[int] = []
    holder = MatchIndexHolder(matcher, lambda: list(tags), lambda tag: [], lambda: swaps.append(1))
    holder.changed()
    await asyncio.sleep(0)  # first build starts (tags: alpha.one)
    tags.append("alpha.two")
    holder.changed()
    await asyncio.sleep(0)  # second build starts (tags: alpha.one, alpha.two)
    assert len(matcher.gates) == 2
    matcher.gates[1].set()
    await holder.wait()
    assert set(holder.index.scores("alpha.x")) == {"alpha.one", "alpha.two"}
    matcher.gates[0].set()  # the first build ends last
    await asyncio.sleep(0.01)
    assert set(holder.index.scores("alpha.x")) == {"alpha.one", "alpha.two"}
    assert swaps == [1]


async def test_a_failing_build_keeps_the_index_in_force() -> None:
    tags = ["beta.one"]
    fail = False

    class Flaky(SegmentPrefixMatcher):
        async def _later(self, known: tuple[str, ...]) -> SegmentPrefixIndex:
            if fail:
                raise RuntimeError("model went away")
            return SegmentPrefixIndex(known)

        def build(self, known: Collection[str], texts: TagTexts) -> object:  # type: ignore[override]
            return self._later(tuple(known))

    holder = MatchIndexHolder(Flaky(), lambda: list(tags), lambda tag: [])
    holder.changed()
    await holder.wait()
    assert set(holder.index.scores("beta.x")) == {"beta.one"}
    fail = True
    tags.append("beta.two")
    holder.changed()
    await asyncio.sleep(0.01)
    assert set(holder.index.scores("beta.x")) == {"beta.one"}


def test_the_lexical_index_scores_only_tags_sharing_the_first_segment() -> None:
    known = ["weather.forecast", "weather.query.daily", "note.create", "weatherx.query"]
    index = SegmentPrefixMatcher().build(known, lambda tag: [])
    assert index.scores("weather.query") == {"weather.forecast": 0.5, "weather.query.daily": 2 / 3}
    assert index.scores("other.thing") == {}
    assert all(is_intent(tag) for tag in index.scores("weather.query"))
