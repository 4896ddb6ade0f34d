"""The raw-features-to-confidence map: bounded, monotone, fitted by a logistic regression and
moved so that the contract point (0.8) holds the asked precision on calibration data."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.intents.calibration import (
    CONTRACT_THRESHOLD,
    LEXICAL,
    SEMANTIC_E5_SMALL,
    Calibration,
    Candidate,
    MatcherCalibration,
    contract_cut,
    feature_values,
    fit_logistic,
    logit,
    script_of,
    sigmoid,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(finite)
def test_sigmoid_is_bounded_and_inverts_logit(z: float) -> None:
    p = sigmoid(z)
    assert 0.0 <= p <= 1.0
    if 1e-9 < p < 1 - 1e-9:
        assert logit(p) == pytest.approx(z, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("cal", [SEMANTIC_E5_SMALL, LEXICAL], ids=["semantic", "lexical"])
@given(top=st.floats(-2, 2), margin=st.floats(-2, 2), more=st.floats(0, 0.5))
def test_shipped_confidence_is_bounded_and_monotone(
    cal: MatcherCalibration, top: float, margin: float, more: float
) -> None:
    for query in ("weather", "天气"):
        base = cal.confidence(Candidate("t", top, margin), query)
        assert 0.0 <= base <= 1.0
        assert cal.confidence(Candidate("t", top + more, margin), query) >= base
        assert cal.confidence(Candidate("t", top, margin + more), query) >= base


@given(
    top=st.floats(-2, 2),
    margin=st.floats(-2, 2),
    share=st.floats(0, 1),
    more=st.floats(0, 1),
)
def test_shipped_semantic_confidence_is_monotone_in_the_share(
    top: float, margin: float, share: float, more: float
) -> None:
    higher = min(1.0, share + more)
    for query in ("weather", "天气"):
        base = SEMANTIC_E5_SMALL.confidence(Candidate("t", top, margin, share), query)
        assert 0.0 <= base <= 1.0
        assert SEMANTIC_E5_SMALL.confidence(Candidate("t", top, margin, higher), query) >= base


def test_feature_values_by_name() -> None:
    c = Candidate("t", 0.9, 0.05, 0.8)
    top, margin, share = feature_values(c, ("top", "margin", "share"))
    assert (top, margin) == (0.9, 0.05)
    assert share == pytest.approx(math.log(0.8 / 0.2))
    # a matcher that computes no share (the lexical one) leaves 1.0: finite log-odds
    assert math.isfinite(feature_values(Candidate("t", 0.9, 0.05), ("share",))[0])
    assert math.isfinite(feature_values(Candidate("t", 0.9, 0.05, 0.0), ("share",))[0])
    assert LEXICAL.latin.features == ("top", "margin")  # the lexical map ignores the share
    with pytest.raises(ValueError):
        feature_values(c, ("cosine",))


def test_shipped_weights_are_positive() -> None:
    for cal in (SEMANTIC_E5_SMALL, LEXICAL):
        for one in (cal.latin, cal.cjk):
            assert all(w > 0 for w in one.weights), cal.name


def test_confidence_of_nan_is_zero() -> None:
    assert Calibration(("top",), (1.0,), 0.0).confidence((math.nan,)) == 0.0


def test_a_weight_per_feature() -> None:
    with pytest.raises(ValueError, match="a weight per feature"):
        Calibration(("top", "margin"), (1.0,), 0.0)


def test_fit_recovers_a_known_logistic() -> None:
    rng = random.Random(3)
    true_w, true_b = (8.0, -3.0), -2.0
    rows, labels = [], []
    for _ in range(4000):
        x = (rng.random(), rng.random())
        p = sigmoid(true_b + true_w[0] * x[0] + true_w[1] * x[1])
        rows.append(x)
        labels.append(rng.random() < p)
    weights, bias = fit_logistic(rows, labels)
    assert weights[0] == pytest.approx(8.0, abs=1.0)
    assert weights[1] == pytest.approx(-3.0, abs=0.8)
    assert bias == pytest.approx(-2.0, abs=0.6)


def test_fit_with_separable_data_stays_finite() -> None:
    rows = [(0.1 * i,) for i in range(20)]
    weights, bias = fit_logistic(rows, [i >= 10 for i in range(20)])
    assert all(math.isfinite(w) for w in weights)
    assert math.isfinite(bias)
    assert weights[0] > 0


def test_fit_refuses_mismatched_input() -> None:
    with pytest.raises(ValueError, match="as many"):
        fit_logistic([(1.0,)], [True, False])


def test_contract_cut_is_the_lowest_cut_that_holds_the_precision() -> None:
    # scores high to low: right, right, wrong, right, right, wrong
    items = [(6.0, True), (5.0, True), (4.0, False), (3.0, True), (2.0, True), (1.0, False)]
    assert contract_cut({"a": items}, 1.0) == 5.0  # nothing wrong accepted
    # 4 of 5 right at 2.0, but 2 of 3 at 4.0: a stricter threshold would be less precise
    assert contract_cut({"a": items}, 0.75) == 5.0
    assert contract_cut({"a": items}, 0.75, min_accepted=4) == 2.0  # 2 of 3 forgiven
    assert contract_cut({"a": items}, 0.6) == 1.0  # the whole set: 4 of 6


def test_contract_cut_stops_at_the_first_failure_past_min_accepted() -> None:
    items = [(5.0, True), (4.0, False), (3.0, True), (2.0, True), (1.0, True)]
    assert contract_cut({"a": items}, 0.75, min_accepted=1) == 5.0
    # the early failures (1 of 2, 2 of 3) are forgiven below min_accepted; 4 of 5 at 1.0
    assert contract_cut({"a": items}, 0.75, min_accepted=4) == 1.0


def test_contract_cut_keeps_ties_together() -> None:
    items = [(2.0, True), (2.0, False), (1.0, True)]
    cut = contract_cut({"a": items}, 1.0)
    assert cut > 2.0  # the tie group holds a wrong one: nothing is accepted


def test_contract_cut_of_groups_is_the_strictest() -> None:
    a = [(3.0, True), (2.0, True), (1.0, True)]
    b = [(3.0, True), (2.0, False), (1.0, True)]
    assert contract_cut({"a": a}, 1.0) == 1.0
    assert contract_cut({"a": a, "b": b}, 1.0) == 3.0
    assert contract_cut({"a": a, "empty": []}, 1.0) == 1.0
    assert contract_cut({}, 1.0) == math.inf


def test_shifted_puts_the_cut_at_the_contract_point() -> None:
    cal = Calibration(("top", "margin"), (10.0, 20.0), -5.0)
    x = (0.7, 0.1)
    moved = cal.shifted(cal.logit(x))
    assert moved.confidence(x) == pytest.approx(CONTRACT_THRESHOLD)
    assert moved.weights == cal.weights


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("帮我查一下明天成都的天气", "cjk"),
        ("what is the weather like in 成都 today", "latin"),
        ("成都天气 weather", "cjk"),
        ("成都 weather", "latin"),
        ("明日の天気", "cjk"),
        ("😂😂", "latin"),
        ("", "latin"),
        ("weather.query", "latin"),
    ],
)
def test_script_of(text: str, script: str) -> None:
    assert script_of(text) == script


def test_matcher_calibration_picks_the_map_by_script() -> None:
    low = Calibration(("top", "margin"), (1.0, 1.0), -10.0)
    high = Calibration(("top", "margin"), (1.0, 1.0), 10.0)
    cal = MatcherCalibration("t", latin=low, cjk=high)
    c = Candidate("weather.query", 0.5, 0.1)
    assert cal.confidence(c, "天气") > 0.99
    assert cal.confidence(c, "weather") < 0.01


def test_a_tag_read_as_words_uses_the_tag_map() -> None:
    low = Calibration(("top", "margin"), (1.0, 1.0), -10.0)
    high = Calibration(("top", "margin"), (1.0, 1.0), 10.0)
    cal = MatcherCalibration("t", latin=high, cjk=high, tag=low)
    c = Candidate("parity.echo", 0.9, 0.1)
    assert cal.confidence(c, "parity none") > 0.99
    assert cal.confidence(c, "parity none", is_tag=True) < 0.01
    untagged = MatcherCalibration("t", latin=high, cjk=high)
    assert untagged.confidence(c, "parity none", is_tag=True) > 0.99


@pytest.mark.parametrize("cal", [SEMANTIC_E5_SMALL, LEXICAL], ids=["semantic", "lexical"])
def test_shipped_tag_map_is_stricter_than_the_words_map(cal: MatcherCalibration) -> None:
    assert cal.tag is not None
    assert cal.tag.weights == cal.latin.weights
    assert cal.tag.bias < cal.latin.bias
    for top, margin in ((0.9, 0.05), (0.95, 0.1), (0.5, 0.3)):
        c = Candidate("t", top, margin)
        assert cal.confidence(c, "x y", is_tag=True) < cal.confidence(c, "x y")
