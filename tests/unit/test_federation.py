"""Federation's pure parts, on plain values and an explicit ``now``: what a gateway keeps of
the other domains (freshness, order, reachability), what its own summary counts, the policy's
domain patterns, and the decoding of summaries."""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec
import pytest

from agent_reach.core.health import EndpointStats
from agent_reach.core.model import Outcome
from agent_reach.core.names import qualified, split_domain
from agent_reach.core.policy import Pattern
from agent_reach.core.retry import Deadline, RetryBudget
from agent_reach.core.routing import Tiers
from agent_reach.errors import AgentError, InvalidRequest, Overloaded, PayloadTooLarge
from agent_reach.federation.directory import fit_answer
from agent_reach.federation.peers import DEMOTED_S, MAX_PEERS, Peers
from agent_reach.federation.summary import build_summary, trim_summary
from agent_reach.gateway.forward import Forwarder, ForwardRequest
from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.testing import FakeClock
from agent_reach.transport.base import Delivery
from agent_reach.wire.bodies import SendBody
from agent_reach.wire.federation import (
    MAX_COUNT,
    TAG_OVERHEAD_BYTES,
    DirectoryEntry,
    DomainSummary,
    IntentSummary,
    decode_summary,
    estimated_bytes,
)

TAG = "weather.query"


def entry(domain: str, age_s: float = 0.0, **tags: tuple[int, int]) -> DirectoryEntry:
    intents = {tag.replace("_", "."): IntentSummary(h, d, None, 0) for tag, (h, d) in tags.items()}
    return DirectoryEntry(domain, f"http://{domain}:7700", 1.0, intents, age_s)


def test_a_summary_is_used_until_it_is_three_intervals_old_by_the_directorys_age() -> None:
    peers = Peers("beijing", stale_after_s=1.5)
    peers.update([entry("chengdu", age_s=0.5, weather_query=(1, 0))], now=100.0)
    assert [p.domain for p in peers.candidates(TAG, 100.0)] == ["chengdu"]
    assert [p.domain for p in peers.candidates(TAG, 100.99)] == ["chengdu"]
    assert peers.candidates(TAG, 101.01) == []  # 0.5 s old at receipt + 1.01 s since
    assert not peers.offers(TAG, 101.01)


def test_a_summary_missing_from_an_answer_is_kept_until_stale_and_our_own_is_ignored() -> None:
    peers = Peers("beijing", stale_after_s=1.5)
    peers.update([entry("chengdu", weather_query=(1, 0))], now=0.0)
    peers.update([entry("beijing", weather_query=(5, 0))], now=0.5)  # a restarted directory
    assert [p.domain for p in peers.all()] == ["chengdu"]
    assert peers.offers(TAG, 1.0)
    assert peers.drop_stale(1.0, keep_for_s=10.0) == []
    assert peers.drop_stale(10.5, keep_for_s=10.0) == ["chengdu"]


def test_an_older_copy_from_a_lagging_directory_does_not_replace_a_newer_one() -> None:
    peers = Peers("beijing", stale_after_s=1.5)
    peers.update([entry("chengdu", age_s=0.0, weather_query=(1, 0))], now=10.0)
    peers.update([entry("chengdu", age_s=2.0, weather_query=(0, 0))], now=10.5)
    assert peers.offers(TAG, 10.5)


def test_candidates_healthy_first_then_by_measured_round_trip_unmeasured_last() -> None:
    peers = Peers("beijing", stale_after_s=10.0)
    peers.update(
        [
            entry("near", weather_query=(1, 0)),
            entry("far", weather_query=(2, 0)),
            entry("unmeasured", weather_query=(1, 0)),
            entry("degraded", weather_query=(0, 3)),
            entry("empty", weather_query=(0, 0)),
            entry("other", note_create=(1, 0)),
        ],
        now=0.0,
    )
    peers.probed("near", 2.0)
    peers.probed("far", 40.0)
    peers.probed("degraded", 0.1)
    order = [p.domain for p in peers.candidates(TAG, 1.0)]
    assert order == ["near", "far", "unmeasured", "degraded"]
    assert next(p.domain for p in peers.candidates(TAG, 1.0, exclude=["near"])) == "far"
    # the round trip is a moving average: one fast probe does not reorder at once
    peers.probed("far", 1.0)
    assert [p.domain for p in peers.candidates(TAG, 1.0)][:2] == ["near", "far"]
    for _ in range(10):
        peers.probed("far", 1.0)
    assert [p.domain for p in peers.candidates(TAG, 1.0)][:2] == ["far", "near"]


def test_an_unreachable_peer_is_skipped_until_a_probe_answers() -> None:
    peers = Peers("beijing", stale_after_s=10.0)
    peers.update([entry("chengdu", weather_query=(1, 0))], now=0.0)
    assert peers.probed("chengdu", None, "no answer") is True
    assert peers.candidates(TAG, 1.0) == []
    assert peers.offers(TAG, 1.0)  # still offered: the refusal says it is unreachable
    assert peers.probed("chengdu", None, "no answer") is False  # no change
    assert peers.probed("chengdu", 3.0) is True
    assert [p.domain for p in peers.candidates(TAG, 1.0)] == ["chengdu"]
    peers.refused("chengdu", "connection refused")  # the passive check
    assert peers.candidates(TAG, 1.0) == []


def test_the_peers_kept_are_bounded_and_the_tags_offered_tracked() -> None:
    peers = Peers("me", stale_after_s=10.0)
    peers.update([entry(f"d{i}", weather_query=(1, 0)) for i in range(MAX_PEERS + 5)], now=0.0)
    assert len(peers) == MAX_PEERS
    assert peers.ignored == 5
    version = peers.version
    peers.update([entry("d0", note_create=(1, 0))], now=0.1)
    assert peers.version > version  # its tags changed: the matcher's index is rebuilt
    assert "note.create" in peers.tags(0.2)


def test_the_index_keeps_a_domains_tags_while_it_is_stale_or_its_agents_down() -> None:
    """A review: the index took only fresh domains' routable tags, but is rebuilt only when
    a domain's set of tags changes; one rebuilt while a domain was stale (or its agents down)
    lost its tags until some unrelated change, so matching by meaning to it failed. The index
    has every held domain's tags; the route judges freshness and routability per lookup."""
    peers = Peers("me", stale_after_s=1.0)
    peers.update([entry("far", weather_query=(1, 0))], now=0.0)
    version = peers.version
    assert TAG in peers.tags(5.0)  # stale now: still in the index...
    assert peers.candidates(TAG, 5.0) == [] and not peers.offers(TAG, 5.0)  # ...not routed to
    peers.update([entry("far", weather_query=(0, 0))], now=6.0)  # its agents down
    assert TAG in peers.tags(6.0) and not peers.offers(TAG, 6.0)
    peers.update([entry("far", weather_query=(1, 0))], now=7.0)  # back, the same tags
    assert peers.version == version and peers.offers(TAG, 7.0)


def test_a_summary_counts_routable_endpoints_only_with_the_healthy_tiers_best_p95() -> None:
    fast, slow = EndpointStats(), EndpointStats()
    for ms in (10.0, 12.0, 11.0):
        fast.observe(ms, 0.0)
    for ms in (900.0, 950.0):
        slow.observe(ms, 0.0)
    fast.inflight, slow.inflight = 2, 1
    tiers = {
        TAG: Tiers(healthy=["agent://a", "agent://b"], degraded=["agent://c"]),
        "note.create": Tiers(unavailable=2),  # all suspect or down: not offered
        "ping.pong": Tiers(degraded=["agent://c"]),
    }
    stats = {"agent://a": fast, "agent://b": EndpointStats(), "agent://c": slow}
    summary = build_summary("beijing", "http://gw", 5.0, tiers, tiers.__getitem__, stats)
    assert set(summary.intents) == {TAG, "ping.pong"}
    weather = summary.intents[TAG]
    assert (weather.healthy, weather.degraded, weather.inflight) == (2, 1, 3)
    assert weather.p95_ms == fast.p95_ms()
    assert summary.intents["ping.pong"].p95_ms == slow.p95_ms()
    assert "agent://" not in repr(summary.intents)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"domain": "Bad Name", "gateway_url": "http://x", "at": 1, "intents": {}}', "domain"),
        (b'{"domain": "a", "gateway_url": "ftp://x", "at": 1, "intents": {}}', "gateway_url"),
        (b'{"domain": "a", "gateway_url": "http://x", "at": -1, "intents": {}}', "at"),
        (
            b'{"domain": "a", "gateway_url": "http://x", "at": 1,'
            b' "intents": {"Not A Tag": {"healthy": 1, "degraded": 0, "p95_ms": null,'
            b' "inflight": 0}}}',
            "intents",
        ),
        (
            b'{"domain": "a", "gateway_url": "http://x", "at": 1,'
            b' "intents": {"a.b": {"healthy": -1, "degraded": 0, "p95_ms": null,'
            b' "inflight": 0}}}',
            "intents",
        ),
        (  # over MAX_COUNT: a summary's size would outgrow its estimate
            b'{"domain": "a", "gateway_url": "http://x", "at": 1,'
            b' "intents": {"a.b": {"healthy": 1, "degraded": 0, "p95_ms": null,'
            b' "inflight": 99999999999999999999}}}',
            "intents",
        ),
        (
            b'{"domain": "a", "gateway_url": "http://x", "at": 1,'
            b' "intents": {"a.b": {"healthy": 1, "degraded": 0, "p95_ms": 1e300,'
            b' "inflight": 0}}}',
            "intents",
        ),
    ],
)
def test_a_bad_summary_is_refused_by_the_field_it_fails_on(body: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_summary(body)
    assert field in str(caught.value) or caught.value.fields.get("field") == field


def test_not_json_is_malformed() -> None:
    with pytest.raises(InvalidRequest) as caught:
        decode_summary(b"{nope")
    assert caught.value.malformed


def test_names_with_a_domain() -> None:
    assert split_domain("agent://x@chengdu") == ("agent://x", "chengdu")
    assert split_domain("agent://x") == ("agent://x", None)
    assert qualified("agent://x", "beijing") == "agent://x@beijing"
    assert qualified("agent://x@chengdu", "beijing") == "agent://x@chengdu"


def test_an_endpoint_pattern_without_a_domain_never_matches_a_forwarded_sender() -> None:
    local = Pattern("agent://caller-*", "endpoint")
    assert local.matches("agent://caller-01")
    assert not local.matches("agent://caller-01@beijing")  # * does not reach over @DOMAIN
    beijing = Pattern("agent://caller-*@beijing", "endpoint")
    assert beijing.matches("agent://caller-01@beijing")
    assert not beijing.matches("agent://caller-01@shanghai")
    assert not beijing.matches("agent://caller-01")
    anywhere = Pattern("agent://caller-*@*", "endpoint")
    assert anywhere.matches("agent://caller-01@shanghai")
    assert Pattern("*", "endpoint").matches("agent://x@y")
    with pytest.raises(ValueError, match="domain pattern"):
        Pattern("agent://x@", "endpoint")


@pytest.mark.parametrize(
    "url",
    [
        "http://host/internal/secret#",
        "http://host:1/x?y=1",
        "http://user:pw@host:1",
        "ftp://host",
        "http://",
        "http://host:99999",
        "http://host /x",
    ],
)
def test_a_gateway_url_that_could_point_elsewhere_is_refused(url: str) -> None:
    from agent_reach.wire.federation import DomainSummary, check_summary, gateway_url_refusal

    assert gateway_url_refusal(url) is not None
    with pytest.raises(InvalidRequest):
        check_summary(DomainSummary("a", url, 1.0, {}))


def test_a_summary_with_a_bad_gateway_url_from_the_directory_is_not_kept() -> None:
    peers = Peers("beijing", stale_after_s=10.0)
    bad = DirectoryEntry("evil", "http://evil/x?", 1.0, {TAG: IntentSummary(1, 0, None, 0)}, 0.0)
    peers.update([bad, entry("chengdu", weather_query=(1, 0))], now=0.0)
    assert [p.domain for p in peers.all()] == ["chengdu"] and peers.invalid == 1


def test_a_remote_endpoint_is_always_named_with_the_domain_forwarded_to() -> None:
    from agent_reach.gateway.forward import _remote_id

    assert _remote_id("agent://x", "chengdu") == "agent://x@chengdu"
    assert _remote_id("agent://x@shanghai", "chengdu") == "agent://x@chengdu"  # no third one
    assert _remote_id("not an id", "chengdu") == "@chengdu"


def test_a_domain_whose_gateway_leaves_forwards_unanswered_is_tried_last_then_one_at_a_time() -> (
    None
):
    peers = Peers("beijing", stale_after_s=100.0)
    peers.update([entry("gray", weather_query=(1, 0)), entry("good", weather_query=(1, 0))], 0.0)
    peers.probed("gray", 1.0)  # its /healthz answers, fast: first by the round trip
    peers.probed("good", 20.0)

    def order(now: float) -> list[str]:
        return [p.domain for p in peers.candidates(TAG, now)]

    assert order(1.0) == ["gray", "good"]
    assert peers.forward_failed("gray", 1.0) is False
    assert peers.forward_failed("gray", 2.0) is False
    assert order(2.0) == ["gray", "good"]  # two in a row: not yet
    assert peers.forward_failed("gray", 3.0) is True
    assert order(3.0) == ["good", "gray"]  # tried last, still a candidate
    assert order(3.0 + DEMOTED_S - 0.01) == ["good", "gray"]
    assert order(3.0 + DEMOTED_S) == ["gray", "good"]  # then one forward tries it again...
    gray = peers.get("gray")
    assert gray is not None
    gray.stats.inflight += 1
    assert order(3.0 + DEMOTED_S) == ["good", "gray"]  # ...one at a time
    gray.stats.inflight -= 1
    assert peers.forward_failed("gray", 9.0) is False  # that one failed too: last again
    assert order(9.0) == ["good", "gray"]
    assert peers.forward_answered("gray") is True  # an answer (even a refusal) ends it
    assert order(9.0) == ["gray", "good"]
    assert peers.forward_answered("gray") is False
    # an answer in between resets the count
    peers.forward_failed("gray", 10.0)
    peers.forward_failed("gray", 10.0)
    peers.forward_answered("gray")
    peers.forward_failed("gray", 10.0)
    assert order(10.0) == ["gray", "good"]


class ScriptedTransport:
    """Other domains' gateways as a script: what each domain's gateway answers a forward."""

    def __init__(self, answers: dict[str, Delivery]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        domain = url.removeprefix("http://").split(":")[0]
        self.asked.append(domain)
        return self.answers[domain]


def forwarding(
    answers: dict[str, Delivery], budget: RetryBudget | None = None
) -> tuple[Forwarder, ScriptedTransport]:
    clock = FakeClock()
    peers = Peers("origin", stale_after_s=100.0)
    peers.update([entry(d, weather_query=(1, 0)) for d in answers], clock.now)
    for i, domain in enumerate(answers):
        peers.probed(domain, 1.0 + i)  # tried in the order given
    transport = ScriptedTransport(answers)
    metrics = GatewayMetrics(lambda: {})
    forwarder = Forwarder(
        "origin", peers, transport, budget or RetryBudget(), metrics, clock, lambda: {}
    )
    return forwarder, transport


def forward_request(forwarder: Forwarder) -> ForwardRequest:
    body = SendBody(intent=TAG, msg_id="m-1", trace_id="t-1", sender=None)
    deadline = Deadline(forwarder.clock.monotonic() + 10.0)
    return ForwardRequest(body, TAG, deadline, 10_000, lambda *a, **k: None, "")


def refusal(error: str, status: int, **more: object) -> Delivery:
    body = json.dumps({"error": error, "detail": "no", **more}).encode()
    return Delivery(Outcome.SERVER_ERROR, status, body, reached=False)


async def test_failovers_after_refusals_are_charged_to_the_retry_budget() -> None:
    # a refusal cost the other domain's gateway work: without a charge, every caller would
    # ask every domain of a federation that sheds load. The budget here allows 4 retries;
    # then the last refusal is the answer, its Retry-After with it
    answers = {f"d{i}": refusal("overloaded", 503, retry_after_s=2.0) for i in range(7)}
    forwarder, transport = forwarding(answers, RetryBudget(min_per_second=0.4, window=10))
    with pytest.raises(Overloaded) as raised:
        await forwarder.forward(forward_request(forwarder), [])
    assert transport.asked == ["d0", "d1", "d2", "d3", "d4"]
    assert raised.value.retry_after_s == 2.0


async def test_a_failover_after_a_refused_connection_is_free_whatever_came_before() -> None:
    """A review: once one forward had been answered, every later failover was charged, also
    the one after a connection that could not be made; with a budget of one retry, d2 (which
    would answer) was never asked."""
    answer = b'{"ok": true, "endpoint_id": "agent://w", "result": {}, "attempts": []}'
    answers = {
        "d0": refusal("overloaded", 503),  # answered: the failover to d1 is charged
        "d1": Delivery(Outcome.CONNECT_ERROR, None, None, "refused", reached=False),
        "d2": Delivery(Outcome.OK, 200, answer),  # after a refused connection: free
    }
    forwarder, transport = forwarding(answers, RetryBudget(min_per_second=0.1, window=10))
    endpoint_id, _ = await forwarder.forward(forward_request(forwarder), [])
    assert transport.asked == ["d0", "d1", "d2"] and endpoint_id == "agent://w@d2"


async def test_another_domains_retry_after_is_passed_on_within_a_minute() -> None:
    forwarder, _ = forwarding({"d0": refusal("overloaded", 503, retry_after_s=1e300)})
    with pytest.raises(Overloaded) as raised:
        await forwarder.forward(forward_request(forwarder), [])
    assert raised.value.retry_after_s == 60.0


@pytest.mark.parametrize(
    "odd",
    [
        Delivery(Outcome.OK, 200, b'{"surprise": true}'),  # JSON, not a send answer
        # a proxy's 202 or 204 (a review: read as a refusal, and the next domain asked too)
        Delivery(Outcome.SERVER_ERROR, 202, b'{"accepted": true}', reached=False),
        Delivery(Outcome.SERVER_ERROR, 204, b"", reached=False),
        # what the transport makes of a 2xx that is not JSON, or compressed, and of a 3xx
        Delivery(Outcome.AGENT_ERROR, 200, None, "answered 200 with a body that is not JSON"),
        Delivery(Outcome.AGENT_ERROR, 302, None, "answered 302"),
    ],
)
async def test_a_2xx_that_is_not_a_send_answer_is_an_agent_error_not_forwarded_again(
    odd: Delivery,
) -> None:
    # the other domain may have done the work: asking the next one would do it twice
    forwarder, transport = forwarding({"d0": odd, "d1": refusal("overloaded", 503)})
    with pytest.raises(AgentError, match="not forwarded again"):
        await forwarder.forward(forward_request(forwarder), [])
    assert transport.asked == ["d0"]


async def test_a_body_over_another_gateways_limit_is_said_as_it_is() -> None:
    """A review: a 413 ``payload_too_large`` of the other domain's gateway (the body,
    re-encoded for the forward, over its limit) was a ``server_error``, and the caller got a
    bare 502 ``all_attempts_failed``; it is now the refusal passed on."""
    forwarder, transport = forwarding({"d0": refusal("payload_too_large", 413)})
    with pytest.raises(PayloadTooLarge):
        await forwarder.forward(forward_request(forwarder), [])
    assert transport.asked == ["d0"]


def test_a_summary_over_the_directorys_bounds_is_cut_to_its_best_served_tags() -> None:
    intents = {
        "a.lone": IntentSummary(1, 0, None, 0),
        "b.many": IntentSummary(5, 0, None, 0),
        "c.degraded": IntentSummary(0, 2, None, 0),
        "d.two": IntentSummary(2, 1, None, 0),
    }
    summary = DomainSummary("here", "http://here:7700", 1.0, intents)
    assert trim_summary(summary) == (summary, 0)  # within: the same object
    cut, left_out = trim_summary(summary, max_intents=2)
    assert list(cut.intents) == ["b.many", "d.two"] and left_out == 2
    assert cut.domain == "here" and cut.gateway_url == summary.gateway_url and cut.at == 1.0
    # by size: each tag costs its length and a bound of its counts' JSON
    size = estimated_bytes(DomainSummary("here", "http://here:7700", 1.0, {}))
    room = size + 3 * (len("b.many") + TAG_OVERHEAD_BYTES)
    cut, left_out = trim_summary(summary, max_bytes=room)
    assert list(cut.intents) == ["b.many", "d.two", "a.lone"] and left_out == 1
    assert estimated_bytes(cut) <= room < estimated_bytes(summary)
    # the estimate bounds the real JSON of any counts a checked summary may carry
    big = IntentSummary(MAX_COUNT, MAX_COUNT, 1.2345678901234567e-300, MAX_COUNT)
    real = len(msgspec.json.encode(DomainSummary("x", "http://x:1", 1.0, {"t.tag": big})))
    small = IntentSummary(0, 0, None, 0)
    assert real <= estimated_bytes(DomainSummary("x", "http://x:1", 1.0, {"t.tag": small}))


def test_a_directory_answer_keeps_the_smallest_summaries_within_its_bound() -> None:
    entries = [entry(f"d{i}", weather_query=(1, 0)) for i in range(4)]
    assert fit_answer(entries, [10, 10, 10, 10], 40) is entries
    assert [e.domain for e in fit_answer(entries, [30, 5, 20, 10], 40)] == ["d1", "d3", "d2"]
    assert fit_answer(entries, [50, 60, 70, 80], 40) == []


def test_only_a_refusal_of_the_summary_sends_a_gateway_to_read_the_others_with_get() -> None:
    from agent_reach.federation.member import _refused_summary

    assert _refused_summary(413, b'{"ok": false, "error": "payload_too_large"}')
    assert _refused_summary(403, b"")
    assert _refused_summary(503, b'{"ok": false, "error": "registry_full", "detail": "full"}')
    # the directory cannot serve at all: a GET would fail too
    assert not _refused_summary(503, b'{"ok": false, "error": "backend_unavailable"}')
    assert not _refused_summary(502, b"<html>bad gateway</html>")


def test_a_new_gateway_url_starts_a_demoted_domain_afresh() -> None:
    peers = Peers("beijing", stale_after_s=100.0)
    peers.update([entry("gray", weather_query=(1, 0)), entry("good", weather_query=(1, 0))], 0.0)
    peers.probed("gray", 1.0)
    peers.probed("good", 20.0)
    for _ in range(3):
        peers.forward_failed("gray", 1.0)
    assert [p.domain for p in peers.candidates(TAG, 1.0)] == ["good", "gray"]
    intents = entry("gray", weather_query=(1, 0)).intents
    peers.update([DirectoryEntry("gray", "http://gray-2:7700", 2.0, intents, 0.0)], 1.5)
    peers.probed("gray", 1.0)
    assert [p.domain for p in peers.candidates(TAG, 1.5)] == ["gray", "good"]
