"""Unit tests of agent_reach.core.policy: pattern grammar, policy parsing with line numbers,
deny by default, reach/deliver/claim decisions and enrollment-token scopes."""

from __future__ import annotations

import re
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_reach.core.policy import (
    Decision,
    Pattern,
    Policy,
    PolicyFileError,
    compile_pattern,
    locate_line,
    matches_any,
    parse_policy,
    scope_allows,
)
from agent_reach.errors import ConfigError


def toml(text: str) -> str:
    text = textwrap.dedent(text)
    return text[1:] if text.startswith("\n") else text


# --- patterns -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("weather.*", "weather.query", True),
        ("weather.*", "weather.query.daily", True),  # * crosses dots
        ("weather.*", "weather.", True),  # * matches the empty run
        ("weather.*", "weatherx.query", False),
        ("weather.*", "weather", False),
        ("weather.*", "xweather.query", False),
        ("note.create", "note.create", True),
        ("note.create", "note.created", False),
        ("note.create", "notexcreate", False),  # the dot is literal, not a regex dot
        ("*", "anything.at.all", True),
        ("*", "", True),
        ("*.query", "weather.query", True),
        ("*.query", "weather.queryx", False),
        ("a*b*c", "abc", True),
        ("a*b*c", "axxbyyc", True),
        ("a*b*c", "acb", False),
        ("a*b*c", "abcb", False),
        ("a*a", "a", False),  # prefix and suffix may not overlap
        ("a*a", "aa", True),
        ("ab*ba", "aba", False),
        ("**", "x", True),
        ("x-1_y", "x-1_y", True),
    ],
)
def test_intent_pattern_matching(pattern: str, value: str, expected: bool) -> None:
    compiled = compile_pattern(pattern, "intent")
    assert compiled.text == pattern
    assert compiled.matches(value) is expected


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("*", "agent://anything", True),
        ("*", "whatever", True),
        ("agent://*", "agent://weather-1", True),
        ("agent://weather-*", "agent://weather-eu.1", True),
        ("agent://weather-*", "agent://weatherx", False),
        ("agent://weather-*", "agent://scheduler-1", False),
        ("agent://a.b", "agent://a.b", True),
        ("agent://a.b", "agent://axb", False),
        ("agent://*-eu", "agent://weather-eu", True),
        ("agent://*-eu", "agent://weather-us", False),
    ],
)
def test_endpoint_pattern_matching(pattern: str, value: str, expected: bool) -> None:
    assert compile_pattern(pattern, "endpoint").matches(value) is expected


@pytest.mark.parametrize(
    ("pattern", "kind"),
    [
        ("", "intent"),
        ("Weather.*", "intent"),  # upper case
        ("weather query", "intent"),
        ("weather/query", "intent"),
        ("weather.?", "intent"),
        ("x" * 129, "intent"),
        ("agent://x", "intent"),  # ':' and '/' are not intent characters
        ("weather-*", "endpoint"),  # no scheme
        ("agent://", "endpoint"),
        ("agent://" + "x" * 129, "endpoint"),
        ("agent://Weather", "endpoint"),
        ("agent://a/b", "endpoint"),
        ("http://a", "endpoint"),
        ("**", "endpoint"),  # only the bare * is allowed without the scheme
        (" *", "endpoint"),
    ],
)
def test_invalid_patterns_name_the_pattern(pattern: str, kind: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(pattern))):
        compile_pattern(pattern, kind)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pattern", "kind"),
    [("x" * 128, "intent"), ("agent://" + "x" * 128, "endpoint"), ("a", "intent")],
)
def test_longest_and_shortest_valid_patterns(pattern: str, kind: str) -> None:
    assert compile_pattern(pattern, kind).text == pattern  # type: ignore[arg-type]


def test_pattern_is_frozen_and_comparable() -> None:
    a = compile_pattern("weather.*", "intent")
    assert a == Pattern("weather.*", "intent")
    assert hash(a) == hash(Pattern("weather.*", "intent"))
    with pytest.raises(AttributeError):
        a.text = "x"  # type: ignore[misc]


def test_matches_any() -> None:
    pats = [compile_pattern("a.*", "intent"), compile_pattern("b", "intent")]
    assert matches_any(pats, "a.x")
    assert matches_any(pats, "b")
    assert not matches_any(pats, "c")
    assert not matches_any([], "a")


PIECE = st.text(alphabet="ab.", max_size=4)


@settings(max_examples=500, deadline=None)
@given(pieces=st.lists(PIECE, min_size=1, max_size=5), value=st.text(alphabet="ab.c", max_size=12))
def test_matching_agrees_with_a_regex(pieces: list[str], value: str) -> None:
    text = "*".join(pieces)
    if not text:
        return
    expected = re.fullmatch(".*".join(map(re.escape, pieces)), value, re.DOTALL) is not None
    assert compile_pattern(text, "intent").matches(value) is expected


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet="abc.-_", min_size=1, max_size=40))
def test_a_literal_pattern_matches_only_itself(value: str) -> None:
    pattern = compile_pattern(value, "intent")
    assert pattern.matches(value)
    assert not pattern.matches(value + "x")
    assert not pattern.matches("x" + value)
    assert compile_pattern("*", "intent").matches(value)


def test_hostile_value_is_fast() -> None:
    # a backtracking regex would take ages here; ordered substring search does not
    pattern = compile_pattern("*a*a*a*a*a*a*a*a*b", "intent")
    assert not pattern.matches("a" * 100_000)


# --- parsing: good files ------------------------------------------------------------------------

FULL = toml(
    """
    version = 1

    [[reach]]
    senders = ["agent://scheduler-*"]
    intents = ["weather.*", "note.create"]
    endpoints = ["agent://weather-*"]

    [[reach]]
    senders = ["agent://admin"]
    intents = ["*"]

    [[claim]]
    endpoints = ["agent://weather-*"]
    intents = ["weather.*"]

    [[claim]]
    endpoints = ["*"]
    intents = ["ping"]
    """
)


def test_parse_full_policy() -> None:
    policy = parse_policy(FULL, "policy.toml")
    assert [r.number for r in policy.reach] == [1, 2]
    assert [p.text for p in policy.reach[0].intents] == ["weather.*", "note.create"]
    assert policy.reach[0].endpoints is not None
    assert policy.reach[1].endpoints is None
    assert [r.number for r in policy.claim] == [1, 2]
    assert policy.summary().startswith("2 reach rules, 2 claim rules, sha256 ")
    assert len(policy.digest) == 12


@pytest.mark.parametrize("text", ["", "# nothing\n", "version = 1\n", "reach = []\nclaim = []\n"])
def test_empty_policies_deny_everything(text: str) -> None:
    policy = parse_policy(text)
    assert policy.reach == ()
    assert policy.claim == ()
    decision = policy.may_reach("agent://a", "x")
    assert decision == Decision(False, decision.reason)
    assert "no [[reach]] rules" in decision.reason
    assert not policy.may_claim("agent://a", ["x"]).allowed
    assert not policy.may_deliver("agent://a", "x", "agent://b").allowed


def test_policy_empty() -> None:
    empty = Policy.empty()
    assert not empty.may_reach("agent://a", "x").allowed
    assert empty.summary() == f"0 reach rules, 0 claim rules, sha256 {empty.digest}"
    assert empty.digest == parse_policy("").digest


def test_digest_changes_with_the_text() -> None:
    assert parse_policy(FULL).digest != parse_policy(FULL + "\n").digest
    assert parse_policy(FULL).digest == parse_policy(FULL).digest


def test_summary_singular() -> None:
    text = toml(
        """
        [[reach]]
        senders = ["*"]
        intents = ["*"]
        """
    )
    assert parse_policy(text).summary().startswith("1 reach rule, 0 claim rules, ")


# --- parsing: errors with their line ------------------------------------------------------------

ERRORS = [
    pytest.param(
        """
        version = 1
        [[reach]]
        senders = ["agent://a"]
        intents = ["a"]

        [[reach]]
        senders = ["agent://b"]
        intents = "weather.*"
        """,
        8,
        "[[reach]] #2: 'intents' must be a non-empty list of intent patterns, got 'weather.*'",
        id="string-not-list",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["agent://a"]
        intents = []
        """,
        3,
        "[[reach]] #1: 'intents' must be a non-empty list of intent patterns, got []",
        id="empty-list",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["agent://a", 3]
        intents = ["a"]
        """,
        2,
        "[[reach]] #1: 'senders' must be a non-empty list of endpoint patterns, "
        "got ['agent://a', 3]",
        id="non-string-item",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["agent://a"]
        intents = ["a"]
        endpoints = []
        """,
        4,
        "[[reach]] #1: 'endpoints' must be a non-empty list of endpoint patterns, got []",
        id="empty-endpoints",
    ),
    pytest.param(
        """
        # comment
        [[reach]]
        intents = ["a"]
        """,
        2,
        "[[reach]] #1: missing required key 'senders'",
        id="missing-key-at-header",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["agent://a"]
        intents = ["a"]

        [[claim]]
        endpoints = ["agent://a"]

        [[claim]]
        endpoints = ["agent://a"]
        intents = ["a"]
        """,
        5,
        "[[claim]] #1: missing required key 'intents'",
        id="missing-claim-key",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["agent://a"]
        intents = ["a"]
        sender = ["agent://b"]
        """,
        4,
        "[[reach]] #1: unknown key 'sender' (expected one of senders, intents, endpoints)",
        id="unknown-rule-key",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["scheduler"]
        intents = ["a"]
        """,
        2,
        "[[reach]] #1: 'senders': invalid endpoint pattern 'scheduler'",
        id="invalid-endpoint-pattern",
    ),
    pytest.param(
        """
        [[claim]]
        endpoints = ["*"]
        intents = ["ok", "Not.OK"]
        """,
        3,
        "[[claim]] #1: 'intents': invalid intent pattern 'Not.OK'",
        id="invalid-intent-pattern",
    ),
    pytest.param(
        """
        version = 1
        # a comment
        reech = 2
        """,
        3,
        "unknown top-level key 'reech' (expected one of version, reach, claim)",
        id="unknown-top-level-key",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["*"]
        intents = ["*"]

        [[reaches]]
        senders = ["*"]
        """,
        5,
        "unknown top-level key 'reaches'",
        id="unknown-table",
    ),
    pytest.param(
        """

        version = 2
        """,
        2,
        "'version' must be 1, got 2",
        id="bad-version",
    ),
    pytest.param(
        """
        version = "1"
        """,
        1,
        "'version' must be 1, got '1'",
        id="version-as-string",
    ),
    pytest.param(
        """
        version = true
        """,
        1,
        "'version' must be 1, got True",
        id="version-as-bool",
    ),
    pytest.param(
        """
        # not an array of tables
        [reach]
        senders = ["*"]
        """,
        2,
        "'reach' must be an array of tables written [[reach]]",
        id="reach-as-table",
    ),
    pytest.param(
        """
        claim = 5
        """,
        1,
        "'claim' must be an array of tables written [[claim]], got 5",
        id="claim-as-int",
    ),
    pytest.param(
        """
        x = 1
        reach = [1]
        """,
        1,
        "unknown top-level key 'x'",
        id="first-error-wins",
    ),
    pytest.param(
        """

        reach = ["x"]
        """,
        2,
        "[[reach]] #1 must be a table, got 'x'",
        id="rule-not-a-table",
    ),
    pytest.param(
        """
        reach = [
          {senders = ["*"], intents = ["*"]},
          {senders = ["*"], intents = 3},
        ]
        """,
        1,
        "[[reach]] #2: 'intents' must be a non-empty list of intent patterns, got 3",
        id="inline-rules-fall-back-to-the-key",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["*"]
        intents = ["*"]
        [[reach]]
        senders = ["*"]
        [[reach]]
        "intents" = ["x"]
        'senders' = ["bad"]
        """,
        4,
        "[[reach]] #2: missing required key 'intents'",
        id="key-of-a-later-rule-is-not-taken",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["*"]
        intents = ["*"]
        [[reach]]
        "intents" = ["x"]
        'senders' = ["bad"]
        """,
        6,
        "[[reach]] #2: 'senders': invalid endpoint pattern 'bad'",
        id="quoted-keys",
    ),
    pytest.param(
        """
        [[reach]]
        senders = ["*"]
        intents = ["*"]
        [[reach]]
        intents = ["x"]
          senders = [
          "agent://ok",
          "bad",
        ]
        """,
        6,
        "[[reach]] #2: 'senders': invalid endpoint pattern 'bad'",
        id="indented-key",
    ),
]


@pytest.mark.parametrize(("text", "line", "detail"), ERRORS)
def test_policy_errors_name_the_line(text: str, line: int, detail: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        parse_policy(toml(text), "policy.toml")
    exc = info.value
    assert exc.line == line
    assert exc.source == "policy.toml"
    assert detail in exc.detail
    assert str(exc) == f"policy.toml line {line}: {exc.detail}"
    assert isinstance(exc, ConfigError)  # in the error tree, not a builtin


def test_the_briefs_example_message() -> None:
    text = toml(
        """
        version = 1

        [[reach]]
        senders = ["agent://a"]
        intents = ["a"]
        [[reach]]
        intents = "weather.*"
        senders = ["agent://b"]
        """
    )
    with pytest.raises(PolicyFileError) as info:
        parse_policy(text, "policy.toml")
    assert str(info.value) == (
        "policy.toml line 7: [[reach]] #2: 'intents' must be a non-empty list of intent "
        "patterns, got 'weather.*'"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('version = 1\n[[reach]]\nsenders = ["*" "x"]\n', 3),
        ("[[reach]]\nsenders ==\n", 2),
        ("a = 1\na = 2\n", 2),
        ("[[reach]]\n[reach]\n", 2),
    ],
)
def test_toml_syntax_errors_use_tomllibs_message_and_line(text: str, line: int) -> None:
    with pytest.raises(PolicyFileError) as info:
        parse_policy(text, "p.toml")
    assert info.value.line == line
    assert f"(at line {line}, column" in str(info.value)
    assert str(info.value).startswith(f"p.toml line {line}: ")


def test_toml_error_at_end_of_document_has_no_line() -> None:
    with pytest.raises(PolicyFileError) as info:
        parse_policy("a = ", "p.toml")
    assert info.value.line is None
    assert str(info.value).startswith("p.toml: ")


def test_long_values_are_shortened_in_messages() -> None:
    text = '[[reach]]\nsenders = ["*"]\nintents = "' + "x" * 500 + '"\n'
    with pytest.raises(PolicyFileError) as info:
        parse_policy(text)
    assert len(str(info.value)) < 200
    assert info.value.line == 3


@pytest.mark.parametrize(
    ("table", "index", "key", "line"),
    [
        (None, 1, "version", 1),
        (None, 1, "missing", None),
        (None, 1, None, None),
        ("reach", 1, "intents", 4),
        ("reach", 2, "intents", 8),
        ("reach", 2, "endpoints", 6),  # not in rule 2 (only in the next table): its header
        ("reach", 3, "intents", 2),  # no third header: the table's first header
        ("claim", 1, "senders", 9),
        ("claim", 2, None, 9),
        ("claim", 1, "endpoints", 10),
        ("other", 1, "x", None),
    ],
)
def test_locate_line(table: str | None, index: int, key: str | None, line: int | None) -> None:
    text = toml(
        """
        version = 1
        [[reach]]
        senders = ["*"]
        intents = ["a"]
          # comment intents = 1
        [[ reach ]]
        senders = ["*"]
        intents = ["b"]
        [[claim]]
        endpoints = ["*"]
        """
    )
    assert locate_line(text, table, index, key) == line


# --- decisions ----------------------------------------------------------------------------------

POLICY = parse_policy(FULL, "policy.toml")


@pytest.mark.parametrize(
    ("sender", "intent", "allowed", "reason"),
    [
        ("agent://scheduler-1", "weather.query", True, "[[reach]] rule #1 allows"),
        ("agent://scheduler-1", "note.create", True, "rule #1"),
        ("agent://scheduler-1", "note.delete", False, "no [[reach]] rule allows"),
        ("agent://scheduler-1", "weatherx.query", False, "no [[reach]] rule"),
        ("agent://admin", "note.delete", True, "[[reach]] rule #2 allows agent://admin"),
        ("agent://admin2", "note.delete", False, "agent://admin2"),
        ("agent://other", "weather.query", False, "'weather.query'"),
    ],
)
def test_may_reach(sender: str, intent: str, allowed: bool, reason: str) -> None:
    decision = POLICY.may_reach(sender, intent)
    assert decision.allowed is allowed
    assert reason in decision.reason
    assert POLICY.may_reach(sender, intent) == decision  # cached answer is the same


def test_reach_cache_is_bounded() -> None:
    policy = parse_policy(FULL)
    for i in range(10_000):
        policy.may_reach(f"agent://s{i}", "x")
        assert len(policy._cache) <= 4096
    assert policy.may_reach("agent://admin", "x").allowed


def test_allowed_endpoints() -> None:
    only = POLICY.allowed_endpoints("agent://scheduler-1", "weather.query")
    assert only is not None
    assert only("agent://weather-1")
    assert not only("agent://notes")
    # rule #2 has no endpoints restriction: any recipient
    assert POLICY.allowed_endpoints("agent://admin", "weather.query") is None
    # no rule matches: nothing
    nothing = POLICY.allowed_endpoints("agent://nobody", "weather.query")
    assert nothing is not None
    assert not nothing("agent://weather-1")


def test_allowed_endpoints_is_the_union_of_matching_rules() -> None:
    policy = parse_policy(
        toml(
            """
            [[reach]]
            senders = ["agent://s"]
            intents = ["a.*"]
            endpoints = ["agent://one"]
            [[reach]]
            senders = ["*"]
            intents = ["a.b"]
            endpoints = ["agent://two-*"]
            [[reach]]
            senders = ["agent://t"]
            intents = ["a.b"]
            """
        )
    )
    pred = policy.allowed_endpoints("agent://s", "a.b")
    assert pred is not None
    assert pred("agent://one")
    assert pred("agent://two-x")
    assert not pred("agent://three")
    pred_c = policy.allowed_endpoints("agent://s", "a.c")
    assert pred_c is not None
    assert pred_c("agent://one")
    assert not pred_c("agent://two-x")
    assert policy.allowed_endpoints("agent://t", "a.b") is None

    assert policy.may_deliver("agent://s", "a.b", "agent://two-x").reason.startswith(
        "[[reach]] rule #2 allows"
    )
    refused = policy.may_deliver("agent://s", "a.b", "agent://three")
    assert not refused.allowed
    assert refused.reason == (
        "agent://s may send 'a.b' only to agent://one, agent://two-* ([[reach]] rule #1, #2), "
        "not to agent://three"
    )


@pytest.mark.parametrize(
    ("sender", "intent", "endpoint", "allowed", "reason"),
    [
        ("agent://scheduler-1", "weather.query", "agent://weather-eu", True, "rule #1"),
        ("agent://scheduler-1", "weather.query", "agent://notes", False, "not to agent://notes"),
        ("agent://scheduler-1", "note.delete", "agent://weather-eu", False, "no [[reach]] rule"),
        ("agent://admin", "note.delete", "agent://anything", True, "rule #2"),
    ],
)
def test_may_deliver(sender: str, intent: str, endpoint: str, allowed: bool, reason: str) -> None:
    decision = POLICY.may_deliver(sender, intent, endpoint)
    assert decision.allowed is allowed
    assert reason in decision.reason


@pytest.mark.parametrize(
    ("endpoint", "intents", "allowed", "reason"),
    [
        ("agent://weather-1", ["weather.query"], True, "[[claim]] rule #1 allows"),
        ("agent://weather-1", ["weather.query", "ping"], True, "rule #1, #2"),
        ("agent://weather-1", ["weather.query", "ping", "weather.x"], True, "3 intents"),
        ("agent://notes", ["ping"], True, "rule #2"),
        ("agent://notes", ["ping", "note.create", "x"], False, "'note.create'"),
        ("agent://weather-1", ["note.create"], False, "no [[claim]] rule lets agent://weather-1"),
        ("agent://weather-1", ["weatherx.query"], False, "'weatherx.query'"),
        ("agent://weather-1", [], True, "claims no intents"),
    ],
)
def test_may_claim(endpoint: str, intents: list[str], allowed: bool, reason: str) -> None:
    decision = POLICY.may_claim(endpoint, intents)
    assert decision.allowed is allowed
    assert reason in decision.reason


@settings(max_examples=200, deadline=None)
@given(
    sender=st.sampled_from(["agent://a", "agent://b", "agent://c"]),
    intent=st.sampled_from(["x", "x.y", "y", "z"]),
    endpoint=st.sampled_from(["agent://e1", "agent://e2", "agent://f"]),
)
def test_may_deliver_implies_may_reach_and_predicate(
    sender: str, intent: str, endpoint: str
) -> None:
    policy = parse_policy(
        toml(
            """
            [[reach]]
            senders = ["agent://a", "agent://b"]
            intents = ["x*"]
            endpoints = ["agent://e*"]
            [[reach]]
            senders = ["agent://b"]
            intents = ["y"]
            [[reach]]
            senders = ["*"]
            intents = ["x.y"]
            endpoints = ["agent://f"]
            """
        )
    )
    deliver = policy.may_deliver(sender, intent, endpoint)
    reach = policy.may_reach(sender, intent)
    pred = policy.allowed_endpoints(sender, intent)
    assert deliver.allowed == (reach.allowed and (pred is None or pred(endpoint)))


# --- enrollment-token scopes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoints", "intents", "endpoint_id", "claimed", "allowed", "reason"),
    [
        (["agent://weather-*"], ["weather.*"], "agent://weather-1", ["weather.q"], True, "allows"),
        (
            ["agent://weather-*"],
            ["weather.*"],
            "agent://notes",
            ["weather.q"],
            False,
            "agent://notes",
        ),
        (
            ["agent://weather-*"],
            ["weather.*"],
            "agent://weather-1",
            ["weather.q", "note.x"],
            False,
            "'note.x'",
        ),
        (["*"], ["*"], "agent://x", ["a", "b"], True, "2 intents"),
        ([], ["*"], "agent://x", ["a"], False, "no endpoints"),
        (["*"], [], "agent://x", ["a"], False, "no intents"),
        (["*"], [], "agent://x", [], True, "0 intents"),
    ],
)
def test_scope_allows(
    endpoints: list[str],
    intents: list[str],
    endpoint_id: str,
    claimed: list[str],
    allowed: bool,
    reason: str,
) -> None:
    decision = scope_allows(endpoints, intents, endpoint_id, claimed)
    assert decision.allowed is allowed
    assert reason in decision.reason


def test_scope_allows_rejects_invalid_patterns() -> None:
    with pytest.raises(ValueError, match="'bad'"):
        scope_allows(["bad"], ["*"], "agent://x", [])
    with pytest.raises(ValueError, match="'Bad'"):
        scope_allows(["*"], ["Bad"], "agent://x", [])
