"""Near misses: declared intent tags that nearly match one callers ask. Pure.

A near miss is, best first: a few edits apart (a typo), one tag a dotted prefix of the other, the
same segments in another order; or, only when nothing closer is, the same last segment.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["NEAR_MISS_LIMIT", "NEAR_MISS_MAX_EDITS", "near_misses"]

NEAR_MISS_MAX_EDITS = 2
"""A declared tag at most this many edits (insert, delete, change, swap) from an asked one is a
near miss, provided the edits are under half the shorter tag's length."""

NEAR_MISS_LIMIT = 3
"""Near misses listed per asked intent, best first."""


def _edits(a: str, b: str) -> int:
    """Optimal-string-alignment distance: inserts, deletes, changes and adjacent swaps."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def near_misses(asked: str, declared: Iterable[str]) -> list[tuple[str, str]]:
    """Declared tags that nearly match ``asked``, best first: ``(tag, why)``, at most
    :data:`NEAR_MISS_LIMIT`. "Same last segment" is offered only when nothing closer is."""
    want = asked.split(".")
    strong: list[tuple[int, int, str, str]] = []
    weak: list[tuple[int, int, str, str]] = []
    for tag in declared:
        if tag == asked:
            continue
        parts = tag.split(".")
        d = _edits(asked, tag)
        if d <= NEAR_MISS_MAX_EDITS and 2 * d < min(len(asked), len(tag)):
            strong.append((0, d, tag, f"{d} edit{'s' if d > 1 else ''} apart"))
        elif parts[: len(want)] == want or want[: len(parts)] == parts:
            strong.append(
                (1, abs(len(parts) - len(want)), tag, "one is a dotted prefix of the other")
            )
        elif sorted(parts) == sorted(want):
            strong.append((2, 0, tag, "the same segments in another order"))
        elif len(parts) > 1 and len(want) > 1 and parts[-1] == want[-1]:
            weak.append((3, d, tag, f"the same last segment {want[-1]!r}"))
    return [(tag, why) for _, _, tag, why in sorted(strong or weak)[:NEAR_MISS_LIMIT]]
