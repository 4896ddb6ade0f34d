"""The bodies of federation (CONTRACT.md v1.1, "Federation"): a domain's summary, as a gateway
publishes it to the directory and the directory hands it to the other domains.

A summary carries counts only: per intent tag, how many endpoints are healthy and degraded,
their p95 latency and the attempts in flight. Never an endpoint id or URL: what crosses a
domain boundary is what another domain needs to decide whether to forward, nothing more.

Decoding is strict and bounded (:func:`decode_summary`): the directory takes summaries from
other processes, and a bad one is refused by the field it fails on.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import msgspec

from agent_reach.core.names import is_domain, is_intent
from agent_reach.errors import InvalidRequest

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "MAX_COUNT",
    "MAX_SUMMARY_INTENTS",
    "TAG_OVERHEAD_BYTES",
    "DirectoryAnswer",
    "DirectoryEntry",
    "DomainSummary",
    "IntentSummary",
    "check_summary",
    "decode_summary",
    "estimated_bytes",
    "gateway_url_refusal",
]

MAX_SUMMARY_INTENTS = 100_000  # tags a summary may carry (a registry's --max-endpoints)
MAX_COUNT = 1_000_000_000  # a count of a summary's tag, and its p95 in ms, at most
ENTRY_OVERHEAD_BYTES = 256  # an entry's JSON beside its tags (domain, URL, times): at most
TAG_OVERHEAD_BYTES = 112  # a tag's JSON beside the tag itself (its counts): at most


class IntentSummary(msgspec.Struct, frozen=True):
    """One tag of a domain: endpoints healthy and degraded now, the p95 latency (ms) of the
    best-placed one with history (None: none has any), attempts in flight across them."""

    healthy: int
    degraded: int
    p95_ms: float | None
    inflight: int


class DomainSummary(msgspec.Struct, frozen=True):
    """A domain's summary: who publishes it, where its gateway answers forwarded requests,
    when it was made (unix seconds, the publisher's clock), and its tags."""

    domain: str
    gateway_url: str
    at: float
    intents: dict[str, IntentSummary]


class DirectoryEntry(msgspec.Struct, frozen=True):
    """A summary as the directory hands it out: with ``age_s``, the seconds since the
    directory received it (its own clock: publishers' clocks need not agree)."""

    domain: str
    gateway_url: str
    at: float
    intents: dict[str, IntentSummary]
    age_s: float


class DirectoryAnswer(msgspec.Struct, frozen=True):
    """``PUT /v1/summaries/DOMAIN`` (the other domains' summaries) and ``GET /v1/summaries``
    (every one)."""

    summaries: list[DirectoryEntry]
    ok: bool = True


def estimated_bytes(summary: DomainSummary | DirectoryEntry) -> int:
    """The summary's size as JSON, estimated without encoding it: its tags' lengths and a
    fixed share per tag and per entry (a bound for a checked summary: counts and p95 at most
    :data:`MAX_COUNT`)."""
    return (
        ENTRY_OVERHEAD_BYTES
        + len(summary.gateway_url)
        + sum(len(tag) + TAG_OVERHEAD_BYTES for tag in summary.intents)
    )


_summary_decoder = msgspec.json.Decoder(DomainSummary)


def decode_summary(data: bytes | str) -> DomainSummary:
    """A summary from JSON, checked: InvalidRequest naming the field that is wrong."""
    try:
        summary = _summary_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"summary: {exc}") from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidRequest("summary is not JSON", malformed=True) from None
    check_summary(summary)
    return summary


def check_summary(summary: DomainSummary) -> None:
    """InvalidRequest naming the first field of ``summary`` that is not of the contract."""
    if not is_domain(summary.domain):
        raise InvalidRequest(f"domain {summary.domain!r} is not a domain name", field="domain")
    refusal = gateway_url_refusal(summary.gateway_url)
    if refusal is not None:
        raise InvalidRequest(f"gateway_url {refusal}", field="gateway_url")
    if not math.isfinite(summary.at) or summary.at < 0:
        raise InvalidRequest("at must be unix seconds", field="at")
    if len(summary.intents) > MAX_SUMMARY_INTENTS:
        raise InvalidRequest(
            f"a summary carries at most {MAX_SUMMARY_INTENTS} intents", field="intents"
        )
    for tag, counts in summary.intents.items():
        if not is_intent(tag):
            raise InvalidRequest(f"intents: {tag!r} is not an intent tag", field="intents")
        p95 = counts.p95_ms
        if (
            not 0 <= counts.healthy <= MAX_COUNT
            or not 0 <= counts.degraded <= MAX_COUNT
            or not 0 <= counts.inflight <= MAX_COUNT
            or (p95 is not None and not 0 <= p95 <= MAX_COUNT)  # NaN fails too
        ):
            raise InvalidRequest(
                f"intents.{tag}: counts and p95_ms must be 0-{MAX_COUNT}", field="intents"
            )


def gateway_url_refusal(url: str) -> str | None:
    """Why ``url`` cannot be a gateway's URL (None: it can): http(s), a host, an optional port
    and path; no user info, query or fragment (forwards append ``/v1/send`` to it, and it comes
    from another process)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not carry user info"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "must not carry a query or a fragment"
    if port is not None and not 0 < port < 65536:
        return "has a bad port"
    if any(ord(c) < 33 or ord(c) > 126 for c in url):
        return "must be printable ASCII without spaces"
    return None


def summary_dict(summary: DomainSummary | DirectoryEntry) -> dict[str, Any]:
    """A summary as plain JSON values (``/v1/federation``)."""
    out: dict[str, Any] = msgspec.to_builtins(summary)
    return out
