"""The gateway's NATS side under real faults: agents killed and restarted, the nats-server
killed, paused and restarted under load, agents that cannot keep up, a server that cuts the
gateway off as a slow consumer, and replies nats-py cannot read.

Real processes throughout: gateways (tests/support.py), plain nats-py agents
(tests/agents/bus_echo.py), SDK agents over HTTP (tests/support.start_agent), nats-server (the
shared one, or a private one on a free port where a test stops it). Every wait is on a condition
with a bound; the one deliberate wait is the length of an outage, which is the fault itself.
Each test prints what it measured (``-s``).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from nats import errors as nats_errors

from tests.nats_support import (
    NATS_URL,
    Bus,
    PrivateNats,
    hpub,
    new_prefix,
    private_server,
    raw_connection,
    start_bus_echo,
    unique,
)
from tests.support import Proc, gateway, health, http, metric, start_agent, wait_until

# the errors a send may end with when its agents or the link fail: routing outcomes of the
# contract, never a fault of the gateway (500)
FAULT_ANSWERS = {
    502: {"all_attempts_failed", "agent_error"},
    503: {"no_available_agent"},
    504: {"deadline_exceeded"},
}
SLACK_S = 0.75  # scheduling on a loaded 2-core machine, on top of a stated bound


@pytest.fixture
def server() -> Iterator[PrivateNats]:
    with private_server() as private:  # resumed first, were it paused, so that it can die
        yield private


def send(gw: Proc, intent: str, **fields: Any) -> tuple[int, dict[str, Any]]:
    status, body = http("POST", f"{gw.url}/v1/send", {"intent": intent, **fields}, timeout=30)
    assert isinstance(body, dict), body
    return status, body


def tried(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The attempts of an answer: (endpoint, outcome)."""
    return [(a["endpoint_id"], a["outcome"]) for a in body["attempts"]]


def traced(gw: Proc, trace_id: str) -> list[tuple[str, str, str]]:
    """The attempt events of a trace: (endpoint, outcome, detail)."""
    status, trace = http("GET", f"{gw.url}/v1/traces/{trace_id}")
    assert status == 200, trace
    return [
        (e["endpoint_id"], e["outcome"], e["detail"])
        for e in trace["events"]
        if e["kind"] == "attempt"
    ]


def eligible(gw: Proc, intent: str, endpoint_id: str) -> bool:
    rows = [c for c in route(gw, intent) if c["endpoint_id"] == endpoint_id]
    return bool(rows and rows[0]["eligible"])


def route(gw: Proc, intent: str) -> list[dict[str, Any]]:
    return list(http("GET", f"{gw.url}/v1/route?intent={intent}")[1]["candidates"])


def registered(gw: Proc) -> set[str]:
    return {a["endpoint_id"] for a in http("GET", f"{gw.url}/v1/agents")[1]["agents"]}


def no_responders(subject: str) -> bool:
    """Whether the shared server says nobody serves ``subject`` (it drops a dead client's
    subscriptions when it sees its connection close)."""
    caller = Bus()
    try:
        caller.request(subject, {}, wait_s=0.5)
    except nats_errors.NoRespondersError:
        return True
    except nats_errors.TimeoutError:
        return False
    finally:
        caller.close()
    return False


def warm(gw: Proc, intent: str, n: int) -> None:
    """Send until each of the ``n`` agents of ``intent`` has answered once: the router then
    knows their latencies (one never tried costs nothing, and would take the next request)."""
    answered: set[str] = set()

    def step() -> bool:
        status, answer = send(gw, intent)
        assert status == 200, answer
        answered.add(answer["endpoint_id"])
        return len(answered) == n

    wait_until(step, 20)


def check_fault_answer(status: int, body: dict[str, Any]) -> None:
    assert status in FAULT_ANSWERS, (status, body)
    assert body["ok"] is False and body["error"] in FAULT_ANSWERS[status], body
    assert isinstance(body["detail"], str) and {"msg_id", "trace_id", "attempts"} <= set(body)


# --- failover between a NATS agent and its HTTP twin -----------------------------------------


def test_failover_from_a_nats_agent_to_its_http_twin_and_back() -> None:
    """The router's load-aware choice steers the first try (the faster agent; one that failed
    costs more for a while), so that each kill is met by a request that tries the dead agent
    first and is answered by its twin in the same request."""
    prefix, subject = new_prefix(), unique("twin")
    mine, twin_id = "agent://twin-nats", "agent://twin-http"
    on_nats = ["--register-nats", prefix, "--id", mine, "--intents", "twin.echo"]
    on_nats += ["--heartbeat-s", "0.5"]
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "2") as gw:
        agent = start_bus_echo(NATS_URL, subject, *on_nats)
        twin = start_agent(gw.url, twin_id, "slow", intents="twin.echo", delay_ms=40)
        try:
            wait_until(lambda: registered(gw) == {mine, twin_id}, 10)
            # once both have answered, the NATS agent answering in ~1 ms takes the work from
            # the twin answering in 40
            warm(gw, "twin.echo", 2)
            for _ in range(2):
                assert send(gw, "twin.echo")[1]["endpoint_id"] == mine

            agent.kill()  # gone: nobody subscribes to its subject any more
            wait_until(lambda: no_responders(subject), 5)  # the server has seen it go
            status, answer = send(gw, "twin.echo", payload={"n": 1})
            assert status == 200, answer
            assert tried(answer) == [(mine, "connect_error"), (twin_id, "ok")], answer
            assert answer["endpoint_id"] == twin_id and answer["result"]["payload"] == {"n": 1}
            events = traced(gw, answer["trace_id"])
            assert [(e, o) for e, o, _ in events] == tried(answer)
            assert f"no responders on {subject}" in events[0][2], events
            assert not eligible(gw, "twin.echo", mine)  # out of routing at once
            for _ in range(3):
                assert tried(send(gw, "twin.echo")[1]) == [(twin_id, "ok")]

            # back, it registers again and is eligible again; its registration (a heartbeat)
            # clears what the failure cost it, so the faster agent takes the work back at once
            agent = start_bus_echo(NATS_URL, subject, *on_nats)
            wait_until(lambda: eligible(gw, "twin.echo", mine), 10)
            sent_to_mine = 0
            for _ in range(5):
                status, answer = send(gw, "twin.echo")
                assert status == 200, answer
                sent_to_mine += answer["endpoint_id"] == mine
            assert sent_to_mine >= 4, route(gw, "twin.echo")
            twin.popen.kill()
            twin.popen.wait(10)
            for _ in range(3):  # the twin gone: nothing is lost
                status, answer = send(gw, "twin.echo")
                assert status == 200, answer
                assert answer["endpoint_id"] == mine, answer
                sent_to_mine += 1
            assert answer["result"]["pid"] == agent.pid
            handled = agent.stop()["handled"]
            assert handled == sent_to_mine, handled  # the second process answered exactly those
        finally:
            agent.stop()
            twin.stop()


# --- the nats-server restarted under load ------------------------------------------------------


@dataclass
class Outcome:
    started: float
    ended: float
    status: int
    body: dict[str, Any]


class Load:
    """``senders`` threads sending ``intent`` over HTTP until stopped (at most ``limit`` each)."""

    def __init__(self, gw: Proc, intent: str, senders: int, timeout_ms: int, limit: int) -> None:
        self.gw, self.intent, self.timeout_ms, self.limit = gw, intent, timeout_ms, limit
        self.done: list[Outcome] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(senders)
        self._running = [self._pool.submit(self._sender, i) for i in range(senders)]

    def _sender(self, n: int) -> None:
        for i in range(self.limit):
            if self._stop.is_set():
                return
            started = time.monotonic()
            payload = {"sender": n, "i": i}
            status, body = send(self.gw, self.intent, payload=payload, timeout_ms=self.timeout_ms)
            self.done.append(Outcome(started, time.monotonic(), status, body))

    def ok_after(self, t: float) -> int:
        return sum(1 for o in list(self.done) if o.started > t and o.status == 200)

    def failed_after(self, t: float) -> int:
        return sum(1 for o in list(self.done) if o.started > t and o.status != 200)

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for running in self._running:
            running.result(30)
        self._pool.shutdown()
        return sorted(self.done, key=lambda o: o.started)


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_nats_server_restarted_under_load_is_recovered_from_without_restarts(
    server: PrivateNats, kill: int
) -> None:
    prefix = new_prefix()
    deadline_s = 2.0
    with gateway("--nats", server.url, "--nats-prefix", prefix, "--heartbeat-interval", "2") as gw:
        agents = [
            start_bus_echo(
                server.url,
                unique(f"load{i}"),
                *("--register-http", gw.url, "--id", f"agent://load-{i}"),
                *("--intents", "load.echo", "--heartbeat-s", "0.5"),
            )
            for i in range(2)
        ]
        try:
            wait_until(lambda: registered(gw) == {"agent://load-0", "agent://load-1"}, 10)
            began = time.monotonic()
            load = Load(gw, "load.echo", senders=8, timeout_ms=int(deadline_s * 1000), limit=20_000)
            try:
                wait_until(lambda: load.ok_after(began) >= 100, 10)  # under load
                down_at = time.monotonic()
                server.stop(kill)
                wait_until(lambda: not health(gw)["nats"]["connected"], 5)
                # the outage: about a second, during which sends fail
                wait_until(
                    lambda: time.monotonic() - down_at >= 1.0 and load.failed_after(down_at) > 0,
                    10,
                )
                server.start()
                up_at = time.monotonic()
                wait_until(lambda: load.ok_after(up_at) >= 1, 10)
                recovered_at = min(
                    o.started for o in list(load.done) if o.started > up_at and o.status == 200
                )
                # then load again past the recovery, to the 6 s planned
                wait_until(
                    lambda: time.monotonic() - began >= 6 and load.ok_after(recovered_at) >= 100,
                    15,
                )
            finally:
                done = load.stop()
            state = health(gw)["nats"]
            failures = [o for o in done if o.status != 200]
            codes = Counter(f"{o.status} {o.body.get('error')}" for o in failures)
            print(
                f"\n{len(done)} sends, {len(failures)} failed {dict(codes)};"
                f" outage {up_at - down_at:.2f} s; sends succeed again"
                f" {recovered_at - up_at:.2f} s after the server is back;"
                f" longest send {max(o.ended - o.started for o in done):.2f} s;"
                f" gateway reconnects {state['reconnects']}"
            )
            assert recovered_at - up_at < 5.0  # nats-py waits 1 s between tries of a server
            assert state["connected"] is True and state["reconnects"] >= 1, state
            assert state["server"] == server.url
            for o in failures:
                check_fault_answer(o.status, o.body)
                # only inside the outage (to the first send that succeeds again), plus one
                # deadline on either side
                window = (down_at - deadline_s - SLACK_S, recovered_at + deadline_s + SLACK_S)
                assert window[0] <= o.started <= window[1], (
                    o.started - down_at,
                    o.body,
                )
            for o in done:  # nothing outlives its deadline
                assert o.ended - o.started <= deadline_s + SLACK_S, o
            assert failures, "the outage went unnoticed: the test did not test"
            assert metric(gw, "agent_reach_nats_connected") == 1
        finally:
            for agent in agents:
                agent.stop()


# --- requests in flight when the link drops ---------------------------------------------------


@pytest.mark.parametrize("fault", ["killed", "paused"])
def test_requests_in_flight_when_the_link_drops_end_within_their_deadline(
    server: PrivateNats, fault: str
) -> None:
    """``killed``: the server dies (the gateway sees its connection close). ``paused``: it stops
    answering without a word (SIGSTOP: a half-open link the gateway cannot see for a ping
    interval or two). Either way every send in flight ends by its deadline, with an error of
    the contract, and the gateway goes on serving HTTP."""
    prefix = new_prefix()
    deadline_s = 2.5
    with gateway("--nats", server.url, "--nats-prefix", prefix, "--heartbeat-interval", "30") as gw:
        agent = start_bus_echo(
            server.url,
            unique("held"),
            *("--register-http", gw.url, "--id", "agent://held-1", "--intents", "held.echo"),
            "--delay-ms",
            "10000",  # it holds every request: they are all in flight when the link drops
        )
        try:
            wait_until(lambda: registered(gw) == {"agent://held-1"}, 10)
            with ThreadPoolExecutor(6) as pool:

                def one(i: int) -> tuple[float, int, dict[str, Any]]:
                    started = time.monotonic()
                    status, body = send(
                        gw, "held.echo", payload={"i": i}, timeout_ms=int(deadline_s * 1000)
                    )
                    return time.monotonic() - started, status, body

                flying = [pool.submit(one, i) for i in range(6)]
                wait_until(lambda: http("GET", f"{gw.url}/v1/inflight")[1]["total"] == 6, 5)
                if fault == "killed":
                    server.stop(signal.SIGKILL)
                else:
                    server.signal(signal.SIGSTOP)
                started = time.monotonic()
                assert http("GET", f"{gw.url}/healthz", timeout=2)[0] == 200  # HTTP serves
                assert time.monotonic() - started < 1.0
                ended = [f.result(deadline_s + 10) for f in flying]
            print(f"\n{fault}: {[(round(t, 2), b.get('error')) for t, _, b in ended]}")
            for took, status, body in ended:
                assert took <= deadline_s + SLACK_S, (took, body)
                check_fault_answer(status, body)
                outcomes = {o for _, o in tried(body)}
                assert outcomes <= {"timeout", "connect_error"}, body
            assert http("GET", f"{gw.url}/v1/inflight")[1]["total"] == 0
        finally:
            if fault == "paused":
                server.signal(signal.SIGCONT)  # the gateway then stops without waiting it out
            agent.kill()


# --- agents that cannot keep up -----------------------------------------------------------------


def _burst(
    gw: Proc, intent: str, n: int, timeout_ms: int
) -> list[tuple[float, int, dict[str, Any]]]:
    def one(i: int) -> tuple[float, int, dict[str, Any]]:
        started = time.monotonic()
        status, body = send(gw, intent, payload={"i": i}, timeout_ms=timeout_ms)
        return time.monotonic() - started, status, body

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_a_responder_past_its_max_inflight_is_failed_over_within_the_deadline() -> None:
    """An agent that answers 503 past one request in hand (as NatsLink's responders do past
    max_inflight): its 503 is a server_error, retried on the other agent, within the deadline.
    The full agent answers in 200 ms, the other in 1 s: the load-aware choice sends the first
    two requests of a burst to the faster one, so that it is asked past its bound."""
    prefix, deadline_s = new_prefix(), 5.0
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "30") as gw:
        common = ("--register-http", gw.url, "--intents", "busy.echo")
        full = start_bus_echo(
            NATS_URL,
            unique("full"),
            *common,
            *("--id", "agent://busy-full", "--max-inflight", "1", "--delay-ms", "200"),
        )
        roomy = start_bus_echo(
            NATS_URL, unique("roomy"), *common, "--id", "agent://busy-roomy", "--delay-ms", "1000"
        )
        try:
            wait_until(lambda: len(registered(gw)) == 2, 10)
            warm(gw, "busy.echo", 2)
            ended = _burst(gw, "busy.echo", 6, int(deadline_s * 1000))
            stopped = full.stop()
            print(f"\nbusy answers {stopped['busy']}; attempts {[tried(b) for _, _, b in ended]}")
            for took, status, body in ended:
                assert status == 200, body
                assert took <= deadline_s + SLACK_S, (took, body)
            failed_over = [
                b
                for _, _, b in ended
                if tried(b) == [("agent://busy-full", "server_error"), ("agent://busy-roomy", "ok")]
            ]
            assert failed_over and stopped["busy"] == len(failed_over), (stopped, ended)
        finally:
            full.stop()
            roomy.stop()


def test_a_consumer_that_does_not_read_fast_enough_is_failed_over_within_the_deadline() -> None:
    """An agent that handles one request at a time with a backlog of one: nats-py drops what
    comes past it (a slow consumer). Those requests time out at the gateway (per-try timeout:
    2 s) and are retried on the other agent, within the 5 s deadline. The slow consumer answers
    in 300 ms, the other in 1 s: the load-aware choice sends it three or more of a burst."""
    prefix, deadline_s = new_prefix(), 5.0
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "30") as gw:
        common = ("--register-http", gw.url, "--intents", "lag.echo")
        slow = start_bus_echo(
            NATS_URL,
            unique("slow"),
            *common,
            *("--id", "agent://lag-slow", "--serial", "--pending-msgs", "1", "--delay-ms", "300"),
        )
        other = start_bus_echo(
            NATS_URL, unique("other"), *common, "--id", "agent://lag-other", "--delay-ms", "1000"
        )
        try:
            wait_until(lambda: len(registered(gw)) == 2, 10)
            warm(gw, "lag.echo", 2)
            ended = _burst(gw, "lag.echo", 6, int(deadline_s * 1000))
            stopped = slow.stop()
            print(
                f"\nslow consumer drops {stopped['slow_consumer']}, answered {stopped['handled']};"
                f" attempts {[tried(b) for _, _, b in ended]}"
            )
            for took, status, body in ended:
                assert status == 200, body
                assert took <= deadline_s + SLACK_S, (took, body)
            timed_out = [
                b
                for _, _, b in ended
                if tried(b) == [("agent://lag-slow", "timeout"), ("agent://lag-other", "ok")]
            ]
            assert timed_out, [tried(b) for _, _, b in ended]
            assert stopped["slow_consumer"] >= len(timed_out), stopped
        finally:
            slow.stop()
            other.stop()


def test_a_gateway_the_server_cuts_off_as_a_slow_consumer_reconnects_and_serves() -> None:
    """The gateway's own API falling behind. nats-py's client-side limits (512k messages or
    128 MB pending per subscription, which NatsLink does not lower) are out of reach: the
    gateway's responders take each request off the queue at once, so ``nats.slow_consumers``
    is not driven here. What happens first is the server's limit: a gateway that stops
    reading (SIGSTOP) while its subjects are flooded has its connection cut by the server as a
    slow consumer (``max_pending`` 256 KB here); it reconnects and serves again, untouched."""
    config = 'max_payload: 65536\nmax_pending: 262144\nwrite_deadline: "1s"'
    prefix = new_prefix()
    with (
        private_server(config) as server,
        gateway("--nats", server.url, "--nats-prefix", prefix) as gw,
    ):
        flood = json.dumps({"endpoint_id": "agent://flood-" + "x" * 200}).encode()
        gw.popen.send_signal(signal.SIGSTOP)
        try:
            sock, reader = raw_connection(server.url)
            with sock, reader:
                batch = b"".join(
                    hpub(f"{prefix}.v1.heartbeat", b"_INBOX.flood.1", b"NATS/1.0\r\n\r\n", flood)
                    for _ in range(500)
                )
                for _ in range(80):  # 40 000 requests, 12 MB: past the kernel's buffers too
                    sock.sendall(batch)
                sock.sendall(b"PING\r\n")
                assert reader.readline() == b"PONG\r\n"
            wait_until(lambda: "Slow Consumer" in server.log.read_text(errors="replace"), 10)
        finally:
            gw.popen.send_signal(signal.SIGCONT)
        wait_until(lambda: health(gw)["nats"]["reconnects"] >= 1, 10)
        wait_until(lambda: health(gw)["nats"]["connected"], 10)
        state = health(gw)["nats"]
        print(f"\nafter the cut: {state}")
        caller = Bus(server.url)
        try:
            answer = caller.request(f"{prefix}.v1.heartbeat", {"endpoint_id": "agent://nobody"})
            assert (answer.status, answer.body["error"]) == (404, "endpoint_not_registered")
        finally:
            caller.close()
        assert state["slow_consumers"] == 0  # the server's cut, not nats-py's drops


# --- a reply nats-py cannot read ---------------------------------------------------------------


def test_an_agent_reply_nats_py_cannot_read_costs_that_attempt_only() -> None:
    """An agent (here a raw NATS connection) replies with a header block nats-py raises on (an
    inline status whose description is not UTF-8). It is dropped: that attempt times out and is
    retried on the other agent; the gateway's link goes on reading (it used to stop reading
    for good, every NATS agent and the API over NATS silent until its pings failed)."""
    prefix, subject = new_prefix(), unique("garbled")
    with gateway("--nats", NATS_URL, "--nats-prefix", prefix, "--heartbeat-interval", "30") as gw:
        good = start_bus_echo(
            NATS_URL,
            unique("good"),
            "--register-http",
            gw.url,
            "--id",
            "agent://garble-good",
            "--intents",
            "garble.echo",
            "--delay-ms",
            "100",
        )
        sock, reader = raw_connection(NATS_URL)

        def garbler() -> None:  # answers every request with the bad header block
            while True:
                line = reader.readline()
                if not line:
                    return  # shut down by the test
                if line.startswith(b"PING"):
                    sock.sendall(b"PONG\r\n")
                if not line.startswith(b"HMSG "):
                    continue
                fields = line.split()  # HMSG SUBJECT SID REPLY HEADER_BYTES TOTAL_BYTES
                reader.read(int(fields[-1]) + 2)
                block = b"NATS/1.0 503 \xd8\r\n\r\n"
                sock.sendall(hpub(fields[3].decode(), b"", block, b'{"x": 1}'))

        sock.sendall(f"SUB {subject} 1\r\nPING\r\n".encode())
        assert reader.readline() == b"PONG\r\n"
        thread = threading.Thread(target=garbler, daemon=True)
        thread.start()
        try:
            body = {
                "endpoint_id": "agent://garble-bad",
                "capabilities": ["garble.echo"],
                "endpoint_url": f"nats:{subject}",
            }
            assert http("POST", f"{gw.url}/v1/register", body)[0] == 200
            wait_until(lambda: len(registered(gw)) == 2, 10)
            seen = []
            for _ in range(6):
                status, answer = send(gw, "garble.echo", timeout_ms=5000)
                assert status == 200, answer
                seen.append(tried(answer))
                if ("agent://garble-bad", "timeout") in tried(answer):
                    break
            print(f"\nattempts {seen}")
            assert seen[-1] == [("agent://garble-bad", "timeout"), ("agent://garble-good", "ok")], (
                seen
            )
            assert "nats.unreadable_message" in [line.get("event") for line in gw.log_lines()]
            assert health(gw)["nats"]["reconnects"] == 0
        finally:
            sock.shutdown(socket.SHUT_RDWR)
            thread.join(5)
            sock.close()
            reader.close()
            good.stop()


# --- a message the server counts as too large -----------------------------------------------


def test_a_send_whose_headers_take_it_past_max_payload_does_not_cost_the_link() -> None:
    """The server counts a message's headers against ``max_payload`` and hangs up on a client
    that sends more; nats-py checks the body alone. Sends whose delivery body is just under
    the limit (and over it with the gateway's headers) are refused before they go out: the
    gateway's NATS link is never cut (a review's 1 MiB send reset it, and with it every request
    in flight), and the agent is reached again at once."""
    limit = 16384
    with private_server(f"max_payload: {limit}") as server:
        prefix, subject = new_prefix(), unique("big")
        with gateway("--nats", server.url, "--nats-prefix", prefix) as gw:
            echo = start_bus_echo(
                server.url,
                subject,
                "--register-http",
                gw.url,
                "--id",
                "agent://big-echo",
                "--intents",
                "big.echo",
            )
            try:
                codes = Counter()
                for size in range(limit - 900, limit + 1, 40):  # the body's edge, both sides
                    code, _ = send(gw, "big.echo", payload={"x": "y" * size}, timeout_ms=3000)
                    codes[code] += 1
                    assert health(gw)["nats"]["reconnects"] == 0, (size, codes)
                assert codes[200] >= 1 and set(codes) != {200}, codes  # both sides were met
                assert send(gw, "big.echo", payload={"x": "small"})[0] == 200
            finally:
                echo.stop()


def test_a_send_answer_too_big_for_the_server_keeps_its_ids() -> None:
    """A send over the NATS API whose answer (the agent's result with the gateway's fields) is
    over ``max_payload`` while its delivery is not: the 413 that replaces it carried no
    ``msg_id``, ``trace_id`` or ``attempts`` (a review), though the work was done under that
    msg_id and every send's error names them. It does now."""
    limit = 16384
    with private_server(f"max_payload: {limit}") as server:
        prefix, subject = new_prefix(), unique("bigans")
        with gateway("--nats", server.url, "--nats-prefix", prefix) as gw:
            echo = start_bus_echo(
                server.url, subject, "--register-http", gw.url, "--id", "agent://big-answer",
                "--intents", "big.answer",
            )  # fmt: skip
            bus = Bus(server.url)
            try:
                too_big, codes = [], Counter()
                # the answer's edge: small requests, the agent's answers under the limit, the
                # gateway's (the agent's with the gateway's fields) over it or not
                for pad in range(limit - 800, limit - 99, 50):
                    body = {"intent": "big.answer", "payload": {"pad_bytes": pad}}
                    body["timeout_ms"] = 2000  # an answer the agent cannot publish: not long
                    answer = bus.request(f"{prefix}.v1.send", body)
                    codes[answer.status] += 1
                    if answer.status == 413:
                        too_big.append(answer.body)
                assert codes[200], codes
                assert too_big, f"no answer went over max_payload: the edge was missed {codes}"
                for refused in too_big:
                    assert refused["error"] == "payload_too_large", refused
                    assert refused["msg_id"] and refused["trace_id"], refused
                    assert [a["outcome"] for a in refused["attempts"]] == ["ok"], refused
            finally:
                bus.close()
                echo.stop()
