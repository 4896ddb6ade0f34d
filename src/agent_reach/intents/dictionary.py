"""The intent dictionary: a controlled vocabulary of tags, read from a TOML file.

::

    [[intent]]
    tag = "weather.query"                        # the canonical tag (the v1 tag grammar)
    description = "Current or coming weather for a place and a date"
    aliases = ["weather.lookup", "weather.get"]  # other tags callers may use
    examples = ["what is the weather in Chengdu tomorrow", "成都明天天气怎么样"]
    # deprecated = true
    # replaced_by = "weather.forecast"
    # hedge_after_ms = 300

Invariants:
- A file is read all or nothing: any fault refuses the whole file with
  :class:`~agent_reach.errors.DictionaryError` naming the line at fault (tomllib's own line for
  a file that does not parse; for the other faults, the line of the offending key or value,
  found by a small scan of the raw text, :mod:`.tomllines`). Nothing else escapes
  :func:`parse_dictionary`.
- Every tag and alias follows the tag grammar (:func:`agent_reach.core.names.is_intent`); a tag
  appears once; an alias belongs to one tag and is never a tag itself; ``replaced_by`` names
  another entry's canonical tag, only on a deprecated entry, and never goes round in a circle.
- Bounded: at most :data:`MAX_FILE_BYTES` and :data:`MAX_ENTRIES` entries (both checked before
  the TOML is parsed), and every text field is bounded (:data:`MAX_TEXT_CHARS` and the limits
  next to it).
- An :class:`IntentDictionary` never changes: a reload makes a new one, swapped in whole.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agent_reach.core.names import is_intent
from agent_reach.errors import DictionaryError, UnknownIntent
from agent_reach.intents.tomllines import Layout, toml_line, without_position

__all__ = [
    "EMPTY_DICTIONARY",
    "MAX_ALIASES",
    "MAX_ENTRIES",
    "MAX_EXAMPLES",
    "MAX_FILE_BYTES",
    "MAX_HEDGE_AFTER_MS",
    "MAX_TEXT_CHARS",
    "IntentDictionary",
    "IntentEntry",
    "load_dictionary",
    "parse_dictionary",
    "strict_refusal",
]

MAX_FILE_BYTES = 10 * 1024 * 1024
"""A dictionary file larger than this is refused before it is parsed."""
MAX_ENTRIES = 50_000
"""``[[intent]]`` entries a file holds at most (counted before parsing)."""
MAX_TEXT_CHARS = 2_000
"""Characters of a description, and of each example, at most."""
MAX_EXAMPLES = 100
"""Examples an entry has at most."""
MAX_ALIASES = 100
"""Aliases an entry has at most."""
MAX_HEDGE_AFTER_MS = 600_000
"""``hedge_after_ms`` at most (ten minutes; 0 means "after the intent's measured p95")."""

_KEYS = (
    "tag",
    "description",
    "aliases",
    "examples",
    "deprecated",
    "replaced_by",
    "hedge_after_ms",
)


@dataclass(frozen=True, slots=True)
class IntentEntry:
    """One ``[[intent]]`` of the dictionary: a canonical tag and what describes it.

    ``hedge_after_ms`` opts the tag into hedged requests (:mod:`agent_reach.gateway.hedge`):
    None, no hedging; N > 0, a second attempt to another candidate when the first has not
    answered after N ms; 0, after the intent's measured p95 instead.
    """

    tag: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    deprecated: bool = False
    replaced_by: str | None = None
    hedge_after_ms: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class IntentDictionary:
    """The dictionary in force: its entries by canonical tag (file order) and its aliases.

    Immutable; a reload makes a new one. ``path`` is the file it was read from (None for the
    empty dictionary, or one parsed from text).
    """

    path: str | None
    entries: Mapping[str, IntentEntry]
    _aliases: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, entries: Mapping[str, IntentEntry], path: str | None = None) -> IntentDictionary:
        """A dictionary of already checked ``entries`` (their aliases indexed)."""
        aliases = {alias: tag for tag, e in entries.items() for alias in e.aliases}
        return cls(path, MappingProxyType(dict(entries)), MappingProxyType(aliases))

    def canonical(self, tag: str) -> str | None:
        """``tag`` itself when it is an entry's tag, its entry's tag when it is an alias, else
        None."""
        if tag in self.entries:
            return tag
        return self._aliases.get(tag)

    def texts(self, tag: str) -> tuple[str, ...]:
        """The description (when not empty) and the examples of the entry ``tag`` (``()`` for a
        tag that is not an entry's)."""
        entry = self.entries.get(tag)
        if entry is None:
            return ()
        head = (entry.description,) if entry.description else ()
        return head + entry.examples

    @property
    def aliases(self) -> Mapping[str, str]:
        """Every alias -> its canonical tag."""
        return self._aliases

    def tags(self) -> tuple[str, ...]:
        """The canonical tags, in file order."""
        return tuple(self.entries)

    def __contains__(self, tag: object) -> bool:
        """Whether ``tag`` is an entry's canonical tag (an alias is not)."""
        return tag in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[IntentEntry]:
        return iter(self.entries.values())

    def __eq__(self, other: object) -> bool:
        """Same entries, in the same order (the path is not compared)."""
        if not isinstance(other, IntentDictionary):
            return NotImplemented
        return list(self.entries.items()) == list(other.entries.items())

    def __hash__(self) -> int:
        return hash(tuple(self.entries))


EMPTY_DICTIONARY = IntentDictionary.of({})
"""No dictionary (``serve`` without ``--intents``)."""


def strict_refusal(
    dictionary: IntentDictionary, unknown: Sequence[str], near: Sequence[Mapping[str, Any]]
) -> UnknownIntent:
    """What a strict dictionary answers a registration declaring the tags ``unknown`` (not
    canonical tags of it): ``intents`` and at most 3 ``suggestions`` (``{"tag", "confidence"}``,
    best first). ``near`` are a matcher's nearest tags to the first unknown one; only the
    dictionary's are kept, after the canonical tag when that one is an alias (confidence 1)."""
    first = unknown[0]
    canonical = dictionary.canonical(first)
    suggestions = [{"tag": canonical, "confidence": 1.0}] if canonical is not None else []
    suggestions += [
        {"tag": s["tag"], "confidence": s["confidence"]}
        for s in near
        if s.get("tag") in dictionary and s.get("tag") != canonical
    ]
    suggestions = suggestions[:3]
    if canonical is not None:
        hint = f"{first!r} is an alias of {canonical!r}: declare {canonical!r}"
    elif suggestions:
        hint = "nearest: " + ", ".join(f"{s['tag']} ({s['confidence']:.2f})" for s in suggestions)
    else:
        hint = "GET /v1/intents lists the dictionary's tags"
    listed = ", ".join(repr(t) for t in unknown)
    which = "is not a canonical tag" if len(unknown) == 1 else "are not canonical tags"
    return UnknownIntent(
        f"the intent dictionary is strict and {listed} {which} of it; nothing was registered"
        f" ({hint})",
        intents=list(unknown),
        suggestions=suggestions,
    )


# --- reading -----------------------------------------------------------------------------------


def load_dictionary(path: str) -> IntentDictionary:
    """Read and check the dictionary file ``path``; DictionaryError naming the line at fault.

    A file over :data:`MAX_FILE_BYTES` is refused without reading it all.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise DictionaryError(
            f"cannot read it: {exc.strerror or exc}", path=path, line=None
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise DictionaryError(
            f"the file is over {MAX_FILE_BYTES // (1024 * 1024)} MB", path=path, line=None
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DictionaryError("not UTF-8 text", path=path, line=line) from None
    return parse_dictionary(text, source=path)


def parse_dictionary(text: str, source: str = "<text>") -> IntentDictionary:
    """The dictionary of the TOML ``text``; DictionaryError (``path`` = ``source``) naming the
    line at fault."""
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise DictionaryError(
            f"the file is over {MAX_FILE_BYTES // (1024 * 1024)} MB", path=source, line=None
        )
    layout = Layout(text)
    if len(layout.tables) > MAX_ENTRIES:  # counted before the TOML is parsed
        raise DictionaryError(
            f"more than {MAX_ENTRIES} [[intent]] entries",
            path=source,
            line=layout.tables[MAX_ENTRIES].line,
        )
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DictionaryError(
            f"not valid TOML: {without_position(str(exc))}",
            path=source,
            line=toml_line(str(exc), text),
        ) from None
    except RecursionError:
        raise DictionaryError("not valid TOML: nested too deeply", path=source, line=None) from None
    except ValueError as exc:  # a number tomllib will not convert (too many digits)
        raise DictionaryError(f"not valid TOML: {exc}", path=source, line=None) from None
    return _Checker(doc, layout, source).run()


# --- checking what tomllib read ----------------------------------------------------------------


class _Checker:
    """Checks the parsed document entry by entry, then across entries; raises at the first
    fault, with its line."""

    def __init__(self, doc: dict[str, Any], layout: Layout, source: str) -> None:
        self.doc = doc
        self.layout = layout
        self.source = source

    def fail(self, detail: str, line: int | None) -> DictionaryError:
        return DictionaryError(detail, path=self.source, line=line)

    def run(self) -> IntentDictionary:
        for key in self.doc:
            if key != "intent":
                raise self.fail(
                    f"unknown key {key!r}: a dictionary holds only [[intent]] tables",
                    self.layout.top.get(key),
                )
        items = self.doc.get("intent", [])
        if not isinstance(items, list):
            raise self.fail(
                "intent must be an array of tables: write each entry as [[intent]]",
                self.layout.top.get("intent"),
            )
        if len(items) > MAX_ENTRIES:
            raise self.fail(f"more than {MAX_ENTRIES} [[intent]] entries", None)
        entries: dict[str, IntentEntry] = {}
        where: dict[str, int] = {}  # tag or alias -> the entry index that holds it
        for index, item in enumerate(items):
            entry = self.entry(index, item)
            self.place(index, entry, entries, where)
            entries[entry.tag] = entry
            where[entry.tag] = index
        self.replacements(entries, where)
        return IntentDictionary.of(entries, self.source)

    def entry(self, index: int, item: Any) -> IntentEntry:
        at = self.layout.key_line
        if not isinstance(item, dict):
            raise self.fail(
                f"entry {index + 1} is not a table: write it as [[intent]]", at(index, "")
            )
        for key in item:
            if key not in _KEYS:
                raise self.fail(
                    f"unknown key {key!r} (an [[intent]] takes {', '.join(_KEYS)})",
                    at(index, key),
                )
        if "tag" not in item:
            raise self.fail("an [[intent]] without a tag", at(index, ""))
        tag = self.tag(index, "tag", item["tag"])
        description = item.get("description", "")
        if not isinstance(description, str):
            raise self.fail(f"{tag}: description must be a string", at(index, "description"))
        if len(description) > MAX_TEXT_CHARS:
            raise self.fail(
                f"{tag}: description is over {MAX_TEXT_CHARS} characters",
                at(index, "description"),
            )
        aliases = self.strings(index, tag, "aliases", item.get("aliases", []), MAX_ALIASES)
        for alias in aliases:
            self.tag(index, "aliases", alias, value_line=True)
        examples = self.strings(index, tag, "examples", item.get("examples", []), MAX_EXAMPLES)
        for example in examples:
            if not example.strip():
                raise self.fail(f"{tag}: an empty example", at(index, "examples"))
            if len(example) > MAX_TEXT_CHARS:
                raise self.fail(
                    f"{tag}: an example is over {MAX_TEXT_CHARS} characters",
                    self.layout.value_line(index, "examples", example),
                )
        deprecated = item.get("deprecated", False)
        if not isinstance(deprecated, bool):
            raise self.fail(f"{tag}: deprecated must be true or false", at(index, "deprecated"))
        replaced_by = item.get("replaced_by")
        if replaced_by is not None:
            replaced_by = self.tag(index, "replaced_by", replaced_by)
            if not deprecated:
                raise self.fail(
                    f"{tag}: replaced_by is for deprecated entries (add deprecated = true)",
                    at(index, "replaced_by"),
                )
        hedge = item.get("hedge_after_ms")
        if hedge is not None and (
            isinstance(hedge, bool)
            or not isinstance(hedge, int)
            or not 0 <= hedge <= MAX_HEDGE_AFTER_MS
        ):
            number = isinstance(hedge, int | float) and not isinstance(hedge, bool)
            raise self.fail(
                f"{tag}: hedge_after_ms must be a whole number of milliseconds from 0 to "
                f"{MAX_HEDGE_AFTER_MS} (0: after the intent's measured p95), not "
                f"{repr(hedge)[:40] if number else _kind(hedge)}",
                at(index, "hedge_after_ms"),
            )
        return IntentEntry(tag, description, aliases, examples, deprecated, replaced_by, hedge)

    def tag(self, index: int, key: str, value: Any, *, value_line: bool = False) -> str:
        """``value`` as a tag of the grammar, or the refusal at its line."""
        if not isinstance(value, str):
            raise self.fail(
                f"{key} must be a string (a tag), not {_kind(value)}",
                self.layout.key_line(index, key),
            )
        if not is_intent(value):
            what = "alias" if key == "aliases" else key
            raise self.fail(
                f"{what} {value[:140]!r} is not a valid tag: dot-separated segments, each a "
                "lower-case letter then letters, digits, _ or -, at most 128 characters",
                self.layout.value_line(index, key, value)
                if value_line
                else self.layout.key_line(index, key),
            )
        return value

    def strings(self, index: int, tag: str, key: str, value: Any, limit: int) -> tuple[str, ...]:
        """``value`` as a list of at most ``limit`` strings, or the refusal at its line."""
        line = self.layout.key_line(index, key)
        if not isinstance(value, list):
            raise self.fail(f"{tag}: {key} must be a list of strings, not {_kind(value)}", line)
        if len(value) > limit:
            raise self.fail(f"{tag}: more than {limit} {key}", line)
        for item in value:
            if not isinstance(item, str):
                raise self.fail(f"{tag}: {key} must hold strings only, not {_kind(item)}", line)
        return tuple(value)

    def place(
        self,
        index: int,
        entry: IntentEntry,
        entries: Mapping[str, IntentEntry],
        where: dict[str, int],
    ) -> None:
        """Refuse a tag or alias that clashes with one seen before (or in this entry)."""
        tag = entry.tag
        if tag in entries:
            first = self.layout.key_line(where[tag], "tag")
            raise self.fail(
                f"tag {tag!r} is repeated (first at line {first})",
                self.layout.key_line(index, "tag"),
            )
        if tag in where:  # an alias of an earlier entry
            raise self.fail(
                f"tag {tag!r} is also an alias of {self.owner(where[tag], entries)!r}",
                self.layout.key_line(index, "tag"),
            )
        seen: set[str] = set()
        for alias in entry.aliases:
            why = None
            if alias == tag:
                why = f"alias {alias!r} is the entry's own tag"
            elif alias in seen:
                why = f"{tag}: alias {alias!r} is repeated"
            elif alias in entries:
                why = f"alias {alias!r} of {tag!r} is also a tag"
            elif alias in where:
                why = (
                    f"alias {alias!r} is given to two tags: "
                    f"{self.owner(where[alias], entries)!r} and {tag!r}"
                )
            if why is not None:  # the line is looked for only now: it costs a scan
                raise self.fail(why, self.layout.value_line(index, "aliases", alias))
            seen.add(alias)
        for alias in entry.aliases:
            where[alias] = index

    @staticmethod
    def owner(index: int, entries: Mapping[str, IntentEntry]) -> str:
        return list(entries)[index]

    def replacements(self, entries: Mapping[str, IntentEntry], where: Mapping[str, int]) -> None:
        """Every ``replaced_by`` names another entry, and following them never loops."""
        for tag, entry in entries.items():
            target = entry.replaced_by
            if target is None:
                continue
            line = self.layout.key_line(where[tag], "replaced_by")
            if target == tag:
                raise self.fail(f"{tag}: replaced_by names the entry itself", line)
            if target not in entries:
                hint = ""
                if target in where:
                    hint = f" ({target!r} is an alias of {self.owner(where[target], entries)!r})"
                raise self.fail(
                    f"{tag}: replaced_by {target!r} names no entry of the dictionary{hint}", line
                )
            seen = {tag}
            while target is not None:
                if target in seen:
                    raise self.fail(f"{tag}: replaced_by goes round in a circle", line)
                seen.add(target)
                target = entries[target].replaced_by


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)
