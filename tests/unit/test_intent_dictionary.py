"""The intent dictionary file: read all or nothing, every fault refused with its line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_reach.doctor import Diagnostics, Snapshot, diagnose
from agent_reach.errors import ConfigError, DictionaryError, UnknownIntent
from agent_reach.intents.dictionary import (
    EMPTY_DICTIONARY,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    IntentDictionary,
    IntentEntry,
    load_dictionary,
    parse_dictionary,
    strict_refusal,
)

GOOD = """\
# the demo's dictionary
[[intent]]
tag = "weather.query"
description = "Current or coming weather for a place and a date"
aliases = ["weather.lookup", "weather.get"]
examples = ["what is the weather in Chengdu tomorrow", "成都明天天气怎么样"]
hedge_after_ms = 250

[[intent]]
tag = "note.create"
description = '''Write a note down,
over two lines'''
examples = [
  "remember to buy milk",
  "note: call Ana",
]

[[intent]]
tag = "weather.old"
deprecated = true
replaced_by = "weather.query"
"""


def refused(text: str) -> DictionaryError:
    with pytest.raises(DictionaryError) as info:
        parse_dictionary(text, source="d.toml")
    return info.value


# --- a good file -------------------------------------------------------------------------------


def test_a_good_file_is_read_in_file_order() -> None:
    d = parse_dictionary(GOOD, source="d.toml")
    assert d.tags() == ("weather.query", "note.create", "weather.old")
    assert len(d) == 3 and d.path == "d.toml"
    weather = d.entries["weather.query"]
    assert weather == IntentEntry(
        "weather.query",
        "Current or coming weather for a place and a date",
        ("weather.lookup", "weather.get"),
        ("what is the weather in Chengdu tomorrow", "成都明天天气怎么样"),
        hedge_after_ms=250,
    )
    assert isinstance(weather.hedge_after_ms, int)
    assert d.entries["note.create"].hedge_after_ms is None  # no hedging unless asked
    assert d.entries["note.create"].description == "Write a note down,\nover two lines"
    old = d.entries["weather.old"]
    assert (old.deprecated, old.replaced_by) == (True, "weather.query")


def test_canonical_texts_and_membership() -> None:
    d = parse_dictionary(GOOD)
    assert d.canonical("weather.query") == "weather.query"
    assert d.canonical("weather.lookup") == "weather.query"  # an alias
    assert d.canonical("weather.forecast") is None
    assert "weather.query" in d and "weather.lookup" not in d  # aliases are not canonical
    assert dict(d.aliases) == {"weather.lookup": "weather.query", "weather.get": "weather.query"}
    assert d.texts("weather.query") == (
        "Current or coming weather for a place and a date",
        "what is the weather in Chengdu tomorrow",
        "成都明天天气怎么样",
    )
    assert d.texts("weather.old") == ()  # no description, no examples
    assert d.texts("weather.lookup") == ()  # an alias has no texts of its own
    assert [e.tag for e in d] == list(d.tags())


def test_an_empty_file_is_an_empty_dictionary_and_equality_is_by_entries() -> None:
    assert len(parse_dictionary("")) == 0
    assert parse_dictionary("# nothing yet\n") == EMPTY_DICTIONARY
    assert parse_dictionary(GOOD, source="a") == parse_dictionary(GOOD, source="b")
    assert parse_dictionary(GOOD) != parse_dictionary(GOOD.replace("note.create", "note.add"))
    d = parse_dictionary(GOOD)
    with pytest.raises(TypeError):
        d.entries["x"] = IntentEntry("x")  # type: ignore[index]


@pytest.mark.parametrize(
    ("value", "read"), [("0", 0), ("1", 1), ("50", 50), ("600000", 600_000), ("1_000", 1000)]
)
def test_hedge_after_ms_is_a_whole_number_of_milliseconds_0_means_the_p95(
    value: str, read: int
) -> None:
    d = parse_dictionary(f'[[intent]]\ntag = "a.b"\nhedge_after_ms = {value}\n')
    assert d.entries["a.b"].hedge_after_ms == read
    assert type(d.entries["a.b"].hedge_after_ms) is int


def test_load_dictionary_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "intents.toml"
    path.write_text(GOOD, encoding="utf-8")
    d = load_dictionary(str(path))
    assert d.path == str(path) and len(d) == 3


# --- every fault, with its line ----------------------------------------------------------------

FAULTS = [
    # (the text, the line at fault, words of the refusal)
    ('[[intent]]\ntag = "a.b"\ndescription = "x\n', 3, "not valid TOML"),
    ('[[intent]]\ntag = "a.b"\n[[intent]\n', 3, "not valid TOML"),
    ('[[intent]]\ntag = "a.b"\ntag = "c.d"\n', 3, "not valid TOML"),
    ('version = 1\n[[intent]]\ntag = "a.b"\n', 1, "unknown key 'version'"),
    ('[[intent]]\ntag = "a.b"\n\n[other]\nx = 1\n', 4, "unknown key 'other'"),
    ('[[intent]]\ntag = "a.b"\ndescripton = "typo"\n', 3, "unknown key 'descripton'"),
    ('[[intent]]\ntag = "a.b"\n[intent.extra]\nx = 1\n', 3, "unknown key 'extra'"),
    ('intent = "weather.query"\n', 1, "array of tables"),
    ("intent = [1, 2]\n", 1, "not a table"),
    ('[[intent]]\ndescription = "no tag"\n', 1, "without a tag"),
    ('[[intent]]\ntag = "Weather.Query"\n', 2, "not a valid tag"),
    ('[[intent]]\ntag = "weather..query"\n', 2, "not a valid tag"),
    ('[[intent]]\ntag = "' + "a" * 129 + '"\n', 2, "not a valid tag"),
    ("[[intent]]\ntag = 7\n", 2, "must be a string"),
    ('[[intent]]\ntag.x = "a"\n', 2, "must be a string"),
    (
        '[[intent]]\ntag = "a.b"\naliases = [\n  "a.c",\n  "A.D",\n]\n',
        5,
        "alias 'A.D' is not a valid tag",
    ),
    ('[[intent]]\ntag = "a.b"\naliases = "a.c"\n', 3, "list of strings"),
    ('[[intent]]\ntag = "a.b"\naliases = ["a.c", 3]\n', 3, "strings only"),
    ('[[intent]]\ntag = "a.b"\n\n[[intent]]\ntag = "a.b"\n', 5, "repeated (first at line 2)"),
    (
        '[[intent]]\ntag = "a.b"\naliases = ["x.y"]\n\n[[intent]]\ntag = "c.d"\n'
        'aliases = [\n  "z.z",\n  "x.y",\n]\n',
        9,
        "given to two tags: 'a.b' and 'c.d'",
    ),
    ('[[intent]]\ntag = "a.b"\naliases = ["a.b"]\n', 3, "the entry's own tag"),
    (
        '[[intent]]\ntag = "a.b"\n\n[[intent]]\ntag = "c.d"\naliases = ["a.b"]\n',
        6,
        "also a tag",
    ),
    (
        '[[intent]]\ntag = "a.b"\naliases = ["c.d"]\n\n[[intent]]\ntag = "c.d"\n',
        6,
        "also an alias of 'a.b'",
    ),
    ('[[intent]]\ntag = "a.b"\naliases = ["a.c", "a.c"]\n', 3, "repeated"),
    (
        '[[intent]]\ntag = "a.b"\ndeprecated = true\nreplaced_by = "a.z"\n',
        4,
        "names no entry",
    ),
    (
        '[[intent]]\ntag = "a.b"\ndeprecated = true\nreplaced_by = "a.b"\n',
        4,
        "the entry itself",
    ),
    (
        '[[intent]]\ntag = "a.b"\naliases = ["a.c"]\n\n[[intent]]\ntag = "o.p"\n'
        'deprecated = true\nreplaced_by = "a.c"\n',
        8,
        "is an alias of 'a.b'",
    ),
    (
        '[[intent]]\ntag = "a.b"\ndeprecated = true\nreplaced_by = "c.d"\n\n'
        '[[intent]]\ntag = "c.d"\ndeprecated = true\nreplaced_by = "a.b"\n',
        4,
        "circle",
    ),
    ('[[intent]]\ntag = "a.b"\nreplaced_by = "c.d"\n\n[[intent]]\ntag = "c.d"\n', 3, "deprecated"),
    ('[[intent]]\ntag = "a.b"\ndeprecated = "yes"\n', 3, "true or false"),
    ('[[intent]]\ntag = "a.b"\ndescription = 5\n', 3, "description must be a string"),
    ('[[intent]]\ntag = "a.b"\ndescription = "' + "x" * 2001 + '"\n', 3, "over 2000 characters"),
    ('[[intent]]\ntag = "a.b"\nexamples = ["ok", "  "]\n', 3, "empty example"),
    (
        '[[intent]]\ntag = "a.b"\nexamples = [\n  "ok",\n  "' + "y" * 2001 + '",\n]\n',
        5,
        "an example is over 2000",
    ),
    (
        '[[intent]]\ntag = "a.b"\nexamples = [' + ", ".join(['"e"'] * 101) + "]\n",
        3,
        "more than 100 examples",
    ),
    (
        '[[intent]]\ntag = "a.b"\naliases = [' + ", ".join(f'"a.x{i}"' for i in range(101)) + "]\n",
        3,
        "more than 100 aliases",
    ),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = -1\n', 3, "hedge_after_ms must be a whole"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = 2.5\n', 3, "not 2.5"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = 50.0\n', 3, "not 50.0"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = nan\n', 3, "not nan"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = 600001\n', 3, "from 0 to 600000"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = true\n', 3, "not a boolean"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = "5"\n', 3, "not a string"),
    ('[[intent]]\ntag = "a.b"\nhedge_after_ms = [50]\n', 3, "not a list"),
    (
        '[[intent]]\ntag = "a.b"\n\n[[intent]]\ntag = "c.d"\ndescription = "x"\n'
        "hedge_after_ms = -5\n",
        7,  # the second entry's
        "c.d: hedge_after_ms",
    ),
]


@pytest.mark.parametrize(("text", "line", "words"), FAULTS)
def test_every_fault_is_refused_with_its_line(text: str, line: int, words: str) -> None:
    exc = refused(text)
    assert (exc.line, exc.source, exc.path) == (line, "intents", "d.toml"), str(exc)
    assert words in exc.detail, str(exc)
    assert isinstance(exc, ConfigError) and exc.code == "config_error"
    assert str(exc).startswith(f"--intents d.toml line {line}: ")
    body = exc.to_body()
    assert (body["error"], body["line"], body["source"]) == ("config_error", line, "intents")


def test_an_error_at_the_end_of_the_document_names_the_last_line() -> None:
    assert refused('[[intent]]\ntag = "a.b"\naliases = [\n').line == 3


def test_nesting_too_deep_is_refused_not_raised() -> None:
    exc = refused("x = " + "[" * 5000 + "]" * 5000)
    assert exc.line is None and "nested" in exc.detail


def test_a_number_tomllib_will_not_convert_is_refused() -> None:
    exc = refused("[[intent]]\ntag = 1" + "0" * 5000 + "\n")
    assert "not valid TOML" in exc.detail


def test_too_many_entries_are_counted_before_parsing() -> None:
    # invalid TOML after the headers: the count refuses the file before tomllib would
    text = '[[intent]]\ntag = "a.b"\n' * (MAX_ENTRIES + 1) + "this is not TOML\n"
    started = time.perf_counter()
    exc = refused(text)
    assert f"more than {MAX_ENTRIES}" in exc.detail
    assert exc.line == 2 * MAX_ENTRIES + 1  # the header of the entry past the limit
    assert time.perf_counter() - started < 5


def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.write(b"# " + b"x" * (MAX_FILE_BYTES + 10) + b"\n")
    with pytest.raises(DictionaryError) as info:
        load_dictionary(str(big))
    assert "over 10 MB" in info.value.detail and info.value.line is None
    assert "over 10 MB" in refused("# " + "x" * MAX_FILE_BYTES).detail


def test_a_file_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[[intent]]\ntag = "a.b"\ndescription = "caf\xe9"\n')
    with pytest.raises(DictionaryError) as info:
        load_dictionary(str(path))
    assert (info.value.line, info.value.detail) == (3, "not UTF-8 text")


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DictionaryError) as info:
        load_dictionary(str(tmp_path / "nope.toml"))
    assert info.value.line is None and "cannot read it" in info.value.detail
    assert str(info.value).startswith(f"--intents {tmp_path / 'nope.toml'}: ")


def test_inline_tables_still_name_a_line() -> None:
    # no [[intent]] headers to scan: the line of `intent =` stands in
    exc = refused('intent = [{tag = "a.b"}, {tag = "a.b"}]\n')
    assert exc.line == 1 and "repeated" in exc.detail


def test_a_multiline_string_does_not_fool_the_scanner() -> None:
    text = (
        '[[intent]]\ntag = "a.b"\ndescription = """\n[[intent]]\ntag = "x.y"\n"""\n\n'
        '[[intent]]\ntag = "A"\n'
    )
    assert refused(text).line == 9


# --- strict registrations ----------------------------------------------------------------------


def test_strict_refusal_names_the_tags_and_the_nearest_known_ones() -> None:
    d = parse_dictionary(GOOD)
    exc = strict_refusal(
        d,
        ("weather.lookup", "joke.tell"),
        [
            {"tag": "weather.query", "confidence": 0.5},
            {"tag": "agent.only.tag", "confidence": 0.4},  # registered, not the dictionary's
            {"tag": "note.create", "confidence": 0.1},
        ],
    )
    assert isinstance(exc, UnknownIntent)
    assert exc.fields["intents"] == ["weather.lookup", "joke.tell"]
    assert exc.fields["suggestions"] == [
        {"tag": "weather.query", "confidence": 1.0},  # the alias's own tag first
        {"tag": "note.create", "confidence": 0.1},
    ]
    assert "alias of 'weather.query'" in exc.detail and "nothing was registered" in exc.detail
    plain = strict_refusal(d, ("joke.tell",), [{"tag": "note.create", "confidence": 0.2}])
    assert plain.fields["suggestions"] == [{"tag": "note.create", "confidence": 0.2}]
    assert "nearest: note.create (0.20)" in plain.detail


# --- fuzz: a dictionary or a DictionaryError, nothing else ---------------------------------------

_PIECES = [
    "[[intent]]",
    "[[ intent ]]  # c",
    "[intent]",
    "[intent.x]",
    "[other]",
    'tag = "weather.query"',
    'tag = "weather.lookup"',
    'tag = "Bad Tag"',
    "tag = 3",
    'aliases = ["weather.lookup", "weather.get"]',
    'aliases = ["weather.query"]',
    "aliases = [",
    '  "weather.get",',
    "]",
    'examples = ["x", "成都"]',
    "examples = []",
    'description = """',
    '"""',
    "description = '''multi",
    "'''",
    "deprecated = true",
    "deprecated = 1",
    'replaced_by = "weather.query"',
    'replaced_by = "nothing.here"',
    "hedge_after_ms = 100",
    "hedge_after_ms = -1",
    "intent = []",
    'intent = [{tag = "a.b"}]',
    "x = 1979-05-27T07:32:00Z",
    "# comment",
    "",
    '"quoted key" = 1',
    "a.b.c = 1",
    "\\u0000",
]


def _read(text: str) -> IntentDictionary | DictionaryError:
    """The dictionary of ``text``, or its refusal; any other exception fails the test."""
    try:
        return parse_dictionary(text)
    except DictionaryError as exc:
        return exc


def _check(text: str) -> None:
    d = _read(text)
    if isinstance(d, DictionaryError):
        lines = text.count("\n") + 1
        assert d.line is None or 1 <= d.line <= lines, (d.line, lines)
        assert d.source == "intents"
        return
    for entry in d:  # what was read keeps the invariants
        assert d.canonical(entry.tag) == entry.tag
        for alias in entry.aliases:
            assert d.canonical(alias) == entry.tag and alias not in d


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PIECES), max_size=40))
def test_fuzz_files_of_toml_pieces(pieces: list[str]) -> None:
    _check("\n".join(pieces))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_any_text(text: str) -> None:
    _check(text)


_WORDS = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)
_TAG = st.from_regex(r"[a-z][a-z0-9_]{0,6}(\.[a-z][a-z0-9_-]{0,6}){0,2}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_TAG, st.lists(_TAG, max_size=3), _WORDS), max_size=8))
def test_fuzz_written_dictionaries_read_back_or_are_refused(
    items: list[tuple[str, list[str], str]],
) -> None:
    """Random entries written as TOML: read back as written, or refused for a clash."""
    text = "".join(
        f"[[intent]]\ntag = {json.dumps(tag)}\naliases = {json.dumps(aliases)}\n"
        f"description = {json.dumps(desc, ensure_ascii=False)}\n\n"
        for tag, aliases, desc in items
    )
    d = _read(text)
    if isinstance(d, DictionaryError):
        assert d.line is not None
        assert any(w in d.detail for w in ("repeated", "alias", "tag")), d.detail
        return
    assert [(e.tag, list(e.aliases), e.description) for e in d] == [
        (tag, aliases, desc) for tag, aliases, desc in items
    ]


# --- doctor: the nearest known tags of an unknown one ------------------------------------------


def _diagnostics(suggestions: object) -> dict[str, object]:
    return {
        "ok": True,
        "heartbeat_interval_s": 10.0,
        "degraded_after_s": 10.0,
        "suspect_after_s": 20.0,
        "down_after_s": 30.0,
        "slow_threshold_ms": 2000.0,
        "overhead_reserve_ms": 1000.0,
        "confidence_threshold": 0.8,
        "unrouted_intents": [
            {"intent": "joke.tell", "count": 2, "last_at": 1.0, "suggestions": suggestions}
        ],
    }


def test_doctor_names_the_nearest_known_tags_of_an_unknown_one() -> None:
    near = [{"tag": "fun.joke", "confidence": 0.62}, {"tag": "x", "confidence": True}, "junk"]
    d = Diagnostics.from_answer(_diagnostics(near))
    assert d.unrouted_intents[0].suggestions == (("fun.joke", 0.62),)  # the odd ones left out
    assert Diagnostics.from_answer(_diagnostics(None)).unrouted_intents[0].suggestions == ()
    agents = ({"endpoint_id": "agent://a", "capabilities": ["weather.query"], "status": "healthy"},)
    refusal = {"ok": False, "error": "no_capable_agent", "detail": "no agent declares it"}

    def unserved(route: dict[str, object]) -> list[str]:
        snapshot = Snapshot(
            agents, {"joke.tell": route}, (), 2.0, asked=("joke.tell",), diagnostics=d
        )
        (finding,) = [f for f in diagnose(snapshot) if f.check == "intent_unserved"]
        return [*finding.evidence, finding.next_step]

    # from /v1/diagnostics when the route's answer has none
    lines = unserved(refusal)
    assert any(line.endswith("fun.joke (0.62)") for line in lines), lines
    assert "the nearest known tags are 'fun.joke'" in lines[-1]
    # the route's own suggestions first
    lines = unserved({**refusal, "suggestions": [{"tag": "fun.pun", "confidence": 0.41}]})
    assert any(line.endswith("fun.pun (0.41)") for line in lines), lines
