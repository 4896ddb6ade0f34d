"""Request and answer bodies of the HTTP API, parsed strictly at the edge.

Decoding turns any malformed body into :class:`InvalidRequest` whose detail names the field
(``$.intent``), so nothing past this module sees an unchecked value.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import msgspec

from agent_reach.core.names import (
    ENDPOINT_ID_PATTERN,
    INTENT_MAX_LEN,
    INTENT_PATTERN,
    TARGET_ID_PATTERN,
    is_endpoint_id,
)
from agent_reach.core.netguard import legacy_ipv4
from agent_reach.errors import Forbidden, InternalError, InvalidRequest, ReachError
from agent_reach.wire.answers import AgentInfo

__all__ = [
    "OUTCOMES",
    "DeliveryBody",
    "EndpointIdBody",
    "RegisterBody",
    "RouteQuery",
    "SendBody",
    "TokenRequest",
    "TraceQuery",
    "convert",
    "decode",
    "decode_register",
    "encode",
]

EndpointId = Annotated[str, msgspec.Meta(pattern=ENDPOINT_ID_PATTERN)]
# a recipient_hint may name another domain's endpoint: agent://NAME@DOMAIN (federation)
TargetId = Annotated[str, msgspec.Meta(pattern=TARGET_ID_PATTERN)]
Intent = Annotated[str, msgspec.Meta(pattern=INTENT_PATTERN, max_length=INTENT_MAX_LEN)]
# ids travel in HTTP headers: visible ASCII only, no spaces
Token = Annotated[str, msgspec.Meta(pattern=r"^[\x21-\x7e]{1,128}\Z")]
MAX_DESCRIPTION = 4096  # characters of an endpoint's description
MAX_TIMEOUT_MS = 600_000  # ten minutes: longer work belongs in a task the agent reports on
Url = Annotated[str, msgspec.Meta(min_length=8, max_length=2048)]
_EMPTY_OBJECT = msgspec.Raw(b"{}")  # a send's payload when none is given


_ENDPOINT_SCHEMES = ("http", "https", "a2a+http", "a2a+https")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # controls and spaces: no URL carries them raw


def _url_refusal(url: str, host: str | None, netloc: str) -> str | None:
    """Why ``url`` (its ``host`` and ``netloc`` as urlsplit reads them) is not one the
    gateway shows and dials as the same thing, or None. A control character or a space would
    be cut or dropped on the way (a NUL ends the name the resolver sees: "127.0.0.1\0.x" was
    dialled as 127.0.0.1 and shown as it came; urlsplit drops a tab); a percent-encoded host is
    dialled as those characters, not as what they encode; a bracketed host that is not an IPv6
    address (RFC 3986's IPvFuture, "[v1.x]") is dialled as a DNS name."""
    bad = _CONTROL.search(url)
    if bad is not None:
        return f"must not hold a space or a control character (U+{ord(bad[0]):04X})"
    if host is not None and "%" in host:
        return "must not percent-encode its host"
    if "[" in netloc and host is not None and ":" not in host:
        return "a bracketed host must be an IPv6 address"
    return None


class RegisterBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/register``."""

    endpoint_id: EndpointId
    capabilities: Annotated[list[Intent], msgspec.Meta(min_length=1, max_length=256)]
    endpoint_url: Url
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION)] = ""

    def __post_init__(self) -> None:
        if not self.endpoint_url.isascii():
            # Python and the HTTP client map non-ASCII hosts differently (with U+1FBF1, a
            # segmented digit one, before "27.0.0.1" it is a name to one and 127.0.0.1 to the
            # other): the address checked must be the one dialled
            raise ValueError(
                "must be ASCII: percent-encode the path and write an international host name"
                " in its punycode (xn--) form - at `$.endpoint_url`"
            )
        if (bad := _CONTROL.search(self.endpoint_url)) is not None:
            raise ValueError(
                f"must not hold a space or a control character (U+{ord(bad[0]):04X})"
                " - at `$.endpoint_url`"
            )
        if self.endpoint_url.startswith("nats:"):
            # a NATS subject (CONTRACT v1.1): whether this gateway has NATS, and whether the
            # subject may be used, is the node's to say at registration (422 otherwise)
            self.capabilities = list(dict.fromkeys(self.capabilities))
            return
        parts = urlsplit(self.endpoint_url)
        if parts.scheme not in _ENDPOINT_SCHEMES or not parts.hostname:
            raise ValueError(
                "must be an http or https URL with a host (a2a+http or a2a+https: an A2A"
                " agent's JSON-RPC interface), or nats:SUBJECT - at `$.endpoint_url`"
            )
        try:
            parts.port  # noqa: B018 - raises on a bad port
            parts.hostname.encode("idna")  # raises on a host no resolver takes ("a..b")
        except (ValueError, UnicodeError) as exc:
            raise ValueError(f"{exc} - at `$.endpoint_url`") from None
        refusal = _url_refusal(self.endpoint_url, parts.hostname, parts.netloc)
        if refusal is not None:
            raise ValueError(f"{refusal} - at `$.endpoint_url`")
        if parts.username is not None or parts.password is not None:
            # it would go to the agent as Basic auth and be shown by /v1/agents to any reader
            raise ValueError(
                "must not carry user:password@: an agent's credentials are not the registry's"
                " to keep (in token mode, deliveries carry the gateway's signed assertion)"
                " - at `$.endpoint_url`"
            )
        legacy = legacy_ipv4(parts.hostname)
        if legacy is not None:
            raise ValueError(
                f"the host {parts.hostname!r} is a legacy numeric form of {legacy}, which the"
                f" HTTP client does not dial: write {legacy} - at `$.endpoint_url`"
            )
        # one declaration per tag, in the order given
        self.capabilities = list(dict.fromkeys(self.capabilities))


class CardRegisterBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/register`` of an A2A agent by its Agent Card (CONTRACT.md v1.1, "A2A"):
    no ``endpoint_url``; ``capabilities``, when given, win over the card's skills."""

    endpoint_id: EndpointId
    a2a_card_url: Url
    capabilities: Annotated[list[Intent], msgspec.Meta(min_length=1, max_length=256)] | None = None
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION)] = ""

    def __post_init__(self) -> None:
        parts = urlsplit(self.a2a_card_url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or not self.a2a_card_url.isascii()
        ):
            raise ValueError("must be an ASCII http or https URL with a host - at `$.a2a_card_url`")
        refusal = _url_refusal(self.a2a_card_url, parts.hostname, parts.netloc)
        if refusal is not None:
            raise ValueError(f"{refusal} - at `$.a2a_card_url`")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry user:password@ (it is shown) - at `$.a2a_card_url`")
        if self.capabilities is not None:
            self.capabilities = list(dict.fromkeys(self.capabilities))


def decode_register(body: bytes) -> RegisterBody | CardRegisterBody:
    """A registration: :class:`CardRegisterBody` when it names ``a2a_card_url``, else the
    v1 :class:`RegisterBody`; InvalidRequest (400/422) otherwise."""
    if b"a2a_card_url" not in body:
        return decode(body, RegisterBody)
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", malformed=True) from None
    except RecursionError:
        raise InvalidRequest("body is nested too deeply", malformed=True) from None
    if isinstance(fields, dict) and "a2a_card_url" in fields:
        if "endpoint_url" in fields:
            raise InvalidRequest(
                "give endpoint_url or a2a_card_url, not both", field="a2a_card_url"
            )
        return decode(body, CardRegisterBody)
    return decode(body, RegisterBody)


class EndpointIdBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/heartbeat`` and ``POST /v1/deregister``."""

    endpoint_id: EndpointId


MAX_INTENT_TEXT = 2000  # characters of intent_text (CONTRACT.md v1.1, "Matching")
IntentText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_INTENT_TEXT)]


def check_intent_text(intent: str | None, text: str | None) -> None:
    """ValueError (a 422 naming the field, through msgspec) for a request that names neither
    an intent nor words, or whose words are blank or hold control characters."""
    if text is None:
        if intent is None:
            raise ValueError("give intent, intent_text or both - at `$.intent`")
        return
    if not text.strip():
        raise ValueError("intent_text is blank - at `$.intent_text`")
    if any((ord(c) < 32 and c not in "\t\n\r") or 127 <= ord(c) < 160 for c in text):
        raise ValueError("intent_text holds control characters - at `$.intent_text`")  # C0, C1


class SendBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``POST /v1/send``: ``intent``, or ``intent_text`` (the caller's words), or both."""

    intent: Intent | None = None
    intent_text: IntentText | None = None
    fallback: bool = True  # false: no match but an exact one
    msg_id: Token | None = None
    trace_id: Token | None = None
    sender: EndpointId | None = None
    recipient_hint: TargetId | None = None
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: _EMPTY_OBJECT)
    priority: Literal["low", "normal", "high"] = "normal"
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=MAX_TIMEOUT_MS)] | None = None

    def __post_init__(self) -> None:
        check_intent_text(self.intent, self.intent_text)


MAX_TOKEN_TTL_S = 30 * 86400.0
DEFAULT_ENROLL_TTL_S = 86400.0  # an enrollment token's life when not asked otherwise
DEFAULT_CLIENT_TTL_S = 3600.0  # a client token's
Pattern = Annotated[str, msgspec.Meta(min_length=1, max_length=140)]


class TokenRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``POST /v1/tokens`` (operator): an enrollment token for agents, or a client token.

    ``enroll``: ``endpoints`` and ``intents`` (patterns) say which ids it may register with
    which intents; ``subject`` is a label for people (default ``enroll``). ``client``:
    ``subject`` is the sender id (``agent://NAME``) its holder sends as.
    """

    kind: Literal["enroll", "client"]
    subject: Annotated[str, msgspec.Meta(min_length=1, max_length=140)] | None = None
    endpoints: Annotated[list[Pattern], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    intents: Annotated[list[Pattern], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_TOKEN_TTL_S)] | None = None


class DeliveryBody(msgspec.Struct, omit_defaults=True):
    """What the gateway POSTs to an agent: the request with msg_id and trace_id filled in.
    ``intent`` is the tag the agent declared (the matched one); ``requested_intent`` and
    ``intent_text`` are what the caller sent (left out when it sent none)."""

    msg_id: str
    trace_id: str
    sender: str | None
    recipient_hint: str | None
    intent: str
    payload: msgspec.Raw
    priority: str
    timeout_ms: int
    requested_intent: str | None = None
    intent_text: str | None = None


def _codes(cls: type[ReachError]) -> set[str]:
    out = set()
    for sub in cls.__subclasses__():
        out.add(sub.code)
        out |= _codes(sub)
    return out


# what a summary's ``outcome`` can be: "ok", or the error code of a /v1/send answer that the
# delivery loop gave (a reach error, a policy's refusal of every candidate, a fault of ours)
OUTCOMES = frozenset({"ok", *_codes(ReachError), Forbidden.code, InternalError.code})


MAX_LIST = 500  # the largest ``limit`` of one listing


class TraceQuery(msgspec.Struct, forbid_unknown_fields=True):
    """Query of ``GET /v1/traces`` (an extension beyond contract v1)."""

    intent: Intent | None = None
    outcome: str | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIST)] = 50

    def __post_init__(self) -> None:
        if self.outcome is not None and self.outcome not in OUTCOMES:
            codes = ", ".join(sorted(OUTCOMES))
            raise ValueError(f"Expected one of {codes} - at `$.outcome`")


T = TypeVar("T")
_NAMED_FIELD = re.compile(r"field `([^`]+)`")

_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
encode = msgspec.json.Encoder().encode


def decode(body: bytes, kind: type[T]) -> T:
    """Parse ``body`` as ``kind``; InvalidRequest (400 not JSON, 422 wrong shape) otherwise."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(body)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}", malformed=True) from None
    except RecursionError:
        raise InvalidRequest("body is nested too deeply", malformed=True) from None


class RouteQuery(msgspec.Struct, forbid_unknown_fields=True):
    """Query of ``GET /v1/route``: as a send's, ``intent`` or ``intent_text`` or both."""

    intent: Intent | None = None
    intent_text: IntentText | None = None
    fallback: bool = True
    recipient_hint: EndpointId | None = None
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=MAX_TIMEOUT_MS)] | None = None

    def __post_init__(self) -> None:
        check_intent_text(self.intent, self.intent_text)


def convert(values: dict[str, str], kind: type[T]) -> T:
    """Build ``kind`` from query-string values (strings converted); InvalidRequest otherwise."""
    try:
        return msgspec.convert(values, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: msgspec.ValidationError) -> InvalidRequest:
    """422 naming the field msgspec points at (``$.intent`` becomes ``intent``)."""
    text = str(exc)
    if " - at `" in text:
        field = text.rsplit(" - at `", 1)[1].rstrip("`").removeprefix("$").removeprefix(".")
    else:
        named = _NAMED_FIELD.search(text)  # "Object missing required field `intent`"
        field = named.group(1) if named else ""
    return InvalidRequest(text, field=field or None)


# --- GET /v1/agents in pages (an extension beyond contract v1: docs/api.md, "Listing") --------

AGENTS_MAX_LIMIT = 1000  # the most agents one page holds
AGENTS_DEFAULT_LIMIT = 100  # a page's size when the query names none
AGENT_STATUSES = ("healthy", "degraded", "suspect", "down")
# the names that ask for a page: with none of them, the answer is the v1 listing
AGENTS_QUERY_NAMES = frozenset({"limit", "cursor", "intent", "status"})
StatusFilter = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=64,
        description="healthy, degraded, suspect or down; several comma-separated",
    ),
]
_CURSOR_VERSION = "1:"  # what a cursor holds: "1:" and the last endpoint id of its page


class AgentsQuery(msgspec.Struct, forbid_unknown_fields=True):
    """Query of ``GET /v1/agents`` that asks for one page: at most ``limit`` agents in
    endpoint_id order, after the position ``cursor`` (a page's ``next_cursor``) names; only
    those that declare ``intent`` exactly, and whose status is one of ``status`` (one value,
    or several comma-separated), when given."""

    limit: Annotated[int, msgspec.Meta(ge=1, le=AGENTS_MAX_LIMIT)] = AGENTS_DEFAULT_LIMIT
    cursor: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    intent: Intent | None = None
    status: StatusFilter | None = None

    def __post_init__(self) -> None:
        if self.status is not None and not set(self.status.split(",")) <= set(AGENT_STATUSES):
            raise ValueError(
                f"Expected one of {', '.join(AGENT_STATUSES)} (several: comma-separated)"
                " - at `$.status`"
            )
        if self.cursor is not None and cursor_position(self.cursor) is None:
            raise ValueError(
                "not a cursor of this gateway (give a page's next_cursor as it came)"
                " - at `$.cursor`"
            )

    @property
    def after(self) -> str | None:
        """The endpoint id the page starts after (None: from the first)."""
        return None if self.cursor is None else cursor_position(self.cursor)

    @property
    def statuses(self) -> frozenset[str] | None:
        """The statuses asked for (None: any)."""
        return None if self.status is None else frozenset(self.status.split(","))


class AgentsPage(msgspec.Struct, frozen=True):
    """``GET /v1/agents``: every agent (v1), or, asked for a page (:class:`AgentsQuery`), one
    page of them with ``next_cursor`` (null on the last page) and ``total`` (how many agents
    match the filters, over every page)."""

    agents: list[AgentInfo]
    next_cursor: str | msgspec.UnsetType | None = msgspec.UNSET
    total: int | msgspec.UnsetType = msgspec.UNSET


def agents_query(values: Mapping[str, str]) -> AgentsQuery | None:
    """The page a query string asks for, or None for the v1 listing (no name of
    :data:`AGENTS_QUERY_NAMES` given). An empty value counts as not given (a form's blank
    field). Other names are ignored on a v1 listing, as v1 ignored them, and refused next to
    these (a misspelt filter would go unnoticed), as is one of these given twice: InvalidRequest
    (422, naming the parameter), as for values that do not parse."""
    given: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in values.items():
        if name in seen and name in AGENTS_QUERY_NAMES:
            raise InvalidRequest(
                f"{name} is given twice: give it once (statuses comma-separated)", field=name
            )
        seen.add(name)
        if value:
            given[name] = value
    if given.keys().isdisjoint(AGENTS_QUERY_NAMES):
        return None
    unknown = sorted(given.keys() - AGENTS_QUERY_NAMES)
    if unknown:
        names = ", ".join(sorted(AGENTS_QUERY_NAMES))
        raise InvalidRequest(
            f"no parameter {unknown[0]!r} here (a page takes {names})", field=unknown[0]
        )
    return convert(given, AgentsQuery)


def next_cursor(last_endpoint_id: str) -> str:
    """The cursor of the position after ``last_endpoint_id`` (opaque to clients)."""
    raw = (_CURSOR_VERSION + last_endpoint_id).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def cursor_position(cursor: str) -> str | None:
    """The endpoint id a cursor of :func:`next_cursor` names; None for anything else."""
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        text = raw.decode("ascii")
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return None
    position = text.removeprefix(_CURSOR_VERSION)
    if position == text or not is_endpoint_id(position):
        return None
    return position
