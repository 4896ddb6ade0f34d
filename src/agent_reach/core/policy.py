"""Least-privilege access policy: who may reach which intents, and who may claim them.

The policy is a small TOML file (parsed with :mod:`tomllib`)::

    version = 1                              # optional; if present, 1

    [[reach]]                                # who may send to which intents
    senders = ["agent://scheduler-*"]        # endpoint patterns, matched against the sender id
    intents = ["weather.*", "note.create"]   # intent patterns
    endpoints = ["agent://weather-*"]        # optional: the recipients allowed (absent = any)

    [[claim]]                                # which endpoint ids may register which intents
    endpoints = ["agent://weather-*"]
    intents = ["weather.*"]

Invariants:
- Deny by default: a request is allowed only when a rule says so; an empty file denies all.
- Pattern grammar: ``*`` matches any run of characters (dots included), everything else is
  literal and the whole value must match. Intent patterns use ``[a-z0-9_.*-]{1,128}``; endpoint
  patterns are ``agent://`` followed by ``[a-z0-9._*-]{1,128}``, or the bare ``*``.
- Parsing is all or nothing: any unknown key, wrong type, empty list or invalid pattern raises
  :class:`PolicyFileError` naming the source and, where it can be found, the line.
- Every :class:`Decision` carries a human sentence, also when it allows.
- Matching never backtracks: a pattern is split at its stars once, at parse time, and matched
  by ordered substring search, so a hostile value cannot make a check slow.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from agent_reach.errors import PolicyFileError

__all__ = [
    "ClaimRule",
    "Decision",
    "Pattern",
    "PatternKind",
    "Policy",
    "PolicyFileError",
    "ReachRule",
    "compile_pattern",
    "locate_line",
    "matches_any",
    "parse_policy",
    "scope_allows",
]

PatternKind = Literal["intent", "endpoint"]

_INTENT_PATTERN = re.compile(r"[a-z0-9_.*-]{1,128}")
# agent://NAME or agent://NAME@DOMAIN (a sender forwarded from another domain: federation)
_ENDPOINT_PATTERN = re.compile(r"agent://[a-z0-9._*-]{1,128}(@[a-z0-9._*-]{1,128})?|\*")
_GRAMMAR = {
    "intent": "1-128 of a-z 0-9 _ . - and * (any run of characters)",
    "endpoint": (
        "agent:// followed by 1-128 of a-z 0-9 . _ - and * (any run of characters), "
        "optionally @ and a domain pattern of the same, or * alone for any endpoint"
    ),
}
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Pattern:
    """A validated intent or endpoint pattern; ``*`` matches any run of characters.

    Constructing one validates ``text`` (``ValueError`` naming it when invalid).
    """

    text: str
    kind: PatternKind
    _parts: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # an endpoint pattern that names no domain matches this domain's ids only: ``*`` never
    # stretches over the ``@DOMAIN`` of a forwarded sender (``*`` alone matches any id)
    _local: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grammar = _INTENT_PATTERN if self.kind == "intent" else _ENDPOINT_PATTERN
        if not isinstance(self.text, str) or grammar.fullmatch(self.text) is None:
            raise ValueError(
                f"invalid {self.kind} pattern {self.text!r}: use {_GRAMMAR[self.kind]}"
            )
        object.__setattr__(self, "_parts", tuple(self.text.split("*")))
        local = self.kind == "endpoint" and self.text != "*" and "@" not in self.text
        object.__setattr__(self, "_local", local)

    def matches(self, value: str) -> bool:
        """True when the whole of ``value`` matches this pattern."""
        if self._local and "@" in value:
            return False
        parts = self._parts
        if len(parts) == 1:
            return value == parts[0]
        first, last = parts[0], parts[-1]
        end = len(value) - len(last)
        if end < len(first) or not value.startswith(first) or not value.endswith(last):
            return False
        pos = len(first)
        for middle in parts[1:-1]:
            # leftmost match of each middle piece is always the best choice with only ``*``
            found = value.find(middle, pos, end)
            if found < 0:
                return False
            pos = found + len(middle)
        return True


def compile_pattern(pattern: str, kind: PatternKind) -> Pattern:
    """Validate and prepare ``pattern`` of ``kind``; ``ValueError`` naming it when invalid."""
    return Pattern(pattern, kind)


def matches_any(patterns: Iterable[Pattern], value: str) -> bool:
    """True when at least one of ``patterns`` matches ``value``."""
    return any(p.matches(value) for p in patterns)


def _texts(patterns: Iterable[Pattern]) -> str:
    return ", ".join(p.text for p in patterns)


@dataclass(frozen=True, slots=True)
class Decision:
    """An allow/deny answer with the reason as a sentence (also when allowed)."""

    allowed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class ReachRule:
    """One ``[[reach]]`` rule; ``number`` counts from 1 in file order.

    ``endpoints`` is None when the rule does not restrict the recipients.
    """

    number: int
    senders: tuple[Pattern, ...]
    intents: tuple[Pattern, ...]
    endpoints: tuple[Pattern, ...] | None = None

    def applies(self, sender: str, intent: str) -> bool:
        """True when this rule matches both ``sender`` and ``intent``."""
        return matches_any(self.senders, sender) and matches_any(self.intents, intent)


@dataclass(frozen=True, slots=True)
class ClaimRule:
    """One ``[[claim]]`` rule; ``number`` counts from 1 in file order."""

    number: int
    endpoints: tuple[Pattern, ...]
    intents: tuple[Pattern, ...]


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed policy: the rules in file order and a digest of the text they came from.

    Decisions of :meth:`may_reach` and :meth:`allowed_endpoints` (both on every send) are
    memoized in small bounded caches (cleared when over 4096 entries); they hold only pure
    results, so they never change an answer.
    """

    reach: tuple[ReachRule, ...] = ()
    claim: tuple[ClaimRule, ...] = ()
    digest: str = ""
    _cache: dict[tuple[str, str], Decision] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )
    _recipients: dict[tuple[str, str], tuple[Callable[[str], bool] | None]] = field(
        init=False, default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def empty(cls) -> Policy:
        """A policy with no rules: denies everything."""
        return cls(digest=_digest(""))

    def summary(self) -> str:
        """Short text for a log line: ``"2 reach rules, 1 claim rule, sha256 1a2b3c4d5e6f"``."""
        return (
            f"{_count(len(self.reach), 'reach rule')}, {_count(len(self.claim), 'claim rule')}, "
            f"sha256 {self.digest}"
        )

    def may_reach(self, sender: str, intent: str) -> Decision:
        """Whether some ``[[reach]]`` rule lets ``sender`` send ``intent`` (to any recipient)."""
        key = (sender, intent)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        decision = self._may_reach(sender, intent)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key] = decision
        return decision

    def _may_reach(self, sender: str, intent: str) -> Decision:
        for rule in self.reach:
            if rule.applies(sender, intent):
                return Decision(
                    True, f"[[reach]] rule #{rule.number} allows {sender} to send {intent!r}"
                )
        if not self.reach:
            return Decision(
                False,
                f"{sender} may not send {intent!r}: the policy has no [[reach]] rules, "
                "so it denies everything",
            )
        return Decision(False, f"no [[reach]] rule allows {sender} to send {intent!r}")

    def allowed_endpoints(self, sender: str, intent: str) -> Callable[[str], bool] | None:
        """The recipients ``sender`` may send ``intent`` to: None for any, else a predicate.

        None when some rule matching (sender, intent) has no ``endpoints``; otherwise true for
        endpoint ids matched by the ``endpoints`` of at least one matching rule (always false
        when no rule matches: call :meth:`may_reach` first).
        """
        key = (sender, intent)
        cached = self._recipients.get(key)
        if cached is not None:
            return cached[0]
        found = self._allowed_endpoints(sender, intent)
        if len(self._recipients) >= _CACHE_MAX:
            self._recipients.clear()
        self._recipients[key] = (found,)
        return found

    def _allowed_endpoints(self, sender: str, intent: str) -> Callable[[str], bool] | None:
        allowed: list[Pattern] = []
        for rule in self.reach:
            if rule.applies(sender, intent):
                if rule.endpoints is None:
                    return None
                allowed.extend(rule.endpoints)
        patterns = tuple(allowed)
        return lambda endpoint_id: matches_any(patterns, endpoint_id)

    def may_deliver(self, sender: str, intent: str, endpoint_id: str) -> Decision:
        """Whether ``sender`` may send ``intent`` to the endpoint ``endpoint_id``."""
        reach = self.may_reach(sender, intent)
        if not reach.allowed:
            return reach
        restricted: list[ReachRule] = []
        for rule in self.reach:
            if not rule.applies(sender, intent):
                continue
            if rule.endpoints is None or matches_any(rule.endpoints, endpoint_id):
                return Decision(
                    True,
                    f"[[reach]] rule #{rule.number} allows {sender} to send {intent!r} "
                    f"to {endpoint_id}",
                )
            restricted.append(rule)
        numbers = ", ".join(f"#{r.number}" for r in restricted)
        recipients = ", ".join(dict.fromkeys(p.text for r in restricted for p in r.endpoints or ()))
        return Decision(
            False,
            f"{sender} may send {intent!r} only to {recipients} ([[reach]] rule {numbers}), "
            f"not to {endpoint_id}",
        )

    def may_claim(self, endpoint_id: str, intents: Sequence[str]) -> Decision:
        """Whether ``endpoint_id`` may register every one of ``intents``.

        The reason names the first intent refused. An empty ``intents`` is allowed.
        """
        numbers: dict[int, None] = {}
        for intent in intents:
            rule = next(
                (
                    r
                    for r in self.claim
                    if matches_any(r.endpoints, endpoint_id) and matches_any(r.intents, intent)
                ),
                None,
            )
            if rule is None:
                return Decision(False, f"no [[claim]] rule lets {endpoint_id} claim {intent!r}")
            numbers[rule.number] = None
        if not numbers:
            return Decision(True, f"{endpoint_id} claims no intents")
        rules = ", ".join(f"#{n}" for n in numbers)
        return Decision(
            True,
            f"[[claim]] rule {rules} allows {endpoint_id} to claim "
            f"{_count(len(intents), 'intent')}",
        )


def scope_allows(
    endpoint_patterns: Sequence[str],
    intent_patterns: Sequence[str],
    endpoint_id: str,
    intents: Sequence[str],
) -> Decision:
    """Whether an enrollment token's scope lets ``endpoint_id`` register ``intents``.

    The id must match one of ``endpoint_patterns`` and every intent one of
    ``intent_patterns`` (deny by default: empty scopes allow nothing). ``ValueError`` when a
    pattern is invalid.
    """
    endpoints = tuple(compile_pattern(p, "endpoint") for p in endpoint_patterns)
    allowed = tuple(compile_pattern(p, "intent") for p in intent_patterns)
    if not matches_any(endpoints, endpoint_id):
        scope = _texts(endpoints) or "no endpoints"
        return Decision(False, f"{endpoint_id} is outside the token's endpoint scope ({scope})")
    for intent in intents:
        if not matches_any(allowed, intent):
            scope = _texts(allowed) or "no intents"
            return Decision(False, f"intent {intent!r} is outside the token's scope ({scope})")
    return Decision(
        True, f"the token's scope allows {endpoint_id} to claim {_count(len(intents), 'intent')}"
    )


# --- parsing ------------------------------------------------------------------------------------

_TOP_KEYS = ("version", "reach", "claim")
_RULE_KEYS: dict[str, tuple[tuple[str, PatternKind, bool], ...]] = {
    # key, pattern kind, required
    "reach": (
        ("senders", "endpoint", True),
        ("intents", "intent", True),
        ("endpoints", "endpoint", False),
    ),
    "claim": (("endpoints", "endpoint", True), ("intents", "intent", True)),
}
_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")
_HEADER = re.compile(r"""^\s*\[\[?\s*[A-Za-z0-9_\-."' ]+\]\]?\s*(?:#.*)?$""")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _show(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _key_line(key: str) -> re.Pattern[str]:
    k = re.escape(key)
    return re.compile(rf"""^\s*(?:{k}|"{k}"|'{k}')\s*=""")


def locate_line(
    text: str, table: str | None = None, index: int = 1, key: str | None = None
) -> int | None:
    """The 1-based line of ``key`` in the ``index``-th ``[[table]]``, or of a top-level key.

    With ``table``: the first ``key = `` line after the ``index``-th ``[[table]]`` header and
    before the next header, else the header line itself. Without: the first ``key = `` line
    before any header, else a ``[key]``/``[[key]]`` header. None when nothing is found.
    """
    lines = text.split("\n")  # tomllib counts lines by "\n" too
    if table is None:
        if key is None:
            return None
        wanted = _key_line(key)
        for i, line in enumerate(lines):
            if _HEADER.match(line):
                break
            if wanted.match(line):
                return i + 1
        table_header = re.compile(rf"^\s*\[\[?\s*{re.escape(key)}\s*[\].]")
        return next((i + 1 for i, line in enumerate(lines) if table_header.match(line)), None)
    header = re.compile(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]")
    starts = [i for i, line in enumerate(lines) if header.match(line)]
    if len(starts) < index:
        return locate_line(text, None, key=table)  # written inline: ``reach = [{...}]``
    start = starts[index - 1]
    if key is not None:
        wanted = _key_line(key)
        for j in range(start + 1, len(lines)):
            if _HEADER.match(lines[j]):
                break
            if wanted.match(lines[j]):
                return j + 1
    return start + 1


def parse_policy(text: str, source: str = "policy") -> Policy:
    """Parse and validate a policy file's text; :class:`PolicyFileError` on any problem.

    ``source`` names the file in error messages.
    """

    def fail(
        detail: str, table: str | None = None, index: int = 1, key: str | None = None
    ) -> PolicyFileError:
        return PolicyFileError(detail, source=source, line=locate_line(text, table, index, key))

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        line = int(found.group(1)) if found else None
        raise PolicyFileError(str(exc), source=source, line=line) from None

    for key in data:
        if key not in _TOP_KEYS:
            raise fail(
                f"unknown top-level key {key!r} (expected one of {', '.join(_TOP_KEYS)})", key=key
            )
    if "version" in data:
        version = data["version"]
        if type(version) is not int or version != 1:
            raise fail(f"'version' must be 1, got {_show(version)}", key="version")

    rules: dict[str, list[dict[str, tuple[Pattern, ...]]]] = {"reach": [], "claim": []}
    for table, spec in _RULE_KEYS.items():
        raw = data.get(table, [])
        if not isinstance(raw, list):
            raise fail(
                f"'{table}' must be an array of tables written [[{table}]], got {_show(raw)}",
                key=table,
            )
        known = [k for k, _, _ in spec]
        for number, rule in enumerate(raw, start=1):
            where = f"[[{table}]] #{number}"
            if not isinstance(rule, dict):
                raise fail(f"{where} must be a table, got {_show(rule)}", key=table)
            for key in rule:
                if key not in known:
                    raise fail(
                        f"{where}: unknown key {key!r} (expected one of {', '.join(known)})",
                        table,
                        number,
                        key,
                    )
            parsed: dict[str, tuple[Pattern, ...]] = {}
            for key, kind, required in spec:
                if key not in rule:
                    if required:
                        raise fail(f"{where}: missing required key {key!r}", table, number)
                    continue
                value = rule[key]
                if (
                    not isinstance(value, list)
                    or not value
                    or not all(isinstance(v, str) for v in value)
                ):
                    raise fail(
                        f"{where}: {key!r} must be a non-empty list of {kind} patterns, "
                        f"got {_show(value)}",
                        table,
                        number,
                        key,
                    )
                try:
                    parsed[key] = tuple(compile_pattern(v, kind) for v in value)
                except ValueError as exc:
                    raise fail(f"{where}: {key!r}: {exc}", table, number, key) from None
            rules[table].append(parsed)

    reach = tuple(
        ReachRule(n, r["senders"], r["intents"], r.get("endpoints"))
        for n, r in enumerate(rules["reach"], start=1)
    )
    claim = tuple(
        ClaimRule(n, r["endpoints"], r["intents"]) for n, r in enumerate(rules["claim"], start=1)
    )
    return Policy(reach=reach, claim=claim, digest=_digest(text))
