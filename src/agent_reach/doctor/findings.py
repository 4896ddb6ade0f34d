"""What the doctor reports: :class:`Finding` s and their :class:`Severity`. Pure values."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Finding", "Severity", "count", "worst"]


class Severity(enum.StrEnum):
    """How bad a finding is, best first."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """0 for ok up to 3 for error."""
        return _RANK[self]


_RANK = {Severity.OK: 0, Severity.INFO: 1, Severity.WARNING: 2, Severity.ERROR: 3}


@dataclass(frozen=True, slots=True)
class Finding:
    """One result of the checklist: what was checked, how bad, the numbers, and what to do."""

    check: str  # the checklist item: empty_registry, intent_unserved, unrouted_agent, ...
    severity: Severity
    title: str
    evidence: tuple[str, ...]  # lines for a person, with the numbers
    next_step: str
    subject: str = ""  # the endpoint id or intent concerned ("" for the whole gateway)


def worst(findings: Iterable[Finding]) -> Severity:
    """The highest severity among ``findings`` (ok for none)."""
    return max((f.severity for f in findings), key=_RANK.__getitem__, default=Severity.OK)


def count(x: float) -> str:
    """A counter's value as evidence writes it (whole numbers)."""
    return f"{x:.0f}"
