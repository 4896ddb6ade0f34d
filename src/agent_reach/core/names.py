"""Names: the grammar of endpoint ids and intent tags.

Invariants:
- An endpoint id is ``agent://NAME`` with NAME matching ``[a-z0-9][a-z0-9._-]{0,127}``.
- An intent tag is dot-separated segments, each ``[a-z][a-z0-9_-]*``, at most 128 characters.
- Exact matching is on the whole tag, case-sensitive. Fallback matchers (consulted only when
  no endpoint declares the tag exactly) live in :mod:`agent_reach.intents`.
"""

from __future__ import annotations

import re

__all__ = [
    "ENDPOINT_ID_PATTERN",
    "INTENT_PATTERN",
    "is_endpoint_id",
    "is_intent",
]

# \Z, not $: "$" also matches before a trailing newline ("agent://x\n" must not pass)
ENDPOINT_ID_PATTERN = r"^agent://[a-z0-9][a-z0-9._-]{0,127}\Z"
INTENT_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*\Z"
INTENT_MAX_LEN = 128

_ENDPOINT_ID = re.compile(ENDPOINT_ID_PATTERN)
_INTENT = re.compile(INTENT_PATTERN)


def is_endpoint_id(value: str) -> bool:
    """True when ``value`` is a well-formed ``agent://NAME`` id."""
    return _ENDPOINT_ID.match(value) is not None


def is_intent(value: str) -> bool:
    """True when ``value`` is a well-formed intent tag."""
    return len(value) <= INTENT_MAX_LEN and _INTENT.match(value) is not None
