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
    "DOMAIN_PATTERN",
    "ENDPOINT_ID_PATTERN",
    "INTENT_PATTERN",
    "TARGET_ID_PATTERN",
    "is_domain",
    "is_endpoint_id",
    "is_intent",
    "qualified",
    "split_domain",
]

# \Z, not $: "$" also matches before a trailing newline ("agent://x\n" must not pass)
ENDPOINT_ID_PATTERN = r"^agent://[a-z0-9][a-z0-9._-]{0,127}\Z"
INTENT_PATTERN = r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*\Z"
INTENT_MAX_LEN = 128
# a domain (--domain, federation) is named as an endpoint NAME is
DOMAIN_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}\Z"
# an endpoint of this domain or of another: agent://NAME[@DOMAIN]
TARGET_ID_PATTERN = r"^agent://[a-z0-9][a-z0-9._-]{0,127}(@[a-z0-9][a-z0-9._-]{0,127})?\Z"

_ENDPOINT_ID = re.compile(ENDPOINT_ID_PATTERN)
_INTENT = re.compile(INTENT_PATTERN)
_DOMAIN = re.compile(DOMAIN_PATTERN)


def is_endpoint_id(value: str) -> bool:
    """True when ``value`` is a well-formed ``agent://NAME`` id."""
    return _ENDPOINT_ID.match(value) is not None


def is_intent(value: str) -> bool:
    """True when ``value`` is a well-formed intent tag."""
    return len(value) <= INTENT_MAX_LEN and _INTENT.match(value) is not None


def is_domain(value: str) -> bool:
    """True when ``value`` is a well-formed domain name (the grammar of an endpoint NAME)."""
    return _DOMAIN.match(value) is not None


def split_domain(value: str) -> tuple[str, str | None]:
    """``agent://NAME@DOMAIN`` -> (``agent://NAME``, ``DOMAIN``); an id without ``@`` ->
    (the id, None). Neither part is checked here: the caller checks both."""
    head, at, domain = value.rpartition("@")
    if not at:
        return value, None
    return head, domain


def qualified(endpoint_id: str, domain: str) -> str:
    """``agent://NAME`` seen from another domain: ``agent://NAME@DOMAIN`` (an id that already
    names its domain is left as it is)."""
    return endpoint_id if "@" in endpoint_id else f"{endpoint_id}@{domain}"
