"""What one gateway knows of the other domains: their last summaries, how far their gateways are,
whether they answer. Pure state: every method takes ``now`` (monotonic seconds); nothing here
awaits, reads a clock or logs.

Invariants (CONTRACT.md v1.1, "Federation"):
- A summary is used while it is fresh: younger than ``stale_after`` (3 summary intervals). Its
  age counts from when the directory received it (``age_s`` as the directory reported it, then
  this gateway's own clock), so publishers' clocks need not agree.
- A summary missing from a directory answer is kept until it is stale: a directory that
  restarted empty, or one that is away, does not erase what the gateway had.
- A peer is a forwarding candidate for a tag when its summary is fresh, lists the tag with a
  healthy or degraded endpoint, and its gateway is not marked unreachable. Unreachable comes
  from a refused connection (the passive check, as for agents) or a failed round-trip probe;
  a probe that answers clears it.
- Candidates are ordered healthy first (a domain with a healthy endpoint before one with only
  degraded ones), then by the measured round trip (unmeasured last), then by name; but a
  domain whose gateway left :data:`FAIL_AFTER` forwards in a row without an answer (no HTTP
  answer within the forward's timeout, or one that is not of the contract: a gray failure
  that its probes, which only read ``/healthz``, do not see) goes after all the others: for
  :data:`DEMOTED_S` after its last such failure, then while a forward to it is in flight (one
  forward at a time tries it again), until a forward to it is answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent_reach.core.health import EndpointStats
from agent_reach.errors import InvalidRequest
from agent_reach.wire.federation import (
    DirectoryEntry,
    DomainSummary,
    IntentSummary,
    check_summary,
)

__all__ = ["DEMOTED_S", "FAIL_AFTER", "MAX_PEERS", "Peer", "Peers"]

MAX_PEERS = 1024  # domains a gateway keeps summaries of (the rest are ignored, and counted)
RTT_WEIGHT = 0.3  # weight of a new round-trip sample in the moving average
FAIL_AFTER = 3  # forwards in a row left unanswered by a domain's gateway: it is tried last
DEMOTED_S = 5.0  # ... for this long after the last of them, then one forward at a time


@dataclass(slots=True)
class Peer:
    """Another domain as this gateway sees it."""

    domain: str
    summary: DomainSummary
    received_at: float  # when the directory received the summary, on this gateway's clock
    rtt_ms: float | None = None  # moving average of the probes' round trips
    unreachable: str = ""  # why its gateway is not forwarded to now ("": it is)
    stats: EndpointStats = field(default_factory=EndpointStats)  # what forwards to it saw
    failures: int = 0  # forwards in a row its gateway left unanswered
    failed_at: float = 0.0  # when the last of them ended

    def age_s(self, now: float) -> float:
        return max(0.0, now - self.received_at)

    def routable(self, tag: str) -> IntentSummary | None:
        counts = self.summary.intents.get(tag)
        if counts is None or counts.healthy + counts.degraded <= 0:
            return None
        return counts


class Peers:
    """The other domains' summaries and the state of their gateways (module docstring)."""

    def __init__(self, domain: str, stale_after_s: float) -> None:
        self.domain = domain  # this gateway's own: never a peer of itself
        self.stale_after_s = stale_after_s
        self._peers: dict[str, Peer] = {}
        self.ignored = 0  # summaries not kept: past MAX_PEERS
        self.invalid = 0  # summaries not kept: not of the contract (a bad gateway_url, ...)
        self.version = 0  # bumped when the set of tags offered elsewhere may have changed

    # --- what the directory says ---------------------------------------------------------

    def update(self, entries: Iterable[DirectoryEntry], now: float) -> None:
        """Take the summaries of a directory answer (received ``now``); an entry older than
        the one held (a lagging directory process) does not replace it."""
        for entry in entries:
            if entry.domain == self.domain:
                continue  # our own, echoed back (GET /v1/summaries)
            summary = DomainSummary(entry.domain, entry.gateway_url, entry.at, entry.intents)
            try:  # the directory checked it; another process's data is checked again here
                check_summary(summary)
            except InvalidRequest:
                self.invalid += 1
                continue
            received_at = now - max(0.0, entry.age_s)
            peer = self._peers.get(entry.domain)
            if peer is None:
                if len(self._peers) >= MAX_PEERS:
                    self.ignored += 1
                    continue
                self._peers[entry.domain] = Peer(entry.domain, summary, received_at)
                self.version += 1
                continue
            if received_at < peer.received_at:
                continue
            if peer.summary.intents.keys() != summary.intents.keys():
                self.version += 1
            if peer.summary.gateway_url != summary.gateway_url:
                peer.rtt_ms = None  # another gateway now: measured again, and not held to
                peer.unreachable = ""  # what the one before did
                peer.failures = 0
            peer.summary, peer.received_at = summary, received_at

    def drop_stale(self, now: float, keep_for_s: float) -> list[str]:
        """Forget peers whose summary is older than ``keep_for_s`` (shown as stale until
        then); the domains forgotten."""
        gone = [d for d, p in self._peers.items() if p.age_s(now) > keep_for_s]
        for domain in gone:
            del self._peers[domain]
        if gone:
            self.version += 1
        return gone

    # --- what this gateway measures ------------------------------------------------------

    def probed(self, domain: str, rtt_ms: float | None, why: str = "") -> bool:
        """A round-trip probe of ``domain``'s gateway: answered in ``rtt_ms``, or failed
        (``rtt_ms`` None, ``why`` says how). True when its reachability changed."""
        peer = self._peers.get(domain)
        if peer is None:
            return False
        was = peer.unreachable
        if rtt_ms is None:
            peer.unreachable = why or "its gateway did not answer a probe"
        else:
            peer.rtt_ms = (
                rtt_ms
                if peer.rtt_ms is None
                else (1 - RTT_WEIGHT) * peer.rtt_ms + RTT_WEIGHT * rtt_ms
            )
            peer.unreachable = ""
        return bool(was) != bool(peer.unreachable)

    def forward_failed(self, domain: str, now: float) -> bool:
        """A forward to ``domain`` got no answer of the contract from its gateway (none within
        its timeout, or not one of ours). True when that makes it tried last (the
        :data:`FAIL_AFTER`-th in a row)."""
        peer = self._peers.get(domain)
        if peer is None:
            return False
        peer.failures += 1
        peer.failed_at = now
        return peer.failures == FAIL_AFTER

    def forward_answered(self, domain: str) -> bool:
        """A forward to ``domain`` was answered by its gateway (a send answer or a refusal of
        the contract). True when that ends its being tried last."""
        peer = self._peers.get(domain)
        if peer is None:
            return False
        was = peer.failures >= FAIL_AFTER
        peer.failures = 0
        return was

    def demoted(self, peer: Peer, now: float) -> bool:
        """Whether ``peer`` is tried after every other candidate now (module docstring)."""
        if peer.failures < FAIL_AFTER:
            return False
        return now - peer.failed_at < DEMOTED_S or peer.stats.inflight > 0

    def refused(self, domain: str, why: str) -> None:
        """A forward's connection was refused or reset: not forwarded to until a probe
        answers (the passive check)."""
        peer = self._peers.get(domain)
        if peer is not None:
            peer.unreachable = why

    # --- reading ---------------------------------------------------------------------------

    def get(self, domain: str) -> Peer | None:
        return self._peers.get(domain)

    def fresh(self, peer: Peer, now: float) -> bool:
        return peer.age_s(now) <= self.stale_after_s

    def all(self) -> list[Peer]:
        return sorted(self._peers.values(), key=lambda p: p.domain)

    def candidates(self, tag: str, now: float, exclude: Iterable[str] = ()) -> list[Peer]:
        """The peers a request for ``tag`` may be forwarded to, best first (module docstring)."""
        skip = set(exclude)
        found: list[tuple[bool, int, float, str, Peer]] = []
        for peer in self._peers.values():
            if peer.domain in skip or peer.unreachable or not self.fresh(peer, now):
                continue
            counts = peer.routable(tag)
            if counts is None:
                continue
            rtt = peer.rtt_ms if peer.rtt_ms is not None else float("inf")
            healthy = 0 if counts.healthy > 0 else 1
            found.append((self.demoted(peer, now), healthy, rtt, peer.domain, peer))
        found.sort(key=lambda item: item[:4])
        return [item[4] for item in found]

    def offers(self, tag: str, now: float) -> bool:
        """Whether any fresh peer lists ``tag`` with a routable endpoint (reachable or not)."""
        return any(self.fresh(p, now) and p.routable(tag) is not None for p in self._peers.values())

    def tags(self, now: float) -> set[str]:
        """Every tag a peer held lists (for the fallback matcher's index), fresh or stale,
        routable now or not: the route judges that at each lookup (:meth:`elsewhere`). The
        index is rebuilt when :attr:`version` moves, which it does when these tags change, not
        when a peer goes stale and fresh again or its agents down and up: a set filtered by
        those lost a domain's tags until some unrelated change (a review)."""
        out: set[str] = set()
        for peer in self._peers.values():
            out.update(peer.summary.intents)
        return out

    def __len__(self) -> int:
        return len(self._peers)
