"""Where things are in a TOML text: line numbers for the dictionary's refusals.

tomllib reports a line only for a file that does not parse; for a fault in what it read (a
repeated tag, a bad alias) :mod:`agent_reach.intents.dictionary` names the line of the key or
value at fault, found here by a small scan of the raw text: the ``[[intent]]`` table starts and
the key lines under each. Only a guide to line numbers: tomllib decides what the file means,
and a line not found falls back to the entry's header (or None).

Invariants: pure, and total: any text scans without raising.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Layout", "Table", "toml_line", "without_position"]

_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_TOML_POSITION = re.compile(r"\s*\((at line \d+, column \d+|at end of document)\)\s*$")
_ENTRY_HEADER = re.compile(r"\[\[\s*intent\s*\]\]\s*(#.*)?$")
_OTHER_HEADER = re.compile(r"\[")
_KEY_LINE = re.compile(r"""([A-Za-z0-9_-]+|"[^"\\]*"|'[^']*')\s*(\.|=)""")


def toml_line(message: str, text: str) -> int:
    """The line of a TOMLDecodeError's ``message`` (the last line for "at end of document")."""
    match = _TOML_LINE.search(message)
    if match is not None:
        return int(match.group(1))
    return max(1, text.rstrip("\n").count("\n") + 1)  # "at end of document": the last line


def without_position(message: str) -> str:
    """A TOMLDecodeError's ``message`` without its "(at line N, column M)"."""
    return _TOML_POSITION.sub("", message)


@dataclass(slots=True)
class Table:
    """One ``[[intent]]`` table of the raw text: its header line, its key lines, and the
    lines it spans."""

    line: int
    end: int = 0  # the last line that belongs to it
    keys: dict[str, int] = field(default_factory=dict)


class Layout:
    """A scan of the raw text: the ``[[intent]]`` headers and the key lines under each, and
    the top-level keys. Only a guide to line numbers: tomllib decides what the file means."""

    def __init__(self, text: str) -> None:
        # TOML lines end at "\n" only (str.splitlines would also split at \x0c, \u2028, ...)
        self.lines = [line.removesuffix("\r") for line in text.split("\n")]
        self.tables: list[Table] = []
        self.top: dict[str, int] = {}  # top-level key (or table name) -> its first line
        current: Table | None = None
        in_string: str | None = None  # the delimiter of a multi-line string we are inside
        for number, raw in enumerate(self.lines, 1):
            if in_string is not None:
                if raw.count(in_string) % 2 == 1:
                    in_string = None
                continue
            line = raw.strip()
            if _ENTRY_HEADER.match(line):
                if current is not None:
                    current.end = number - 1
                current = Table(number)
                self.tables.append(current)
            elif _OTHER_HEADER.match(line):
                if current is not None:
                    current.end = number - 1
                current = None
                path = [p.strip("\"' \t") for p in line.split("#")[0].strip("[] \t").split(".")]
                self.top.setdefault(path[0], number)
                if path[0] == "intent" and len(path) > 1 and self.tables:
                    self.tables[-1].keys.setdefault(path[1], number)  # [intent.X]: X of the last
            else:
                key = _KEY_LINE.match(line)
                if key is not None:
                    name = key.group(1).strip("\"'")
                    (current.keys if current is not None else self.top).setdefault(name, number)
            for delimiter in ('"""', "'''"):
                if raw.count(delimiter) % 2 == 1:
                    in_string = delimiter
                    break
        if current is not None:
            current.end = len(self.lines)

    def table(self, index: int) -> Table | None:
        """The ``index``-th ``[[intent]]`` table (None when the scan did not see it: an
        array of inline tables, say)."""
        return self.tables[index] if index < len(self.tables) else None

    def key_line(self, index: int, key: str) -> int | None:
        """The line of ``key`` in the ``index``-th entry (its header's when not found)."""
        table = self.table(index)
        if table is None:
            return self.top.get("intent")
        return table.keys.get(key, table.line)

    def value_line(self, index: int, key: str, value: str) -> int | None:
        """The line holding the string ``value`` of ``key`` (an alias in a list spread over
        lines), from the key's line to the end of the entry; the key's line when not found."""
        start = self.key_line(index, key)
        table = self.table(index)
        if start is None or table is None:
            return start
        quoted = (f'"{value}"', f"'{value}'")
        for number in range(start, table.end + 1):
            if any(q in self.lines[number - 1] for q in quoted):
                return number
        return start
