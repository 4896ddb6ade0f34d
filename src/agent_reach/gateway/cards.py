"""A2A agents registered by their Agent Card (CONTRACT.md v1.1, "A2A"; docs/a2a.md).

``POST /v1/register`` with ``a2a_card_url`` (and ``agent-reach a2a add CARD_URL``): the gateway
fetches the card, checks it with the ``a2a-sdk``'s own parser (A2A 1.0; a v0.3 card, as served
at ``/.well-known/agent.json``, is read too and said to be one), takes its JSON-RPC interface as
the endpoint (``a2a+http://...``: the A2A transport delivers ``SendMessage`` there) and its
skills as the capabilities: a skill whose ``id`` is a valid tag is that tag; else the
dictionary tag its words (name, description, examples) match at or above the confidence
threshold; else the skill is listed as unmapped. ``capabilities`` in the body, when given, win.

Card-only agents do not heartbeat: every heartbeat interval, each gateway fetches the cards it
keeps (:class:`CardKeeper`, the ``a2a-cards`` shared map of the registry: every gateway of a
shared registry keeps them all) with ``If-None-Match``; a fetch that answers (200 or 304) is a
heartbeat, and a changed card is mapped again (a changed interface or skill set registers the
agent again, with the owner it had). A card that cannot be fetched is no heartbeat: the agent's
health falls through the levels as a silent agent's does.

Invariants:
- A card is fetched through the HTTP transport's guard, pool and size cap: a card URL is
  refused where an endpoint URL would be (``--endpoint-networks``), and redirects are not
  followed.
- Reading a card changes nothing: the registration is made from its result by the service,
  with the checks of every registration (token policy, the dictionary's mode, the address
  guard on the interface URL).
- The keeper's loop catches per card and per round, logs, and lets cancellation pass.
- A round ends within its time (the heartbeat interval's :data:`ROUND_SHARE`): a fetch's
  timeout is cut to what is left of it, and a card not begun by then waits for the next round.
  Cards that answered in the last round are fetched first, quickest first, then those the
  last round did not reach, then those that failed: agents whose card hosts hang cannot
  starve the heartbeats of those whose hosts answer (a review's 160 hanging cards, 16 fetched
  at a time for up to 5 s each, made a well-behaved card agent fall to down every round).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from typing import TYPE_CHECKING, Any

import msgspec

from agent_reach.core.names import is_intent
from agent_reach.errors import AgentReachError, ConfigError, EndpointNotRegistered, InvalidRequest
from agent_reach.observability.logs import log
from agent_reach.registry.base import RegistryChange
from agent_reach.wire.bodies import MAX_DESCRIPTION, CardRegisterBody, RegisterBody

if TYPE_CHECKING:
    from agent_reach.gateway.node import Node
    from agent_reach.transport.http import HttpTransport

__all__ = ["CARD_MAP", "Card", "CardKeeper", "SkillMap"]

CARD_MAP = "a2a-cards"  # the registry's shared map: endpoint id -> the kept card (JSON)
FETCH_TIMEOUT_S = 5.0
MAX_PARALLEL = 16  # card fetches in flight at once, per gateway
MAX_TEXTS = 8  # texts of one skill matched against the dictionary
MAX_SKILLS = 64  # skills of one card read (the rest are left out, and logged)
ROUND_SHARE = 0.6  # rounds start every 0.6 heartbeat interval, as the agent SDK beats
MISSES = 3  # rounds a kept card's record may be missing from the view before it is forgotten
# characters of a card's name and of each skill's id and name kept (and shown by /v1/agents;
# its description is cut to a registration's, MAX_DESCRIPTION): a card's fields are the card
# host's to make as big as they like
MAX_NAME = 256


class MatcherBusy(Exception):
    """The matcher could not match a skill's words now (internal to the keeper)."""


_ACCEPT = {"Accept": "application/json", "A2A-Version": "1.0"}


class SkillMap(msgspec.Struct, frozen=True):
    """One skill of a card and the tag it serves (None: unmapped), with how it was found:
    ``id`` (the skill id is a tag), ``dictionary`` (its words matched a dictionary tag at
    ``confidence``), ``given`` (the registration's capabilities)."""

    id: str
    name: str
    intent: str | None = None
    how: str | None = None
    confidence: float | None = None


class Card(msgspec.Struct, frozen=True):
    """What the gateway took from an agent's card, kept in the ``a2a-cards`` map."""

    card_url: str
    version: str  # "1.0", or "0.3" for a card of the earlier shape
    interface: str  # the JSON-RPC interface URL
    name: str
    description: str
    skills: list[SkillMap]
    etag: str = ""
    given: list[str] | None = None  # capabilities the registration gave (they win)
    # "verified" (a signature by a trusted key), "unchecked" (signed, no keys configured), ""
    signed: str = ""
    # the tags the registration accepted (its checks: policy, dictionary mode): a changed card
    # never adds others; and the digest of the card's bytes (an unchanged card is not re-read)
    accepted: list[str] = msgspec.field(default_factory=list)
    digest: str = ""
    # why the card as it now reads earns no heartbeat ("moved": its interface is not the one
    # registered; "unmapped": none of its skills is a tag the registration accepted): kept so
    # that the rounds after the one that read it do not heartbeat either
    refused: str = ""

    @property
    def capabilities(self) -> list[str]:
        """The tags the agent is registered with."""
        if self.given:
            return list(self.given)
        return list(dict.fromkeys(s.intent for s in self.skills if s.intent))

    @property
    def unmapped(self) -> list[str]:
        """The ids of the skills no tag was found for."""
        return [s.id for s in self.skills if s.intent is None]

    def shown(self) -> dict[str, Any]:
        """The ``a2a`` object of the registration answer and of ``/v1/agents``."""
        return {
            "card_url": self.card_url,
            "card_version": self.version,
            "signature": self.signed or None,
            "name": self.name,
            "skills": msgspec.to_builtins(self.skills),
            "unmapped_skills": self.unmapped,
        }


_a2a: Any = None


def _sdk() -> Any:
    """The a2a-sdk's card parser (imported at first use: protobuf takes ~0.4 s to load)."""
    global _a2a
    if _a2a is None:
        try:
            from a2a.client import card_resolver
        except ImportError as exc:
            raise ConfigError(
                "A2A agents need the a2a-sdk: pip install 'agent-reach-gateway[a2a]'",
                source="a2a",
            ) from exc
        _a2a = card_resolver
    return _a2a


def _is_v03(data: dict[str, Any]) -> bool:
    return "supportedInterfaces" not in data and ("url" in data or "preferredTransport" in data)


CARD_ALGORITHMS = ["ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256", "EdDSA"]


def load_card_keys(path: str) -> Any:
    """The signature verifier of the JWKS file at ``path`` (the a2a-sdk's, over those keys
    only: a card's ``jku`` is never fetched); ConfigError naming what is wrong."""
    import jwt

    try:
        with open(path, "rb") as file:
            jwks = jwt.PyJWKSet.from_json(file.read().decode())
    except (OSError, ValueError, jwt.PyJWKSetError) as exc:
        raise ConfigError(f"--a2a-card-keys {path}: {exc}", source="a2a-card-keys") from exc
    by_kid = {key.key_id: key for key in jwks.keys if key.key_id}
    if not by_kid:
        raise ConfigError(
            f"--a2a-card-keys {path}: no key with a kid (a signature names its key by kid)",
            source="a2a-card-keys",
        )

    def key_for(kid: str | None, jku: str | None) -> Any:
        if kid is None or kid not in by_kid:
            raise jwt.PyJWTError(f"no trusted key {kid!r}")
        return by_kid[kid]

    _sdk()
    from a2a.utils.signing import create_signature_verifier

    return create_signature_verifier(key_for, CARD_ALGORITHMS)


def parse_card(raw: bytes, card_url: str, verify: Any = None) -> tuple[Any, str]:
    """The SDK's ``AgentCard`` of ``raw`` and its version (``"1.0"`` or ``"0.3"``);
    InvalidRequest (field ``a2a_card_url``) naming what is wrong. ``verify`` (trusted keys
    configured): a card that carries signatures must have one valid."""
    sdk = _sdk()
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise _unusable(card_url, f"not JSON: {exc}") from None
    except RecursionError:
        raise _unusable(card_url, "nested too deeply") from None
    if not isinstance(data, dict):
        raise _unusable(card_url, "not a JSON object")
    version = "0.3" if _is_v03(data) else "1.0"
    try:
        card = sdk.parse_agent_card(data)
    except Exception as exc:  # the SDK's ParseError, protobuf's, a TypeError on odd shapes
        raise _unusable(card_url, f"not an Agent Card: {exc}") from None
    missing = [f for f in ("name", "supported_interfaces") if not getattr(card, f)]
    if missing:
        raise _unusable(card_url, f"the card has no {' and no '.join(missing)}")
    if verify is not None and card.signatures:
        try:
            verify(card)
        except Exception as exc:  # the SDK's SignatureVerificationError, or a key's fault
            raise _unusable(card_url, f"no valid signature by a trusted key ({exc})") from None
    return card, version


def _unusable(card_url: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"the Agent Card at {card_url}: {why}", field="a2a_card_url")


def _interface(card: Any, card_url: str) -> str:
    for iface in card.supported_interfaces:
        if iface.protocol_binding.upper() in ("JSONRPC", "JSON-RPC") and iface.url:
            url = str(iface.url)
            if url.startswith(("http://", "https://")):
                return url
    raise _unusable(card_url, "it offers no JSON-RPC interface over http(s)")


class CardKeeper:
    """Reads cards, maps their skills, and keeps card-only agents alive (module docstring)."""

    def __init__(self, node: Node, http: HttpTransport | None) -> None:
        self.node = node
        self.http = http
        self.map = node.registry.shared_map(CARD_MAP)
        # this gateway's copy of the kept cards, as of its last round (for /v1/agents)
        self.local: dict[str, Card] = {}
        self._missing: dict[str, int] = {}  # rounds a kept card's record was not in the view
        # how each card's last fetch went, its round's order: (0, seconds) answered,
        # (1, 0) not reached by its round, (2, 0) failed; a new card (just read, at its
        # registration) is (0, inf): after those that answered, before the others
        self._last: dict[str, tuple[int, float]] = {}
        # the ids registered at an a2a+ URL in the view (kept by its changes): with none, a
        # round reads nothing from the shared map, so a gateway without A2A agents pays nothing
        self._a2a_ids: set[str] = set()
        node.registry.subscribe(self._changed)
        self.timeout_s = min(FETCH_TIMEOUT_S, max(0.5, node.settings.heartbeat_interval / 2))
        self.verify: Any = None  # the signature verifier, once the keys are loaded

    def load(self) -> None:
        """Read the trusted keys of ``--a2a-card-keys`` (ConfigError: the gateway does not
        start)."""
        path = self.node.settings.a2a_card_keys
        if path:
            self.verify = load_card_keys(path)

    # --- reading ---------------------------------------------------------------------------

    async def fetch(
        self, card_url: str, etag: str = "", timeout_s: float | None = None
    ) -> tuple[int, bytes, str]:
        """``(status, body, etag)`` of the card, within ``timeout_s`` (None: the keeper's);
        InvalidRequest when no usable answer came."""
        if self.http is None:
            raise InvalidRequest("this gateway has no HTTP transport to fetch cards with")
        headers = dict(_ACCEPT)
        if etag:
            headers["If-None-Match"] = etag
        wait = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        got = await self.http.fetch(card_url, headers, wait)
        if got.status is None:
            # the guard's refusal is said; how else it failed is not (a card URL must not
            # become a port scanner's probe)
            why = got.error if got.error.startswith("not fetched") else "no answer"
            raise _unusable(card_url, f"could not be fetched: {why}")
        if got.status == 304 and etag:
            return 304, b"", etag
        if got.status != 200:
            raise _unusable(card_url, f"fetching it answered {got.status}")
        found = {k.lower(): v for k, v in got.headers.items()}
        return 200, got.body, found.get("etag", "")

    async def read(self, body: CardRegisterBody) -> tuple[RegisterBody, Card]:
        """The registration a card makes (its interface, its skills' tags) and what is kept."""
        _, raw, etag = await self.fetch(body.a2a_card_url)
        card = await self._card(body.a2a_card_url, raw, etag, body.capabilities)
        card = msgspec.structs.replace(card, accepted=card.capabilities)
        if not card.capabilities:
            raise InvalidRequest(
                f"no skill of the card at {body.a2a_card_url} maps to an intent (unmapped: "
                f"{', '.join(card.unmapped) or 'none, it lists no skill'}): give capabilities",
                field="capabilities",
            )
        return self._registration(body.endpoint_id, card, body.description), card

    async def _card(
        self, card_url: str, raw: bytes, etag: str, given: list[str] | None, *, busy: bool = False
    ) -> Card:
        """What ``raw`` says. ``busy``: raise MatcherBusy rather than leave a skill unmapped
        when the matcher is too busy to match its words (a kept card keeps its mapping)."""
        agent, version = await asyncio.to_thread(parse_card, raw, card_url, self.verify)
        signed = bool(agent.signatures)
        listed = list(agent.skills)
        if len(listed) > MAX_SKILLS:
            log(logging.WARNING, "a2a.card_skills_cut", card_url=card_url, skills=len(listed))
        skills = [await self._skill(s, busy) for s in listed[:MAX_SKILLS]]
        return Card(
            card_url=card_url,
            version=version,
            interface=_interface(agent, card_url),
            name=str(agent.name)[:MAX_NAME],
            description=str(agent.description)[:MAX_DESCRIPTION],
            skills=skills,
            etag=etag,
            given=list(given) if given else None,
            signed=("verified" if self.verify is not None else "unchecked") if signed else "",
            digest=hashlib.sha256(raw).hexdigest(),
        )

    async def _skill(self, skill: Any, busy: bool = False) -> SkillMap:
        """The tag of one skill: its id when that is a tag; else the dictionary tag that its
        texts (the description, each example: at most :data:`MAX_TEXTS`) match, each on its
        own, at or above the threshold, when they match no other; else none (unmapped)."""
        skill_id, name = str(skill.id)[:MAX_NAME], str(skill.name)[:MAX_NAME]
        if is_intent(skill_id):
            return SkillMap(skill_id, name, skill_id, "id", 1.0)
        dictionary = self.node.dictionary
        texts = [str(skill.description) or name, *map(str, skill.examples)]
        texts = [t.strip()[:2000] for t in texts if t.strip()][:MAX_TEXTS]
        if not texts or not len(dictionary):
            return SkillMap(skill_id, name)
        threshold = self.node.settings.confidence_threshold
        found: dict[str, float] = {}
        for text in texts:
            try:
                near = await self.node.router.suggest(None, text)
            except AgentReachError as exc:  # the matcher busy
                if busy:
                    raise MatcherBusy(str(exc)) from exc
                return SkillMap(skill_id, name)  # unmapped now, mapped at the next change
            best = near[0] if near else None
            if best and best["tag"] in dictionary and best["confidence"] >= threshold:
                found[best["tag"]] = max(found.get(best["tag"], 0.0), best["confidence"])
        if len(found) != 1:  # none, or texts of one skill that go to two tags: refuse to guess
            return SkillMap(skill_id, name)
        ((tag, confidence),) = found.items()
        return SkillMap(skill_id, name, tag, "dictionary", round(confidence, 4))

    @staticmethod
    def _registration(
        endpoint_id: str, card: Card, description: str = "", capabilities: list[str] | None = None
    ) -> RegisterBody:
        """The registration of the card, checked as a body is (the interface URL's form, the
        number of tags): InvalidRequest naming the card."""
        fields = {
            "endpoint_id": endpoint_id,
            "capabilities": capabilities if capabilities is not None else card.capabilities,
            "endpoint_url": "a2a+" + card.interface,
            "description": (description or card.description)[:MAX_DESCRIPTION],
        }
        try:
            return msgspec.convert(fields, RegisterBody)
        except msgspec.ValidationError as exc:
            raise _unusable(card.card_url, f"it does not make a registration: {exc}") from None

    # --- keeping ---------------------------------------------------------------------------

    async def keep(self, endpoint_id: str, card: Card) -> None:
        """Keep ``card`` alive (fetched every heartbeat interval) for ``endpoint_id``."""
        await self.map.put(endpoint_id, msgspec.json.encode(card).decode())
        self.local[endpoint_id] = card

    async def forget(self, endpoint_id: str) -> None:
        """Stop keeping the card of ``endpoint_id`` (deregistered, or registered otherwise)."""
        self.local.pop(endpoint_id, None)
        self._missing.pop(endpoint_id, None)
        await self.map.delete(endpoint_id)

    def holds(self, endpoint_id: str) -> bool:
        """Whether this gateway keeps a card for ``endpoint_id`` (as of its last round, and
        the cards registered through it since)."""
        return endpoint_id in self.local

    async def kept(self, endpoint_id: str) -> Card | None:
        """The kept card of ``endpoint_id``, if any."""
        raw = await self.map.get(endpoint_id)
        return None if raw is None else _decode(raw)

    def _changed(self, change: RegistryChange) -> None:
        after = change.after
        if after is not None and after.endpoint_url.startswith("a2a+"):
            self._a2a_ids.add(change.endpoint_id)
        else:
            self._a2a_ids.discard(change.endpoint_id)

    async def run(self) -> None:
        """Every heartbeat interval: fetch every kept card (a node loop). A round is skipped
        while the view holds no A2A agent and this gateway keeps no card (one kept for an id
        gone meanwhile, say purged, is forgotten by the rounds: MISSES), or while the shared
        registry is known away (its own line says so: one transition, one line)."""
        gate = asyncio.Semaphore(MAX_PARALLEL)
        clock = self.node.clock
        every = ROUND_SHARE * float(self.node.settings.heartbeat_interval)
        registry = self.node.registry
        self._a2a_ids |= {
            r.endpoint_id for r in registry.records() if r.endpoint_url.startswith("a2a+")
        }
        while True:
            started = clock.monotonic()
            try:
                idle = not self._a2a_ids and not self.local
                if idle or not registry.state().available:
                    await clock.sleep(every)
                    continue
                kept = await self.map.items()
                self.local = {eid: _decode(raw) for eid, raw in kept.items()}
                last = self._last
                for gone in [eid for eid in last if eid not in self.local]:
                    del last[gone]
                order = sorted(self.local, key=lambda eid: last.get(eid, (0, math.inf)))
                until = started + every
                # (the gate is taken in the order the tasks start: this order)
                await asyncio.gather(
                    *(self._round(eid, self.local[eid], gate, until) for eid in order)
                )
            except asyncio.CancelledError:
                raise
            except AgentReachError as exc:  # the shared registry away: the next round
                log(logging.WARNING, "a2a.cards_unreadable", error=str(exc))
            except Exception:  # a bug must not end the loop
                log(logging.ERROR, "a2a.keeper_error", exc_info=True)
            # start to start, as the agent SDK beats: a round's own time does not delay the next
            await clock.sleep(max(0.0, every - (clock.monotonic() - started)))

    async def _round(
        self, endpoint_id: str, card: Card, gate: asyncio.Semaphore, until: float
    ) -> None:
        clock = self.node.clock
        async with gate:
            began = clock.monotonic()
            if until - began <= 0.0:  # the round's time is up: first among the late next time
                self._last[endpoint_id] = (1, 0.0)
                return
            self._last[endpoint_id] = (2, 0.0)  # until it answers
            try:
                await self.refresh(endpoint_id, card, timeout_s=until - began)
            except asyncio.CancelledError:
                raise
            except AgentReachError as exc:
                log(logging.INFO, "a2a.card_missed", endpoint_id=endpoint_id, error=exc.detail)
            except Exception:
                log(logging.ERROR, "a2a.keeper_error", endpoint_id=endpoint_id, exc_info=True)
            else:
                self._last[endpoint_id] = (0, clock.monotonic() - began)

    async def refresh(self, endpoint_id: str, card: Card, timeout_s: float | None = None) -> None:
        """One fetch of a kept card: a heartbeat when it answers (module docstring).

        A changed card is read again; it may drop tags, or take back ones the registration
        accepted, but never add others (those need a registration again, with its checks), and
        a moved interface is not followed (no heartbeat: register it again). A record missing
        from this gateway's view (a shared registry's view may lag) is forgotten only after
        :data:`MISSES` rounds."""
        router = self.node.router
        record = self.node.registry.get(endpoint_id)
        if record is None:
            self._missing[endpoint_id] = misses = self._missing.get(endpoint_id, 0) + 1
            if misses >= MISSES:
                await self.forget(endpoint_id)
            return
        self._missing.pop(endpoint_id, None)
        if not record.endpoint_url.startswith("a2a+"):  # registered otherwise since
            await self.forget(endpoint_id)
            return
        status, body, etag = await self.fetch(card.card_url, card.etag, timeout_s)
        refused = card.refused  # why the card as last read earns no heartbeat ("": none)
        if status == 200 and hashlib.sha256(body).hexdigest() != card.digest:
            try:
                new = await self._card(card.card_url, body, etag, card.given, busy=True)
            except MatcherBusy:
                new = None  # read again at the next round; its old mapping holds meanwhile
            if new is not None:
                accepted = card.accepted or list(record.capabilities)
                new = msgspec.structs.replace(new, accepted=accepted)
                # judged against the address registered, not the card last read: a card that
                # moved, then changed again, must not be registered at its new address
                registered = record.endpoint_url.removeprefix("a2a+")
                if new.interface != registered:
                    await self.keep(endpoint_id, msgspec.structs.replace(new, refused="moved"))
                    log(
                        logging.WARNING,
                        "a2a.card_moved",
                        endpoint_id=endpoint_id,
                        interface=new.interface,
                        registered=registered,
                    )
                    return  # no heartbeat: a new address is registered with its checks
                extra = [t for t in new.capabilities if t not in accepted]
                if extra:
                    log(
                        logging.WARNING,
                        "a2a.card_new_skills",
                        endpoint_id=endpoint_id,
                        tags=extra,
                        note="register the agent again to add them",
                    )
                tags = [t for t in new.capabilities if t in accepted]
                if not tags:
                    await self.keep(endpoint_id, msgspec.structs.replace(new, refused="unmapped"))
                    log(logging.WARNING, "a2a.card_unmapped", endpoint_id=endpoint_id)
                    return  # no heartbeat: the agent serves nothing it may be routed for
                await self.keep(endpoint_id, new)
                refused = ""  # a card read afresh that may be heartbeated again
                if tags != list(record.capabilities):
                    current = self.node.registry.get(endpoint_id)  # again: after the fetch
                    if current is None or current.endpoint_url != record.endpoint_url:
                        return
                    await router.register(
                        self._registration(endpoint_id, new, record.description, tags),
                        owner=record.owner,
                    )
                    log(
                        logging.INFO, "a2a.card_changed", endpoint_id=endpoint_id, capabilities=tags
                    )
                    return
        elif status == 200 and etag != card.etag:
            await self.keep(endpoint_id, msgspec.structs.replace(card, etag=etag))
        if refused:
            return  # the card as last read still earns none (moved, or unmapped)
        try:
            router.heartbeat(endpoint_id)
        except EndpointNotRegistered:
            await self.forget(endpoint_id)


def _decode(raw: str) -> Card:
    return msgspec.json.decode(raw, type=Card)
