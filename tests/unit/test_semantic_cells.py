"""Cells of a big semantic index (intents/cells.py): a lookup reads the cells nearest the query,
about as many rows at 24,000 tags as at 6,000, and decides as the lookup of every row does.

The vectors are synthetic (an embedder of 384-dim unit vectors with the structure of real
ones: 300 topics, tags near their topic, each text near its tag), so that registries of
thousands of tags are built in seconds; the model's cost is not what is tested here."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

np = pytest.importorskip("numpy")

from agent_reach.intents.calibration import SEMANTIC_E5_SMALL  # noqa: E402
from agent_reach.intents.cells import (  # noqa: E402
    CELL_TAGS,
    LOPSIDED,
    PROBE_CELLS,
    needs_training,
)
from agent_reach.intents.semantic import SemanticIndex, SemanticMatcher  # noqa: E402

DIM = 384
TOPICS = 300
TEXT = re.compile(r"^t(\d+) ([a-z])$")


class Synthetic:
    """Text ``t{i} {v}`` (``v`` in ``a``, ``b``, ``q``: the words of ``t{i}.q``) -> the unit
    vector of tag ``i``'s text ``v``: a direction all share, its topic's, the tag's own and the
    text's own (fixed by a seed)."""

    name = "synthetic"
    dim = DIM

    def __init__(self, tags: int, seed: int = 1, crowded_from: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.topic_of = np.arange(tags) % TOPICS
        if crowded_from is not None:  # the tags from there on all of one topic
            self.topic_of[crowded_from:] = 7
        # a direction every text shares: unrelated texts at a cosine of ~0.86 (e5: ~0.75-0.8),
        # so that the rows outside the probed cells weigh in every share
        self.common = rng.standard_normal(DIM).astype(np.float32) * 3.0
        self.topics = rng.standard_normal((TOPICS, DIM)).astype(np.float32)
        self.own = rng.standard_normal((tags, DIM)).astype(np.float32) * 0.45
        self.noise = rng.standard_normal((tags, 3, DIM)).astype(np.float32) * 0.25

    def tag_vector(self, i: int) -> np.ndarray:
        return self.common + self.topics[self.topic_of[i]] + self.own[i]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), DIM), np.float32)
        for n, text in enumerate(texts):
            found = TEXT.match(text)
            assert found is not None, text
            i, v = int(found[1]), "abq".index(found[2])
            out[n] = self.tag_vector(i) + self.noise[i, v]
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    embed_passages = embed_queries

    def query(self, i: int, rng: np.random.Generator) -> np.ndarray:
        """A new text of tag ``i``: its vector with noise of its own."""
        v = self.tag_vector(i) + rng.standard_normal(DIM).astype(np.float32) * 0.25
        return (v / np.linalg.norm(v)).astype(np.float32)


def texts(tag: str) -> list[str]:
    i = tag[1:].split(".")[0]
    return [f"t{i} a", f"t{i} b"]


def matcher(embedder: Synthetic, partition_min_tags: int) -> SemanticMatcher:
    return SemanticMatcher(
        embedder,  # type: ignore[arg-type]
        SEMANTIC_E5_SMALL,
        background=(),
        partition_min_tags=partition_min_tags,
    )


def build(embedder: Synthetic, tags: int, partition_min_tags: int) -> SemanticIndex:
    return matcher(embedder, partition_min_tags).build([f"t{i}.q" for i in range(tags)], texts)


def cell_sizes(index: SemanticIndex) -> np.ndarray:
    assert index.cells is not None
    return np.diff(np.append(index.cells.starts, len(index.tags)))


@pytest.fixture(scope="module")
def big() -> tuple[Synthetic, SemanticIndex, SemanticIndex]:
    embedder = Synthetic(6000)
    return embedder, build(embedder, 6000, 1000), build(embedder, 6000, 10**9)


def test_only_a_big_index_has_cells(big: tuple[Synthetic, SemanticIndex, SemanticIndex]) -> None:
    _, cut, whole = big
    assert whole.cells is None
    assert cut.cells is not None
    assert len(cut.cells.centres.vectors) == 6000 // CELL_TAGS + 1
    assert sorted(cut.tags) == sorted(whole.tags)  # the same tags, ordered by cell
    assert not needs_training(cut.cells.centres, 6000)
    assert needs_training(cut.cells.centres, 6000 * 3)


def test_a_lookup_in_cells_decides_as_the_lookup_of_every_row(
    big: tuple[Synthetic, SemanticIndex, SemanticIndex],
) -> None:
    embedder, cut, whole = big
    rng = np.random.default_rng(5)
    same_top = 0
    share_ratios = []
    asked = range(0, 6000, 20)
    for i in asked:
        q = embedder.query(i, rng)
        a, b = cut.candidates(q, 3), whole.candidates(q, 3)
        if a[0].tag == b[0].tag:
            same_top += 1
            assert a[0].score == pytest.approx(b[0].score, abs=1e-5)
            assert a[0].margin == pytest.approx(b[0].margin, abs=1e-5)
            share_ratios.append(a[0].share / b[0].share)
    assert same_top >= 0.98 * len(asked), same_top
    # the share's estimate of the unprobed rows: within 1 % of the whole sum (the probed rows
    # alone would make them 1.27-1.70x too big here)
    assert min(share_ratios) > 0.99 and max(share_ratios) < 1.01, (
        min(share_ratios),
        max(share_ratios),
    )


def test_a_lookup_reads_about_as_many_rows_at_four_times_the_tags() -> None:
    embedder = Synthetic(24000, seed=2)
    rng = np.random.default_rng(3)
    read = {}
    for tags in (6000, 24000):
        index = build(embedder, tags, 1000)
        assert index.cells is not None
        rows = []
        for i in range(0, tags, tags // 50):
            _, spans = index.probe(index.cells, embedder.query(i, rng))
            rows.append(sum(int(index.ends[t1 - 1] - index.starts[t0]) for t0, t1 in spans))
        read[tags] = float(np.median(rows))
    # PROBE_CELLS cells of ~CELL_TAGS tags of 2 rows each, whatever the registry's size
    assert read[24000] < 1.5 * read[6000], read
    assert read[24000] < 2.5 * PROBE_CELLS * CELL_TAGS * 2, read


def test_the_same_tags_in_another_order_make_the_same_index() -> None:
    """The known tags come as a set, in an order of the process's string hashing."""
    embedder = Synthetic(3000)
    names = [f"t{i}.q" for i in range(3000)]
    a = matcher(embedder, 1000).build(names, texts)
    b = matcher(embedder, 1000).build(names[::-1], texts)
    assert a.cells is not None and b.cells is not None
    assert a.tags == b.tags
    assert np.array_equal(a.cells.starts, b.cells.starts)
    assert np.array_equal(a.cells.centres.vectors, b.cells.centres.vectors)
    assert np.array_equal(a.cells.sample, b.cells.sample)


def test_a_registry_that_moved_gets_cells_of_its_own() -> None:
    """As many tags as before, but all of one topic: the old centres would put them in a few
    cells (and leave the rest empty); the centres are trained again, and no cell is empty."""
    embedder = Synthetic(6000, crowded_from=3000)
    m = matcher(embedder, 1000)
    first = m.build([f"t{i}.q" for i in range(3000)], texts)
    assert first.cells is not None
    before = first.cells.centres.vectors
    moved = m.build([f"t{i}.q" for i in range(3000, 6000)], texts)
    assert moved.cells is not None
    assert not np.array_equal(moved.cells.centres.vectors, before)  # trained again
    sizes = cell_sizes(moved)
    assert sizes.min() > 0 and sizes.max() <= LOPSIDED * CELL_TAGS, (sizes.min(), sizes.max())
    same_again = m.build([f"t{i}.q" for i in range(3000, 6000)], texts)
    assert same_again.cells is not None  # the same registry: the centres kept
    assert np.array_equal(same_again.cells.centres.vectors, moved.cells.centres.vectors)


def rows_by_tag(index: SemanticIndex) -> dict[str, np.ndarray]:
    ends = np.append(index.starts[1:], len(index.rows))
    return {tag: index.rows[a:b] for tag, a, b in zip(index.tags, index.starts, ends, strict=True)}


@pytest.mark.parametrize("cut", [1000, 10**9])  # with cells, and without
def test_a_rebuild_that_keeps_drops_and_adds_texts_equals_a_fresh_build(cut: int) -> None:
    """A build reuses the last build's vectors by gathering them (not one row at a time): what
    it keeps, drops and adds must come out as a fresh matcher's build of the same tags."""
    embedder = Synthetic(3000)
    again = matcher(embedder, cut)
    again.build([f"t{i}.q" for i in range(0, 2000)], texts)
    now = [f"t{i}.q" for i in range(1000, 3000)]  # half kept, a thousand dropped, a thousand new
    rebuilt = again.build(now, texts)
    fresh = matcher(embedder, cut).build(now, texts)
    assert sorted(rebuilt.tags) == sorted(now)
    mine, theirs = rows_by_tag(rebuilt), rows_by_tag(fresh)
    for tag in now:
        np.testing.assert_allclose(mine[tag], theirs[tag], rtol=0, atol=1e-6)
    np.testing.assert_allclose(
        rebuilt.centroids[np.argsort(rebuilt.tags)],
        fresh.centroids[np.argsort(fresh.tags)],
        rtol=0,
        atol=1e-6,
    )
    assert len(again._row_of) == 3 * len(now)  # only this build's texts (words, a, b) are kept
