"""From a matcher's raw features to a confidence that means what the contract says.

A matcher's raw score is not a confidence: with e5-small two unrelated sentences score a cosine
of ~0.8. Each matcher reports a few raw features of its best tag (the top score, the margin over
the runner-up; the semantic matcher also the tag's share of a softmax over all rows, see
:class:`Candidate`) and a :class:`Calibration` maps them to a confidence in ``[0, 1]``:

    confidence = sigmoid(bias + sum(weight_i * feature_i))

The weights are a logistic regression of "the best tag is the right one" on the features,
fitted on labelled queries (in-scope ones, and out-of-scope ones whose every match is wrong).
The bias is then moved so that, on that calibration data, the matches at or above
:data:`CONTRACT_THRESHOLD` (0.8) are right at least :data:`CONTRACT_PRECISION` of the time with
a margin (the contract: >= 97 % on held-out data). Below the contract point the scale keeps the
regression's shape, so a lower threshold accepts more and misdelivers more.

The same cosine means different things in different scripts: e5-small scores Chinese queries
lower than English ones, right or wrong. So a matcher's calibration (:class:`MatcherCalibration`)
holds a map for queries written mostly in CJK characters and one for every other query
(:func:`script_of`), each placed at the contract point by the data of its script; and a third,
the latin slope with its own intercept, for a requested tag read as words ("parity none"
against ``parity.echo``: two tags sharing a segment score a high cosine whatever they mean).

The margin is taken over a runner-up that does not depend on the registry's size (the best
other tag or the matcher's background, see :mod:`.semantic`), so a confidence means the same
with one registered tag as with thousands.

Invariants:
- Pure and dependency-free (no numpy, no I/O, no clock): the lexical matcher uses it on
  installs without the model.
- :meth:`Calibration.confidence` is in ``[0, 1]``, finite for any finite input, and monotone
  non-decreasing in every feature whose weight is >= 0 (the fitted weights are: a higher score,
  margin or share never lowers a confidence).
- The constants shipped here (:data:`SEMANTIC_E5_SMALL`, :data:`LEXICAL`) are the ones
  ``make eval`` (eval/intent_eval.py) printed; the evaluation reports their precision on data
  they were not fitted on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

__all__ = [
    "CONTRACT_PRECISION",
    "CONTRACT_THRESHOLD",
    "LEXICAL",
    "SEMANTIC_E5_SMALL",
    "Calibration",
    "Candidate",
    "MatcherCalibration",
    "contract_cut",
    "feature_values",
    "fit_logistic",
    "logit",
    "script_of",
    "sigmoid",
]

CONTRACT_THRESHOLD = 0.8
CONTRACT_PRECISION = 0.97


def sigmoid(z: float) -> float:
    """The logistic function, without overflow for any finite ``z``."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def logit(p: float) -> float:
    """The inverse of :func:`sigmoid`, for ``p`` in (0, 1)."""
    return math.log(p / (1.0 - p))


class Candidate(NamedTuple):
    """One tag's raw features for a query: its score, its margin over the best other tag
    (negative for every candidate but the best) and, for the semantic matcher, its ``share``:
    the softmax weight of its rows among all rows of the index and its background (1.0 when a
    matcher does not compute it)."""

    tag: str
    score: float
    margin: float
    share: float = 1.0


# a share's log-odds are taken with the share clipped to [SHARE_CLIP, 1 - SHARE_CLIP]
SHARE_CLIP = 1e-9


def feature_values(candidate: Candidate, features: Sequence[str]) -> tuple[float, ...]:
    """The values of ``features`` for a candidate: ``top`` (its score), ``margin``, ``share``
    (the log-odds of its share, clipped, see :data:`SHARE_CLIP`)."""
    out = []
    for name in features:
        if name == "top":
            out.append(candidate.score)
        elif name == "margin":
            out.append(candidate.margin)
        elif name == "share":
            p = min(max(candidate.share, SHARE_CLIP), 1.0 - SHARE_CLIP)
            out.append(math.log(p / (1.0 - p)))
        else:
            raise ValueError(f"unknown feature {name!r}")  # a programming error, not input
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted map from raw features (named by ``features``, in that order) to confidence."""

    features: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        if len(self.features) != len(self.weights):
            raise ValueError("a weight per feature")  # a programming error, not input

    def logit(self, values: Sequence[float]) -> float:
        """The log-odds of the features ``values`` (before the sigmoid)."""
        return self.bias + math.fsum(w * x for w, x in zip(self.weights, values, strict=True))

    def confidence(self, values: Sequence[float]) -> float:
        """The confidence of the features ``values``, in [0, 1]."""
        z = self.logit(values)
        if math.isnan(z):
            return 0.0
        return min(1.0, max(0.0, sigmoid(z)))

    def shifted(self, cut: float, at: float = CONTRACT_THRESHOLD) -> Calibration:
        """The same slope with the log-odds ``cut`` moved to confidence ``at``."""
        return replace(self, bias=self.bias + logit(at) - cut)


def fit_logistic(
    rows: Sequence[Sequence[float]],
    labels: Sequence[bool],
    *,
    l2: float = 1e-4,
    iterations: int = 100,
) -> tuple[tuple[float, ...], float]:
    """Weights and bias of an L2-regularized logistic regression (Newton's method), for a few
    features and up to some ten thousand rows. The features are standardized for the fit (so
    that ``l2`` means the same whatever their scale) and the result mapped back; the bias is
    not regularized."""
    if not rows or len(rows) != len(labels):
        raise ValueError("rows and labels: as many, and at least one")
    d = len(rows[0])
    n = float(len(rows))
    mean = [math.fsum(r[i] for r in rows) / n for i in range(d)]
    std = [math.sqrt(math.fsum((r[i] - mean[i]) ** 2 for r in rows) / n) or 1.0 for i in range(d)]
    xs = [[*((r[i] - mean[i]) / std[i] for i in range(d)), 1.0] for r in rows]
    beta = [0.0] * (d + 1)  # bias last
    for _ in range(iterations):
        grad = [0.0] * (d + 1)
        hess = [[0.0] * (d + 1) for _ in range(d + 1)]
        for x, y in zip(xs, labels, strict=True):
            p = sigmoid(math.fsum(b * v for b, v in zip(beta, x, strict=True)))
            r = p - (1.0 if y else 0.0)
            w = max(p * (1.0 - p), 1e-12)
            for i in range(d + 1):
                grad[i] += r * x[i] / n
                xi = w * x[i] / n
                hess_i = hess[i]
                for j in range(d + 1):
                    hess_i[j] += xi * x[j]
        for i in range(d):
            grad[i] += l2 * beta[i]
            hess[i][i] += l2
        step = _solve(hess, grad)
        beta = [b - s for b, s in zip(beta, step, strict=True)]
        if max(abs(s) for s in step) < 1e-10:
            break
    weights = tuple(beta[i] / std[i] for i in range(d))
    bias = beta[d] - math.fsum(w * m for w, m in zip(weights, mean, strict=True))
    return weights, bias


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (a is small and SPD here)."""
    n = len(b)
    m = [[*row, rhs] for row, rhs in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-300:
            raise ValueError("singular system")
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - math.fsum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def contract_cut(
    scored: Mapping[str, Sequence[tuple[float, bool]]],
    target: float,
    *,
    min_accepted: int = 1,
) -> float:
    """The lowest log-odds cut such that, in every group of ``scored`` (``group -> [(log-odds,
    right)]``), the accepted matches (log-odds >= cut) are right at least ``target`` of the time
    at that cut and at every higher one where at least ``min_accepted`` are accepted (so that a
    stricter threshold is never less precise than the contract's on this data).

    A group that never reaches ``target`` pushes the cut above its best score (it then accepts
    nothing). The cut of several groups is the highest of theirs: each data set must hold the
    precision on its own. Empty groups do not count; with none at all the cut is ``+inf``.
    """
    cut = -math.inf
    for items in scored.values():
        if not items:
            continue
        ordered = sorted(items, key=lambda item: -item[0])
        best = ordered[0][0] + 1e-6 * max(1.0, abs(ordered[0][0]))  # above the best
        right = 0
        for n, (z, ok) in enumerate(ordered, start=1):
            right += ok
            if n < len(ordered) and ordered[n][0] == z:
                continue  # a cut falls between distinct scores only
            if right / n >= target:
                best = z
            elif n >= min_accepted:
                break
        cut = max(cut, best)
    return math.inf if cut == -math.inf else cut


def script_of(text: str) -> str:
    """``"cjk"`` when most letters of ``text`` are CJK characters (Han, kana, hangul), else
    ``"latin"`` (every other script, and text without letters)."""
    cjk = other = 0
    for ch in text:
        if _is_cjk(ch):
            cjk += 1
        elif ch.isalpha():
            other += 1
    # a CJK character carries about a word: weigh it as three letters
    return "cjk" if cjk and 3 * cjk >= other else "latin"


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x4E00 <= o <= 0x9FFF
        or 0x3400 <= o <= 0x4DBF
        or 0x3040 <= o <= 0x30FF
        or 0xAC00 <= o <= 0xD7AF
        or 0xF900 <= o <= 0xFAFF
    )


@dataclass(frozen=True, slots=True)
class MatcherCalibration:
    """A matcher's calibration: the map for queries in CJK scripts, the one for the rest, and
    (``tag``) the one for a requested tag read as words (``parity.none`` -> "parity none").

    ``name`` says what it was fitted for (a matcher and, for the semantic one, the embedding
    model: another model needs its own fit). ``floor`` is a matcher-side constant: the score a
    missing or weaker runner-up counts as when the margin is taken. ``tag`` is ``None`` when
    tags read as words are calibrated like any other query.
    """

    name: str
    latin: Calibration
    cjk: Calibration
    floor: float = 0.0
    tag: Calibration | None = None

    def for_query(self, query: str, *, is_tag: bool = False) -> Calibration:
        """The map for ``query``: a tag read as words, else by its script."""
        if is_tag and self.tag is not None:
            return self.tag
        return self.cjk if script_of(query) == "cjk" else self.latin

    def confidence(self, candidate: Candidate, query: str, *, is_tag: bool = False) -> float:
        """The confidence of a candidate's features (those its map names, see
        :func:`feature_values`) for ``query`` (``is_tag``: the query is a requested tag read as
        words, not the caller's words)."""
        cal = self.for_query(query, is_tag=is_tag)
        return cal.confidence(feature_values(candidate, cal.features))


# Fitted by `make eval` (eval/intent_eval.py) with the semantic matcher's shipped background
# (background.txt, shadow 0.9) and share temperature (0.02); see docs/matching.md for the data
# and the precision they reach on held-out queries, big registries and small ones.
SEMANTIC_E5_SMALL = MatcherCalibration(
    name="semantic:multilingual-e5-small-q4",
    latin=Calibration(("top", "margin", "share"), (16.5083, 14.9144, 0.6813), -15.3241),
    cjk=Calibration(("top", "margin", "share"), (33.1669, 46.2376, 1.3634), -30.6729),
    tag=Calibration(("top", "margin", "share"), (16.5083, 14.9144, 0.6813), -18.8184),
)
LEXICAL = MatcherCalibration(
    name="lexical",
    latin=Calibration(("top", "margin"), (2.2410, 8.8335), -5.9967),
    cjk=Calibration(("top", "margin"), (3.3742, 16.9608), -6.9380),
    tag=Calibration(("top", "margin"), (2.2410, 8.8335), -7.1983),
)
