"""Cells of a big semantic index: its tags grouped by their centroids' nearest centre, so that a
lookup reads the few cells nearest the query rather than every row (an inverted-file index).

A lookup over every row costs ``rows x dim`` multiply-adds: 0.14 ms of a core at 1,000 tags,
20 ms at 50,000 and 80 ms at 200,000 (docs/matching.md), growing with the registry. With
cells, it reads the centres, the :data:`PROBE_CELLS` nearest cells (about ``PROBE_CELLS x
CELL_TAGS`` tags, however many there are in all) and a fixed sample of rows: its cost stays
flat as the registry grows, but for the product with the centres (one per :data:`CELL_TAGS`
tags, 1/128th of the rows'), as long as the cells spread the tags (random vectors spread
evenly; real embeddings less so: a cell past :data:`LOPSIDED` times its share has the centres
trained again).

Invariants:
- Only indexes of more than :data:`PARTITION_MIN_TAGS` tags have cells; a smaller one is read
  whole, so every figure of the evaluation (registries of at most a few hundred tags) is that
  of the exact lookup, and so is the calibration.
- A cell holds a contiguous run of the index's tags (the index orders its tags by cell), so
  a probed cell is one slice of the rows matrix and of the centroids, never a gather.
- The centres are spherical k-means centres of the tags' centroids less their mean (the
  direction all sentence embeddings share), trained on at most :data:`TRAIN_SAMPLE` of them
  per centre with a fixed seed over the tags in sorted order (the same tags train the same
  centres in every process), and kept by the matcher across rebuilds until the number of tags
  has doubled or halved since, or a cell holds :data:`LOPSIDED` times its share (the
  registry moved): a rebuild under churn assigns cells (one product) but does not train.
- A lookup reads non-empty cells only (an index keeps no empty cell).
- What the probed cells miss of a candidate's share (the softmax over every row) is
  estimated from a fixed uniform sample of :data:`SAMPLE_ROWS` rows: the unprobed rows' weight
  as the sample's unprobed rows' weight, scaled up to their number (a ratio estimate: its
  error falls with the sample's size, not with the registry's; tests/unit/test_semantic_cells.py
  holds it within 1 % of the whole sum on data shaped like e5's).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "CELL_TAGS",
    "PARTITION_MIN_TAGS",
    "PROBE_CELLS",
    "SAMPLE_ROWS",
    "Cells",
    "Centres",
    "assign",
    "cell_count",
    "compact",
    "lopsided",
    "needs_training",
    "order_by_cell",
    "sample_rows",
    "train_centres",
    "unit_rows",
]

Vectors = npt.NDArray[np.float32]

PARTITION_MIN_TAGS = 5_000  # up to this many tags a lookup reads every row (<= ~2 ms of a core)
CELL_TAGS = 128  # tags per cell, on average
PROBE_CELLS = 16  # cells a lookup reads: ~2,000 tags' rows
SAMPLE_ROWS = 4096  # rows whose weights stand for the unprobed rows' in a share
TRAIN_SAMPLE = 64  # centroids per centre, at most, that k-means trains on
TRAIN_ROUNDS = 8  # k-means iterations
CHUNK = 8192  # centroids assigned per product (bounds the temporary matrices)
LOPSIDED = 8  # a cell holding this many times CELL_TAGS tags: the centres are trained again


class Centres(NamedTuple):
    """k-means centres (unit rows) of centroids from which ``mean`` was taken first: sentence
    embeddings share a large common direction (e5: unrelated texts at a cosine of ~0.75), and
    clustered as they are, most tags fall into the few cells along it, the very cells every
    query reads."""

    mean: npt.NDArray[np.float32]
    vectors: Vectors
    tags: int  # how many tags they were trained for

    def near(self, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Each centre's similarity to ``vector`` (a query, or a tag's centroid)."""
        return np.asarray(self.vectors @ (vector - self.mean), dtype=np.float32)


class Cells(NamedTuple):
    """The cells of one index: ``centres``, ``starts`` (cell ``c`` holds the index's tags
    ``starts[c]`` to ``starts[c + 1]``, the last to the end), ``sample`` (rows of the index, a
    fixed uniform sample) and ``sample_cells`` (each sample row's cell)."""

    centres: Centres
    starts: npt.NDArray[np.intp]
    sample: Vectors
    sample_cells: npt.NDArray[np.intp]


def cell_count(tags: int) -> int:
    """How many cells ``tags`` tags get: one per :data:`CELL_TAGS`, at least
    :data:`PROBE_CELLS` (fewer would probe everything)."""
    return max(PROBE_CELLS, math.ceil(tags / CELL_TAGS))


def needs_training(centres: Centres, tags: int) -> bool:
    """Whether centres trained before no longer serve ``tags`` tags (a registry that has
    doubled or halved since: its cells would hold twice or half the tags they were made for).
    A registry that moved elsewhere at the same size is caught by :func:`lopsided`."""
    return not (centres.tags / 2 <= tags <= centres.tags * 2)


def lopsided(counts: npt.NDArray[np.intp]) -> bool:
    """Whether cells of these sizes no longer spread the tags: one holds :data:`LOPSIDED`
    times what a cell is made for (the registry moved away from where the centres were
    trained; a lookup reading that cell would read much of the registry)."""
    return bool(len(counts)) and int(counts.max()) > LOPSIDED * CELL_TAGS


def unit_rows(m: Vectors) -> Vectors:
    """``m``'s rows scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return np.asarray(m / np.maximum(norms, 1e-12), dtype=np.float32)


def _nearest(
    points: Vectors, centres: Vectors, mean: npt.NDArray[np.float32] | None = None
) -> npt.NDArray[np.intp]:
    """Each point's nearest centre (highest dot product), ``mean`` taken from the points
    first; :data:`CHUNK` points at a time, so that no temporary matrix is the size of all."""
    out = np.empty(len(points), dtype=np.intp)
    for start in range(0, len(points), CHUNK):
        part = points[start : start + CHUNK]
        if mean is not None:
            part = part - mean
        out[start : start + len(part)] = np.argmax(part @ centres.T, axis=1)
    return out


def assign(centroids: Vectors, centres: Centres) -> npt.NDArray[np.intp]:
    """Each centroid's cell: its nearest centre once the mean is taken away."""
    return _nearest(centroids, centres.vectors, centres.mean)


def train_centres(centroids: Vectors, seed: int = 0) -> Centres:
    """Spherical k-means centres for ``centroids`` (unit rows) less their mean:
    :func:`cell_count` of them, trained on a fixed sample of at most :data:`TRAIN_SAMPLE` per
    centre. An emptied centre takes a random sample point again."""
    rng = np.random.default_rng(seed)
    mean = np.asarray(centroids.mean(axis=0), dtype=np.float32)
    k = min(cell_count(len(centroids)), len(centroids))
    take = min(len(centroids), k * TRAIN_SAMPLE)
    points = unit_rows(centroids[np.sort(rng.choice(len(centroids), take, replace=False))] - mean)
    centres = points[rng.choice(len(points), k, replace=False)].copy()
    for _ in range(TRAIN_ROUNDS):
        nearest = _nearest(points, centres)
        sums = np.zeros_like(centres)
        np.add.at(sums, nearest, points)
        counts = np.bincount(nearest, minlength=k)
        empty = counts == 0
        if empty.any():
            sums[empty] = points[rng.choice(len(points), int(empty.sum()), replace=False)]
        centres = unit_rows(sums)
    return Centres(mean, centres, len(centroids))


def compact(centres: Centres, cells: npt.NDArray[np.intp]) -> tuple[Centres, npt.NDArray[np.intp]]:
    """The centres of the non-empty cells only, and each tag's cell numbered among them: a
    lookup then never spends a probe on an empty cell."""
    counts = np.bincount(cells, minlength=len(centres.vectors))
    used = counts > 0
    renumber = np.cumsum(used) - 1
    kept = Centres(centres.mean, np.ascontiguousarray(centres.vectors[used]), centres.tags)
    return kept, renumber[cells].astype(np.intp)


def order_by_cell(
    cells: npt.NDArray[np.intp], k: int
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """The tags' order that makes each cell a contiguous run (stable: within a cell, the
    tags keep their order), and each cell's first position in it."""
    order = np.argsort(cells, kind="stable")
    counts = np.bincount(cells, minlength=k)
    starts = np.zeros(k, dtype=np.intp)
    starts[1:] = np.cumsum(counts[:-1])
    return order, starts


def sample_rows(
    rows: Vectors, row_cells: npt.NDArray[np.intp], seed: int = 0
) -> tuple[Vectors, npt.NDArray[np.intp]]:
    """A fixed uniform sample of :data:`SAMPLE_ROWS` rows (all of them when fewer) and their
    cells."""
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(rows), min(SAMPLE_ROWS, len(rows)), replace=False))
    return np.ascontiguousarray(rows[pick]), row_cells[pick]
