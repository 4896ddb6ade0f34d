"""The lexical fallback matcher: the words a query shares with each tag's words and texts.

Text becomes tokens: NFKC-normalized, case-folded word tokens (an English plural ``s`` cut),
CJK runs as character bigrams (a lone CJK character as itself), a short list of function words
left out. Each known tag has rows: its words (``weather.query`` -> "weather query", so tags
match by their segments) and each of its texts (the dictionary's description and examples, the
agents' descriptions). A row's score is the IDF-weighted cosine of its token set with the
query's; a tag's score is its best row's. The confidence is
:class:`~agent_reach.intents.calibration.MatcherCalibration` of (score, margin over the best
other tag), with its own intercept for a requested tag read as words.

Unlike the semantic matcher it needs no background for small registries: a query's words that
no tag has weigh as the rarest tokens in its norm, so a query sharing one word with the only
registered tag scores low (``parity.none`` against ``parity.echo``: 0.5), and the evaluation's
small registries hold the contract (docs/matching.md). :func:`background_texts` reads the
shipped background for the semantic matcher (it lives here: pure Python, no numpy).

Invariants:
- Pure Python, no numpy: the matcher of installs without the model. A build is cheap and
  synchronous.
- An inverted index (token -> rows) means a lookup scores only the rows sharing a token with
  the query: its cost does not grow with tags it shares nothing with. Tokens in more than
  ``max(100, tags / 20)`` tags carry almost no weight and are not scored (their weight still
  counts in the query's norm), so a common word cannot make a lookup touch every tag.
- The index is immutable once built; :meth:`LexicalIndex.match` is thread-safe.
"""

from __future__ import annotations

import heapq
import importlib.resources
import math
import re
import unicodedata
from collections.abc import Collection, Iterable, Sequence
from functools import cache

from agent_reach.intents.calibration import LEXICAL, Candidate, MatcherCalibration
from agent_reach.intents.matcher import TagTexts, distinct

__all__ = [
    "LexicalIndex",
    "LexicalMatcher",
    "background_texts",
    "rank",
    "tag_words",
    "tokens",
]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN = re.compile(rf"([{_CJK}]+)|[^\W_{_CJK}]+")
# function words that carry no intent (English, Chinese bigrams)
_STOP_WORDS = """
a an the is are am be was were to of in on at for by with from and or it its this that
i me my we our you your he she they them can could would will do does did please
what whats how when where which who why there here some any
帮我 我想 我要 一下 请问 请帮 可以 能不 不能 的是 我的 你的 是什 什么 怎么 吗
"""
STOP = frozenset(_STOP_WORDS.split())


_SEPARATORS = re.compile(r"[._\-]+")


def tag_words(tag: str) -> str:
    """A tag read as words: ``weather.query`` -> "weather query", ``card_arrival`` ->
    "card arrival". (The pattern compiled once: a build reads every known tag so, 50,000 at
    a time in a thread beside the loop.)"""
    return " ".join(_SEPARATORS.split(tag)).strip()


@cache
def background_texts() -> tuple[str, ...]:
    """The shipped background (``background.txt`` next to this module): short generic requests
    in many domains and languages, read once per process. A matcher's best tag must beat the
    nearest of them to be confident, whatever the registry's size (docs/matching.md)."""
    raw = (
        importlib.resources.files("agent_reach.intents")
        .joinpath("background.txt")
        .read_text("utf-8")
    )
    lines = (" ".join(line.split("#", 1)[0].split()) for line in raw.splitlines())
    return tuple(dict.fromkeys(line for line in lines if line))


def _word(w: str) -> str:
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def tokens(text: str) -> set[str]:
    """The distinct tokens of ``text`` (see the module docstring), function words left out."""
    out: set[str] = set()
    for m in _TOKEN.finditer(unicodedata.normalize("NFKC", text).casefold()):
        run = m.group(1)
        if run is None:
            out.add(_word(m.group(0)))
        elif len(run) == 1:
            out.add(run)
        else:
            out.update(run[i : i + 2] for i in range(len(run) - 1))
    return out - STOP


def rank(scores: Iterable[tuple[str, float]], k: int, floor: float = 0.0) -> list[Candidate]:
    """The best ``k`` of ``(tag, score)`` as candidates, best first (ties by tag), each with
    its margin over the best other tag (a missing or weaker runner-up counts as ``floor``)."""
    best = heapq.nsmallest(max(k, 2), scores, key=lambda ts: (-ts[1], ts[0]))
    if not best or k <= 0:
        return []
    top = best[0][1]
    runner = max(best[1][1] if len(best) > 1 else floor, floor)
    return [
        Candidate(tag, score, score - (runner if i == 0 else top))
        for i, (tag, score) in enumerate(best[:k])
    ]


class LexicalIndex:
    """Rows of token sets, an inverted index over them, and the tokens' weights."""

    __slots__ = ("_idf", "_norms", "_owner", "_postings", "_unknown", "calibration", "tags")

    def __init__(
        self,
        tags: Sequence[str],
        rows: Sequence[tuple[int, set[str]]],
        calibration: MatcherCalibration = LEXICAL,
    ) -> None:
        self.tags = tuple(tags)
        self.calibration = calibration
        n = len(self.tags)
        df: dict[str, set[int]] = {}
        for owner, toks in rows:
            for t in toks:
                df.setdefault(t, set()).add(owner)
        self._idf = {t: math.log(1.0 + n / len(owners)) for t, owners in df.items()}
        self._unknown = math.log(1.0 + 2.0 * n)  # a token no tag has: as rare as can be
        common = max(100, n // 20)
        postings: dict[str, list[int]] = {}
        norms: list[float] = []
        owner_of: list[int] = []
        for row, (owner, toks) in enumerate(rows):
            owner_of.append(owner)
            norms.append(math.sqrt(math.fsum(self._idf[t] ** 2 for t in toks)) or 1.0)
            for t in toks:
                if len(df[t]) <= common:
                    postings.setdefault(t, []).append(row)
        self._postings = postings
        self._norms = norms
        self._owner = owner_of

    def __len__(self) -> int:
        return len(self.tags)

    def scores(self, query: str) -> dict[str, float]:
        """The score of every tag sharing a scored token with ``query`` (the others: 0)."""
        toks = tokens(query)
        if not toks:
            return {}
        weights = {t: self._idf.get(t, self._unknown) for t in toks}
        qnorm = math.sqrt(math.fsum(w * w for w in weights.values()))
        acc: dict[int, float] = {}
        for t, w in weights.items():
            for row in self._postings.get(t, ()):
                acc[row] = acc.get(row, 0.0) + w * w
        best: dict[int, float] = {}
        for row, dot in acc.items():
            cos = dot / (qnorm * self._norms[row])
            owner = self._owner[row]
            if cos > best.get(owner, 0.0):
                best[owner] = cos
        return {self.tags[owner]: score for owner, score in best.items()}

    def candidates(self, query: str, k: int = 3) -> list[Candidate]:
        """The best ``k`` tags for the words ``query`` with their raw features, best first."""
        return rank(self.scores(query).items(), k, self.calibration.floor)

    def match(self, intent: str | None, text: str | None, k: int = 3) -> list[tuple[str, float]]:
        """The best ``k`` known tags sharing a word with ``text`` (or with ``intent`` read as
        words), best first, each with its calibrated confidence."""
        query = text if text is not None else tag_words(intent or "")
        found = self.candidates(query, k)
        is_tag = text is None
        return [(c.tag, self.calibration.confidence(c, query, is_tag=is_tag)) for c in found]


class LexicalMatcher:
    """Builds :class:`LexicalIndex` es (synchronously: tokenizing is cheap)."""

    name = "lexical"

    def __init__(self, calibration: MatcherCalibration = LEXICAL) -> None:
        self.calibration = calibration

    def build(self, known: Collection[str], texts: TagTexts) -> LexicalIndex:
        """The index of ``known``: each tag's words and ``texts(tag)``, tokenized."""
        tags: list[str] = []
        rows: list[tuple[int, set[str]]] = []
        for tag in distinct(known):
            own = [tokens(tag_words(tag)), *(tokens(t) for t in texts(tag))]
            kept = [t for t in own if t]
            if not kept:
                continue
            owner = len(tags)
            tags.append(tag)
            rows.extend((owner, t) for t in kept)
        return LexicalIndex(tags, rows, self.calibration)
