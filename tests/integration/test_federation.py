"""Federation on loopback, with real processes: a directory, three domains' gateways
(``beijing``, ``shanghai``, ``chengdu``), agents in some of them (CONTRACT.md v1.1,
"Federation"). The same scenarios across network namespaces, with delays and cut links, are in
tests/e2e/test_federation_netns.py.

Each gateway publishes every 0.5 s (a summary is stale after 1.5 s); waits are on what the
gateways say they know (``GET /v1/federation``), bounded."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.federation_support import (
    INTERVAL,
    directory,
    domain_flags,
    federation,
    offered,
    send,
    wait_offered,
)
from tests.netns_support import DelayProxy
from tests.support import Proc, free_port, gateway, http, metric, start_agent, wait_until

TAG = "weather.query"


@dataclass
class Federation:
    directory: Proc
    beijing: Proc
    shanghai: Proc
    chengdu: Proc
    weather: Proc  # agent://weather-cn-01 at chengdu


@pytest.fixture(scope="module")
def fed() -> Iterator[Federation]:
    with ExitStack() as stack:
        d = stack.enter_context(directory())
        gws = {
            name: stack.enter_context(
                gateway(*domain_flags(name, d.url, "--heartbeat-interval", "1"))
            )
            for name in ("beijing", "shanghai", "chengdu")
        }
        weather = start_agent(gws["chengdu"].url, "agent://weather-cn-01", intents=TAG)
        stack.callback(weather.stop)
        wait_offered(gws["beijing"], "chengdu", TAG)
        wait_offered(gws["shanghai"], "chengdu", TAG)
        yield Federation(d, gws["beijing"], gws["shanghai"], gws["chengdu"], weather)


def test_a_request_no_local_agent_can_serve_lands_on_the_domain_that_can(fed: Federation) -> None:
    code, answer = send(
        fed.beijing, {"intent": TAG, "payload": {"city": "成都"}, "sender": "agent://planner-01"}
    )
    assert code == 200, answer
    assert answer["endpoint_id"] == "agent://weather-cn-01@chengdu"
    assert answer["result"]["agent"] == "agent://weather-cn-01"
    assert answer["result"]["payload"] == {"city": "成都"}
    # the receiving domain's delivery says where the request came from, and who sent it there
    assert answer["result"]["origin"] == "beijing"
    assert answer["result"]["sender"] == "agent://planner-01@beijing"
    # one attempt: the forward, with its domain; the ids travelled unchanged
    [attempt] = answer["attempts"]
    assert attempt["domain"] == "chengdu"
    assert attempt["endpoint_id"] == "agent://weather-cn-01@chengdu"
    assert attempt["outcome"] == "ok"
    assert answer["result"]["msg_id"] == answer["msg_id"]
    assert answer["result"]["trace_id"] == answer["trace_id"]
    assert metric(fed.beijing, "agent_reach_forwards_total", domain="chengdu", outcome="ok") >= 1


def test_a_local_agent_is_served_at_home_and_nothing_is_forwarded(fed: Federation) -> None:
    local = start_agent(fed.beijing.url, "agent://weather-bj-01", intents=TAG)
    try:
        before = metric(fed.beijing, "agent_reach_forwards_total", domain="chengdu", outcome="ok")
        for _ in range(5):
            code, answer = send(fed.beijing, {"intent": TAG})
            assert code == 200, answer
            assert answer["endpoint_id"] == "agent://weather-bj-01"
            assert "domain" not in answer["attempts"][0]
        after = metric(fed.beijing, "agent_reach_forwards_total", domain="chengdu", outcome="ok")
        assert after == before
    finally:
        local.stop()


def test_a_hint_with_a_domain_goes_to_that_domain_only(fed: Federation) -> None:
    code, answer = send(
        fed.beijing, {"intent": TAG, "recipient_hint": "agent://weather-cn-01@chengdu"}
    )
    assert code == 200, answer
    assert answer["endpoint_id"] == "agent://weather-cn-01@chengdu"
    assert answer["match"]["method"] == "hint"
    # the hint names an endpoint that domain does not have: its refusal, nothing elsewhere
    code, answer = send(fed.beijing, {"intent": TAG, "recipient_hint": "agent://nobody@chengdu"})
    assert code == 404, answer
    assert answer["error"] == "recipient_not_found"
    assert "chengdu" in answer["detail"]
    # a domain no summary names
    code, answer = send(fed.beijing, {"intent": TAG, "recipient_hint": "agent://x@nowhere"})
    assert code == 503, answer
    assert answer["error"] == "no_available_agent"
    # this gateway's own domain is this gateway's registry
    code, answer = send(
        fed.chengdu, {"intent": TAG, "recipient_hint": "agent://weather-cn-01@chengdu"}
    )
    assert code == 200, answer
    assert answer["endpoint_id"] == "agent://weather-cn-01"
    assert "domain" not in answer["attempts"][0]


def test_an_intent_no_domain_offers_is_refused_at_home(fed: Federation) -> None:
    code, answer = send(fed.beijing, {"intent": "joke.tell"})
    assert code == 404, answer
    assert answer["error"] == "no_capable_agent"
    assert answer["attempts"] == []


def test_summaries_carry_counts_only_and_the_federation_answer_shows_their_ages(
    fed: Federation,
) -> None:
    code, listing = http("GET", f"{fed.directory.url}/v1/summaries")
    assert code == 200, listing
    text = json.dumps(listing)
    assert "agent://" not in text  # no endpoint ids cross the boundary
    assert fed.weather.url.split("//")[1] not in text  # nor the agents' URLs
    chengdu = next(s for s in listing["summaries"] if s["domain"] == "chengdu")
    assert chengdu["intents"][TAG]["healthy"] == 1
    assert set(chengdu["intents"][TAG]) == {"healthy", "degraded", "p95_ms", "inflight"}
    assert chengdu["gateway_url"] == fed.chengdu.url
    answer = federation(fed.beijing)
    assert answer["domain"] == "beijing"
    assert answer["directory_ok"] is True
    assert answer["summary"]["domain"] == "beijing"
    peers = {p["domain"]: p for p in answer["peers"]}
    assert set(peers) == {"shanghai", "chengdu"}
    assert 0 <= peers["chengdu"]["age_s"] <= 3 * INTERVAL
    assert peers["chengdu"]["stale"] is False
    assert peers["chengdu"]["rtt_ms"] is not None


def test_a_forwarded_request_is_never_forwarded_again(fed: Federation) -> None:
    # shanghai has no weather agent; a request "from beijing" reaches it with X-Reach-Hops:
    # forwarding it to chengdu would cross a second boundary
    hop = {"X-Reach-Hops": "1", "X-Reach-Origin": "beijing"}
    delivered = metric(fed.shanghai, "agent_reach_forwards_total", domain="chengdu", outcome="ok")
    code, answer = send(fed.shanghai, {"intent": TAG}, headers=hop)
    assert code == 508, answer
    assert answer["error"] == "loop_detected"
    assert answer["attempts"] == []
    after = metric(fed.shanghai, "agent_reach_forwards_total", domain="chengdu", outcome="ok")
    assert after == delivered
    # two boundaries already, or coming back home: refused before anything is routed
    code, answer = send(fed.chengdu, {"intent": TAG}, headers={**hop, "X-Reach-Hops": "2"})
    assert (code, answer["error"]) == (508, "loop_detected")
    code, answer = send(fed.chengdu, {"intent": TAG}, headers={**hop, "X-Reach-Origin": "chengdu"})
    assert (code, answer["error"]) == (508, "loop_detected")
    # a hop to the domain that has the agent is served there
    code, answer = send(fed.chengdu, {"intent": TAG}, headers=hop)
    assert code == 200, answer
    assert answer["result"]["origin"] == "beijing"
    # headers that do not parse: the field named, nothing done
    for bad in (
        {"X-Reach-Hops": "one", "X-Reach-Origin": "beijing"},
        {"X-Reach-Hops": "1"},
        {"X-Reach-Hops": "1" * 5000, "X-Reach-Origin": "beijing"},
        {"X-Reach-Hops": "-1", "X-Reach-Origin": "beijing"},
    ):
        code, answer = send(fed.chengdu, {"intent": TAG}, headers=bad)
        assert (code, answer["error"]) == (422, "invalid_request"), answer


def test_the_origin_trace_holds_the_remote_events(fed: Federation) -> None:
    code, answer = send(fed.beijing, {"intent": TAG})
    assert code == 200, answer
    trace_id = answer["trace_id"]
    code, trace = http("GET", f"{fed.beijing.url}/v1/traces/{trace_id}")
    assert code == 200, trace
    kinds = [(e.get("from_domain"), e["kind"]) for e in trace["events"]]
    assert (None, "received") in kinds
    assert (None, "route") in kinds
    assert ("chengdu", "received") in kinds  # the same trace id on the other gateway
    assert ("chengdu", "attempt") in kinds  # its attempt at the agent
    route = next(e for e in trace["events"] if e["kind"] == "route" and "from_domain" not in e)
    assert route["forward"] is True and route["domains"] == ["chengdu"]
    forward = next(e for e in trace["events"] if e["kind"] == "attempt" and "from_domain" not in e)
    assert forward["domain"] == "chengdu"
    assert forward["endpoint_id"] == "agent://weather-cn-01@chengdu"
    ts = [e["ts"] for e in trace["events"]]
    assert ts == sorted(ts)
    # the dashboard's list of recent requests names the remote endpoint with its domain
    code, recent = http("GET", f"{fed.beijing.url}/v1/traces?limit=20")
    assert code == 200, recent
    mine = next(t for t in recent["traces"] if t["trace_id"] == trace_id)
    assert mine["endpoint_id"] == "agent://weather-cn-01@chengdu", mine
    # the receiving gateway's own trace, read there, has its part only
    code, remote = http("GET", f"{fed.chengdu.url}/v1/traces/{trace_id}")
    assert code == 200
    assert all("from_domain" not in e for e in remote["events"])
    assert remote["events"][0]["origin"] == "beijing"


def test_a_domain_whose_agents_are_unroutable_forwards_to_one_whose_are_not(
    fed: Federation,
) -> None:
    # shanghai has a weather agent that stops: once it is suspect there, shanghai forwards
    agent = start_agent(fed.shanghai.url, "agent://weather-sh-01", intents=TAG)
    code, answer = send(fed.shanghai, {"intent": TAG})
    assert (code, answer["endpoint_id"]) == (200, "agent://weather-sh-01")
    agent.popen.send_signal(signal.SIGSTOP)
    try:

        def forwarded() -> bool:
            code, answer = send(fed.shanghai, {"intent": TAG, "timeout_ms": 3000})
            return code == 200 and answer["endpoint_id"] == "agent://weather-cn-01@chengdu"

        wait_until(forwarded, timeout=10)  # suspect after 2 heartbeat intervals (2 s)
    finally:
        agent.popen.send_signal(signal.SIGCONT)
        agent.stop()


def test_the_directory_away_then_restarted_loses_nothing_the_next_interval_does_not_repair(
    fed: Federation,
) -> None:
    # a directory of its own here: the module's stays up for the other tests
    with directory() as d1:
        port = d1.url.rsplit(":", 1)[1]
        with ExitStack() as stack:
            a = stack.enter_context(gateway(*domain_flags("east", d1.url)))
            b = stack.enter_context(gateway(*domain_flags("west", d1.url)))
            agent = start_agent(b.url, "agent://weather-w-01", intents=TAG)
            stack.callback(agent.stop)
            wait_offered(a, "west", TAG)
            d1.stop(signal.SIGKILL)
            # for up to 3 intervals the last summaries are used: forwarding goes on
            code, answer = send(a, {"intent": TAG})
            assert code == 200, answer
            wait_until(lambda: federation(a)["directory_ok"] is False, timeout=5)
            assert offered(a, "west", TAG) or federation(a)["peers"][0]["stale"]
            # past 3 intervals the summary is stale: not used, a clean refusal at once
            wait_until(lambda: federation(a)["peers"][0]["stale"], timeout=5)
            started = time.monotonic()
            code, answer = send(a, {"intent": TAG})
            assert (code, answer["error"]) == (404, "no_capable_agent"), answer
            assert time.monotonic() - started < 1.0
            # a new, empty directory at the same address: the next rounds repair the view
            with directory("--port", port):
                wait_offered(a, "west", TAG, timeout=5)
                code, answer = send(a, {"intent": TAG})
                assert code == 200, answer
                assert answer["endpoint_id"] == "agent://weather-w-01@west"


def test_words_match_another_domains_tag_when_no_local_one_is_near_enough(
    fed: Federation, tmp_path: Path
) -> None:
    # a fourth domain with a dictionary and the lexical matcher: its words find chengdu's tag
    dictionary = tmp_path / "intents.toml"
    dictionary.write_text(
        "[[intent]]\n"
        'tag = "weather.query"\n'
        'description = "the weather forecast for a city and a day"\n'
        'examples = ["what is the weather in chengdu tomorrow"]\n'
    )
    flags = domain_flags("xian", fed.directory.url, "--intents", str(dictionary))
    flags = tuple("lexical" if f == "none" else f for f in flags)  # its --matcher
    with gateway(*flags) as xian:
        wait_offered(xian, "chengdu", TAG)
        code, answer = send(xian, {"intent_text": "what is the weather in chengdu tomorrow"})
        assert code == 200, answer
        assert answer["endpoint_id"] == "agent://weather-cn-01@chengdu"
        assert answer["match"]["method"] == "lexical"
        assert answer["match"]["tag"] == TAG
        # the receiving domain routed the exact tag: it did not guess again
        assert answer["result"]["match"] == ["exact", 1.0]
        assert answer["result"]["intent_text"] == "what is the weather in chengdu tomorrow"
        # words near nothing: refused at home, nothing forwarded
        code, answer = send(xian, {"intent_text": "tell me a joke"})
        assert (code, answer["error"]) == (404, "no_capable_agent"), answer
        assert answer["attempts"] == []


def test_on_loopback_the_nearest_domain_serves_and_a_cut_link_fails_over_in_deadline(
    fed: Federation,
) -> None:
    # the netns scenarios (tests/e2e/test_federation_netns.py) on loopback: each domain's
    # gateway advertises a delaying proxy in front of it, so the round trips differ, and a cut
    # of the proxy holds every byte (requests hang, as on a dropped link)
    timeout_ms = 1500
    with ExitStack() as stack:
        proxies, gws = {}, {}
        for name, delay in (("near", 2.0), ("far", 30.0)):
            port = free_port()
            proxy = stack.enter_context(DelayProxy(f"http://127.0.0.1:{port}", delay_ms=delay))
            flags = domain_flags(
                name, fed.directory.url, "--port", str(port), "--advertise-url", proxy.url
            )
            gws[name] = stack.enter_context(gateway(*flags))
            agent = start_agent(gws[name].url, f"agent://weather-{name}-01", intents=TAG)
            stack.callback(agent.stop)
            proxies[name] = proxy
        origin = stack.enter_context(gateway(*domain_flags("origin", fed.directory.url)))

        def measured() -> bool:
            peers = {p["domain"]: p for p in federation(origin)["peers"]}
            rtt = [peers.get(d, {}).get("rtt_ms") for d in ("near", "far")]
            return None not in rtt and rtt[0] * 2 < rtt[1]

        wait_until(measured, timeout=10)
        for _ in range(10):
            code, answer = send(origin, {"intent": TAG, "timeout_ms": timeout_ms})
            assert code == 200, answer
            # chengdu (the module's) is as near as "near": either, never the far one
            assert answer["endpoint_id"] != "agent://weather-far-01@far", answer
        fed.weather.popen.send_signal(signal.SIGSTOP)  # the module's chengdu out of the way
        try:
            wait_until(lambda: not offered(origin, "chengdu", TAG), timeout=10)
            code, answer = send(origin, {"intent": TAG})
            assert answer["endpoint_id"] == "agent://weather-near-01@near", answer
            proxies["near"].cut()
            cut_at = time.monotonic()
            late, served = [], []
            while time.monotonic() - cut_at < 4.0:
                started = time.monotonic()
                code, answer = send(origin, {"intent": TAG, "timeout_ms": timeout_ms})
                took_ms = (time.monotonic() - started) * 1000.0
                if took_ms > timeout_ms + 50:
                    late.append(took_ms)
                if code != 200:
                    assert answer["error"] == "deadline_exceeded", answer
                else:
                    served.append(answer["endpoint_id"])
            assert not late, late
            # the near domain's probe failed: the far one serves, within the same deadlines
            assert served and served[-1] == "agent://weather-far-01@far", served
            assert "agent://weather-near-01@near" not in served
            proxies["near"].restore()
            # reachable again, and nearer again once the probes' moving average comes down
            wait_until(lambda: offered(origin, "near", TAG) and measured(), timeout=15)
            code, answer = send(origin, {"intent": TAG})
            assert answer["endpoint_id"] == "agent://weather-near-01@near", answer
        finally:
            fed.weather.popen.send_signal(signal.SIGCONT)


def test_a_refused_connection_to_a_domain_fails_over_in_the_same_request(
    fed: Federation,
) -> None:
    # the passive check applies to peers: a refused connection marks the domain unreachable at
    # once, and the request goes on to the next domain within its one deadline
    with ExitStack() as stack:
        proxies, gws = {}, {}
        for name, delay in (("first", 0.0), ("second", 20.0)):
            port = free_port()
            proxy = stack.enter_context(DelayProxy(f"http://127.0.0.1:{port}", delay_ms=delay))
            flags = domain_flags(
                name, fed.directory.url, "--port", str(port), "--advertise-url", proxy.url
            )
            gws[name] = stack.enter_context(gateway(*flags))
            agent = start_agent(gws[name].url, f"agent://pager-{name}-01", intents="page.send")
            stack.callback(agent.stop)
            proxies[name] = proxy
        # its probes every 3 s: the request below meets the refused connection itself (a probe
        # in between would take the domain out first, and no forward would try it)
        flags = domain_flags("pager-origin", fed.directory.url)
        flags = tuple("3" if f == str(INTERVAL) else f for f in flags)
        origin = stack.enter_context(gateway(*flags))

        def ordered() -> bool:
            peers = {p["domain"]: p for p in federation(origin)["peers"]}
            rtt = [peers.get(d, {}).get("rtt_ms") for d in ("first", "second")]
            return None not in rtt and rtt[0] * 2 < rtt[1]

        def ready() -> bool:
            # both summaries list the agent (a round trip measured says nothing of that: the
            # origin's first read of the directory may predate the second agent's registration)
            return all(offered(origin, d, "page.send") for d in ("first", "second")) and ordered()

        wait_until(ready, timeout=15)
        code, answer = send(origin, {"intent": "page.send"})
        assert answer["endpoint_id"] == "agent://pager-first-01@first", answer
        proxies["first"].cut(refuse=True)
        code, answer = send(origin, {"intent": "page.send", "timeout_ms": 3000})
        assert code == 200, (answer, federation(origin)["peers"])  # the view, if it recurs
        assert answer["endpoint_id"] == "agent://pager-second-01@second"
        outcomes = [(a["domain"], a["outcome"]) for a in answer["attempts"]]
        assert outcomes == [("first", "connect_error"), ("second", "ok")], outcomes
        # ejected: the next request goes to the second domain straight away
        code, answer = send(origin, {"intent": "page.send"})
        assert [a["domain"] for a in answer["attempts"]] == ["second"], answer
        peer = next(p for p in federation(origin)["peers"] if p["domain"] == "first")
        assert peer["reachable"] is False and peer["unreachable_reason"]
        assert (
            metric(origin, "agent_reach_forwards_total", domain="first", outcome="connect_error")
            == 1
        )
        # a probe that answers brings it back
        proxies["first"].restore()
        wait_until(ready, timeout=20)
        code, answer = send(origin, {"intent": "page.send"})
        assert answer["endpoint_id"] == "agent://pager-first-01@first", answer


def test_a_trace_id_is_fetched_from_the_other_domain_as_one_path_segment(
    fed: Federation,
) -> None:
    # a caller-chosen trace id with URL syntax in it reads its own remote events, never
    # another trace's (VICTIM?x must not be fetched as VICTIM)
    code, victim = send(fed.beijing, {"intent": TAG, "trace_id": "victim-trace"})
    assert code == 200, victim
    code, answer = send(fed.beijing, {"intent": TAG, "trace_id": "victim-trace?x"})
    assert code == 200, answer
    code, trace = http("GET", f"{fed.beijing.url}/v1/traces/victim-trace%3Fx")
    assert code == 200, trace
    remote = [e for e in trace["events"] if e.get("from_domain") == "chengdu"]
    received = [e for e in remote if e["kind"] == "received"]
    assert [e["msg_id"] for e in received] == [answer["msg_id"]], remote


class GrayGateway(BaseHTTPRequestHandler):
    """Another domain's gateway in a gray failure: /healthz answers at once (its probes pass),
    a forwarded send gets no answer (held until the test ends)."""

    released = threading.Event()

    def do_GET(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.released.wait(30)
        self.close_connection = True

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def gray_domain(directory_url: str, domain: str, tag: str) -> Iterator[str]:
    """A GrayGateway, its summary (one healthy endpoint for ``tag``) published to the
    directory every interval as a gateway would; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), GrayGateway)
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}"
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            summary = {
                "domain": domain,
                "gateway_url": url,
                "at": time.time(),
                "intents": {tag: {"healthy": 1, "degraded": 0, "p95_ms": None, "inflight": 0}},
            }
            http("PUT", f"{directory_url}/v1/summaries/{domain}", summary, timeout=5)
            stop.wait(INTERVAL)

    threads = [
        threading.Thread(target=server.serve_forever, daemon=True),
        threading.Thread(target=publish, daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield url
    finally:
        stop.set()
        GrayGateway.released.set()
        server.shutdown()
        server.server_close()


def test_a_domain_whose_sends_hang_while_its_probes_pass_is_tried_last(fed: Federation) -> None:
    # "gray" is nearer than "steady" (whose gateway sits behind a 20 ms proxy): first by the
    # contract's order. Its sends hang; after three forwards in a row left without an answer,
    # it is tried after every other domain, and requests go straight to "steady".
    tag = "ledger.post"
    with ExitStack() as stack:
        GrayGateway.released.clear()
        stack.enter_context(gray_domain(fed.directory.url, "gray", tag))
        port = free_port()
        proxy = stack.enter_context(DelayProxy(f"http://127.0.0.1:{port}", delay_ms=20.0))
        flags = domain_flags("steady", fed.directory.url, "--port", str(port))
        steady = stack.enter_context(gateway(*flags, "--advertise-url", proxy.url))
        agent = start_agent(steady.url, "agent://ledger-steady-01", intents=tag)
        stack.callback(agent.stop)
        origin = stack.enter_context(gateway(*domain_flags("ledger-origin", fed.directory.url)))

        def ordered() -> bool:
            peers = {p["domain"]: p for p in federation(origin)["peers"]}
            rtt = [peers.get(d, {}).get("rtt_ms") for d in ("gray", "steady")]
            return (
                offered(origin, "gray", tag)
                and offered(origin, "steady", tag)
                and None not in rtt
                and rtt[0] * 2 < rtt[1]
            )

        wait_until(ordered, timeout=15)
        body = {"intent": tag, "timeout_ms": 6000}
        with ThreadPoolExecutor(3) as pool:  # three at once: each waits out its per-try timeout
            first = list(pool.map(lambda _: send(origin, body), range(3)))
        for code, answer in first:
            assert code == 200, answer
            outcomes = [(a["domain"], a["outcome"]) for a in answer["attempts"]]
            assert outcomes == [("gray", "timeout"), ("steady", "ok")], outcomes
        assert any(e.get("event") == "federation.peer_tried_last" for e in origin.log_lines())
        for _ in range(5):
            started = time.monotonic()
            code, answer = send(origin, body)
            assert code == 200, answer
            assert [a["domain"] for a in answer["attempts"]] == ["steady"], answer
            assert time.monotonic() - started < 1.0
        peer = next(p for p in federation(origin)["peers"] if p["domain"] == "gray")
        assert peer["reachable"] is True  # its probes pass all along: not the passive check


def test_a_domain_whose_summary_the_directory_refuses_still_forwards_to_the_others() -> None:
    # the directory takes summaries of 2 KB at most; "bulky" registers 40 tags, so its summary
    # is refused (413) at every round. Publishing and reading the others are one call: it
    # still reads theirs (GET /v1/summaries), and forwards to them, instead of losing them
    # all 3 intervals later.
    with ExitStack() as stack:
        d = stack.enter_context(directory("--max-body-bytes", "2048"))
        small = stack.enter_context(gateway(*domain_flags("small", d.url)))
        agent = start_agent(small.url, "agent://tiny-01", intents="tiny.job")
        stack.callback(agent.stop)
        bulky = stack.enter_context(gateway(*domain_flags("bulky", d.url)))
        tags = [f"bulky.capability-number-{i:03d}" for i in range(40)]
        register = {"endpoint_id": "agent://bulky-01", "capabilities": tags}
        register["endpoint_url"] = "http://127.0.0.1:9/bulky"
        code, answer = http("POST", f"{bulky.url}/v1/register", register)
        assert code == 200, answer
        wait_until(lambda: "HTTP 413" in (federation(bulky)["directory_error"] or ""), timeout=10)
        refused_at = time.monotonic()
        # past the 1.5 s a summary stays fresh: read again since the refusals began
        wait_until(
            lambda: (
                time.monotonic() - refused_at > 3 * INTERVAL + 0.5
                and offered(bulky, "small", "tiny.job")
            ),
            timeout=10,
        )
        code, answer = send(bulky, {"intent": "tiny.job"})
        assert code == 200 and answer["endpoint_id"] == "agent://tiny-01@small", answer
        view = federation(bulky)
        assert view["directory_ok"] is False and "413" in view["directory_error"]
        assert not offered(small, "bulky", tags[0])  # its own summary never got through


def test_an_a2a_follow_up_to_another_domains_agent_says_so(fed: Federation) -> None:
    """A review: a conversation answered through another domain was owned by
    ``agent://NAME@DOMAIN``, never in the local registry, so its follow-up was refused as
    "no longer registered" though the agent was alive. A forward carries no A2A context, so
    the conversation cannot go on from here: the refusal now says where the owner is."""
    url = f"{fed.beijing.url}/a2a"

    def say(n: int) -> dict[str, object]:
        message = {
            "messageId": f"m-fed-{n}",
            "role": "ROLE_USER",
            "contextId": "conv-fed-01",
            "parts": [{"data": {"city": "成都"}}],
            "metadata": {"intent": TAG},
        }
        call = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": message}}
        status, answer = http("POST", url, call, headers={"A2A-Version": "1.0"})
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    first = say(1)
    assert first["result"]["message"]["metadata"]["endpoint_id"] == "agent://weather-cn-01@chengdu"
    refused = say(2)["error"]
    assert refused["code"] == -32001, refused
    assert "agent://weather-cn-01@chengdu, is in another domain" in refused["message"]
