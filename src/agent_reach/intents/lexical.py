"""The lexical fallback matcher: the share of leading segments two tags have in common.

``weather.query`` vs ``weather.forecast`` shares 1 of 2 segments: 0.5. The denominator is the
longer tag's segment count, so a generic tag never fully matches a specific one. Its index
groups the known tags by first segment, so a lookup scores only the tags that can relate.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from agent_reach.intents.matcher import TagTexts

__all__ = ["SegmentPrefixIndex", "SegmentPrefixMatcher", "segment_score"]


def segment_score(wanted: list[str], parts: list[str]) -> float:
    """Shared leading segments over the longer tag's segment count."""
    shared = 0
    for a, b in zip(wanted, parts, strict=False):
        if a != b:
            break
        shared += 1
    return shared / max(len(wanted), len(parts))


class SegmentPrefixIndex:
    """The known tags by first segment, each with its segments split once."""

    __slots__ = ("_by_first",)

    def __init__(self, known: Iterable[str]) -> None:
        by_first: dict[str, list[tuple[str, list[str]]]] = {}
        for tag in known:
            parts = tag.split(".")
            by_first.setdefault(parts[0], []).append((tag, parts))
        self._by_first = by_first

    def scores(self, intent: str, text: str | None = None) -> dict[str, float]:
        """Scores of the tags sharing ``intent``'s first segment (``text`` is not used: this
        matcher compares tags, not words)."""
        wanted = intent.split(".")
        return {
            tag: segment_score(wanted, parts) for tag, parts in self._by_first.get(wanted[0], ())
        }


class SegmentPrefixMatcher:
    """Builds a :class:`SegmentPrefixIndex` (synchronously: it is cheap)."""

    def build(self, known: Collection[str], texts: TagTexts) -> SegmentPrefixIndex:
        return SegmentPrefixIndex(known)

    def scores(self, intent: str, known: Iterable[str]) -> dict[str, float]:
        """Score ``known`` against ``intent`` without an index (one-off comparisons)."""
        return SegmentPrefixIndex(known).scores(intent)
