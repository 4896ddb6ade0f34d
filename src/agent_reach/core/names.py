"""Names and intents: the grammar of endpoint ids and intent tags, and fallback matching.

Invariants:
- An endpoint id is ``agent://NAME`` with NAME matching ``[a-z0-9][a-z0-9._-]{0,127}``.
- An intent tag is dot-separated segments, each ``[a-z][a-z0-9_-]*``, at most 128 characters.
- Exact matching is on the whole tag, case-sensitive. A :class:`FallbackMatcher` is consulted
  only when no endpoint declares the tag exactly, and its scores are in ``[0, 1]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

__all__ = [
    "ENDPOINT_ID_PATTERN",
    "INTENT_PATTERN",
    "FallbackMatcher",
    "SegmentPrefixMatcher",
    "is_endpoint_id",
    "is_intent",
]

# \Z, not $: "$" also matches before a trailing newline ("agent://x\n" must not pass)
ENDPOINT_ID_PATTERN = r"^agent://[a-z0-9][a-z0-9._-]{0,127}\Z"
INTENT_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*\Z"
INTENT_MAX_LEN = 128

_ENDPOINT_ID = re.compile(ENDPOINT_ID_PATTERN)
_INTENT = re.compile(INTENT_PATTERN)


def is_endpoint_id(value: str) -> bool:
    """True when ``value`` is a well-formed ``agent://NAME`` id."""
    return _ENDPOINT_ID.match(value) is not None


def is_intent(value: str) -> bool:
    """True when ``value`` is a well-formed intent tag."""
    return len(value) <= INTENT_MAX_LEN and _INTENT.match(value) is not None


class FallbackMatcher(Protocol):
    """Scores how well a registered tag serves a requested one, for non-exact matching."""

    def scores(self, intent: str, known: Iterable[str]) -> dict[str, float]:
        """Confidence in ``[0, 1]`` for each tag of ``known`` that relates to ``intent``.

        Tags with no relation may be left out. Must be pure and deterministic.
        """
        ...


class SegmentPrefixMatcher:
    """Default matcher: the share of leading segments two tags have in common.

    ``weather.query`` vs ``weather.forecast`` shares 1 of 2 segments: 0.5. The denominator is the
    longer tag's segment count, so a generic tag never fully matches a specific one.
    """

    def scores(self, intent: str, known: Iterable[str]) -> dict[str, float]:
        wanted = intent.split(".")
        out: dict[str, float] = {}
        for tag in known:
            parts = tag.split(".")
            if parts[0] != wanted[0]:
                continue
            shared = 0
            for a, b in zip(wanted, parts, strict=False):
                if a != b:
                    break
                shared += 1
            out[tag] = shared / max(len(wanted), len(parts))
        return out
