"""Many gateways, one Redis, and what happens when parts of that fail: real gateway and agent
processes, each test on a PRIVATE redis-server of its own (a free port, no persistence), so that
stopping or restarting it disturbs nothing else.

Bounds: a registration or removal reaches the other gateway by pub/sub, a heartbeat within
``STALENESS_BOUND_S`` (flush + sync); each check allows ``SLACK_S`` on top for the HTTP polls
of the test itself and process scheduling on a small machine.

Shown here: registered through A, routed through B; heartbeats through B keep it healthy on A
(each seen on A within the bound); deregistered through either, gone from the other within the
bound; a gateway restart loses nothing. Redis killed under load: no wrong answer, no crash,
each gateway keeps its own heartbeating agents healthy, says so (healthz, metric, logs) and
buffers a registration; Redis back EMPTY: the gateways re-publish and everything is visible
again. Redis frozen (a partition): writes answered at once and written later. No purge from a
view that cannot see the heartbeats. Gateway A killed under load: every send of a client with
both URLs answers or fails typed (only those in flight on A), the rest go through B. close()
ends even when redis-py loses a cancellation. The record cap while Redis is away: checked on
the view, buffered writes written when it is back.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from agent_reach.core.model import EndpointRecord
from agent_reach.errors import AgentReachError, RegistryFull
from agent_reach.registry.redis import RESYNC_EPS_S, STALENESS_BOUND_S, RedisRegistry
from agent_reach.sdk.client import ReachClient
from tests.support import (
    Proc,
    gateway,
    http,
    metric,
    no_agents,
    start_agent,
    status_of,
    wait_until,
)

# on top of a stated bound: the test's own HTTP polls (every 10 ms) and scheduling
SLACK_S = 0.35
REDIS_START_S = 10.0  # a redis-server answers PING within this, or the test fails

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateRedis:
    """A redis-server of the test's own on a free port: no RDB, no AOF, an empty temp dir (so
    that a restart comes back EMPTY, as a Redis without persistence does)."""

    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="agent-reach-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def start(self) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no", "--dir", self.workdir, "--daemonize", "no"]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + REDIS_START_S
        while True:
            try:
                with self.client() as c:
                    if c.ping():
                        return
            except redis.RedisError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on {self.port}") from None
            time.sleep(0.02)  # polling interval, not a settle delay

    def kill(self) -> None:
        """SIGKILL: a crash, nothing saved, every client connection dropped."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        self.popen = None

    def ids(self, prefix: str) -> set[str]:
        """The endpoint ids in the registry's last-seen set, as Redis holds them now."""
        with self.client() as c:
            return set(c.zrange("{" + prefix + "}:seen", 0, -1))


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.kill()
    shutil.rmtree(server.workdir, ignore_errors=True)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


def prefix() -> str:
    return f"faults-{os.urandom(4).hex()}"


def on(server: PrivateRedis, net: str, interval: float) -> tuple[str, ...]:
    return (
        "--registry",
        server.url,
        "--registry-prefix",
        net,
        "--heartbeat-interval",
        str(interval),
    )


def register(gw: Proc, endpoint_id: str, intent: str = "test.manual") -> None:
    body = {
        "endpoint_id": endpoint_id,
        "capabilities": [intent],
        "endpoint_url": f"http://127.0.0.1:9/{endpoint_id.removeprefix('agent://')}",
    }
    code, answer = http("POST", f"{gw.url}/v1/register", body)
    assert code == 200, answer


def agent_record(gw: Proc, endpoint_id: str) -> dict[str, Any] | None:
    code, body = http("GET", f"{gw.url}/v1/agents/{endpoint_id.removeprefix('agent://')}")
    return body if code == 200 else None


def seconds_until(predicate: Any, bound: float) -> float:
    """Seconds until ``predicate()`` holds, polled every 10 ms; fails past ``bound``."""
    start = time.monotonic()
    wait_until(predicate, timeout=bound, interval=0.01)
    return time.monotonic() - start


def healthz(gw: Proc) -> dict[str, Any]:
    code, body = http("GET", f"{gw.url}/healthz")
    assert code == 200, body
    return dict(body["registry"])


def available_metric(gw: Proc) -> float:
    _, text = http("GET", f"{gw.url}/metrics")
    match = re.search(r'^agent_reach_registry_available\{backend="redis"\} (\S+)$', text, re.M)
    assert match, text[:500]
    return float(match[1])


def events(gw: Proc) -> Counter[str]:
    return Counter(line.get("event", "") for line in gw.log_lines())


# --- two gateways, one registry ----------------------------------------------------------------


def test_register_via_a_route_via_b_heartbeat_and_deregister_anywhere(
    private_redis: PrivateRedis, procs: list[Proc]
) -> None:
    # interval 1 s: degraded after 1 s, down after 3 s. A heartbeat via B reaches A within
    # STALENESS_BOUND_S (0.25 s), so beats every 0.25 s keep it healthy on A with room to spare.
    net = prefix()
    with gateway(*on(private_redis, net, 1.0)) as a, gateway(*on(private_redis, net, 1.0)) as b:
        procs.append(start_agent(a.url, "agent://pair-echo-01"))  # registered through A
        waited = seconds_until(lambda: agent_record(b, "agent://pair-echo-01"), 2.0)
        assert waited <= STALENESS_BOUND_S + SLACK_S, waited
        for _ in range(10):  # routed through B, to the agent that registered through A
            code, body = http("POST", f"{b.url}/v1/send", {"intent": "test.echo"})
            assert code == 200, body
            assert body["endpoint_id"] == body["result"]["agent"] == "agent://pair-echo-01"
        _, route = http("GET", f"{b.url}/v1/route?intent=test.echo")
        assert route["chosen"] == "agent://pair-echo-01"

        # an endpoint registered through A that only ever heartbeats through B
        register(a, "agent://pair-manual-01")
        wait_until(lambda: agent_record(b, "agent://pair-manual-01"), 2.0, 0.01)

        def seen_at(gw: Proc) -> float:
            record = agent_record(gw, "agent://pair-manual-01")
            assert record is not None
            return float(record["last_seen_at"])

        delays = []
        end = time.monotonic() + 3.5  # longer than down-after (3 s)
        while time.monotonic() < end:
            sent = time.time()
            code, _ = http(
                "POST", f"{b.url}/v1/heartbeat", {"endpoint_id": "agent://pair-manual-01"}
            )
            assert code == 200
            # A's view carries the heartbeat: its time (Redis's, at or after `sent`) replaces
            # the view's when it is more than RESYNC_EPS_S newer
            delays.append(seconds_until(lambda: seen_at(a) >= sent - RESYNC_EPS_S, 2.0))  # noqa: B023
            assert status_of(a.url, "agent://pair-manual-01") == "healthy"
            # the SDK agent, beating through A (every 0.6-0.8 s), stays routable through B
            assert status_of(b.url, "agent://pair-echo-01") in ("healthy", "degraded")
            code, body = http("POST", f"{b.url}/v1/send", {"intent": "test.echo"})
            assert code == 200, body
            time.sleep(max(0.0, sent + 0.25 - time.time()))  # the heartbeat period
        assert max(delays) <= STALENESS_BOUND_S + SLACK_S, delays
        assert status_of(a.url, "agent://pair-manual-01") == "healthy"

        # deregistered through B: gone from A (pub/sub, milliseconds)
        code, _ = http("POST", f"{b.url}/v1/deregister", {"endpoint_id": "agent://pair-manual-01"})
        assert code == 200
        waited = seconds_until(lambda: agent_record(a, "agent://pair-manual-01") is None, 2.0)
        assert waited <= STALENESS_BOUND_S + SLACK_S, waited
        # the SDK agent deregisters through A when it stops: gone from B
        procs.pop().stop()
        waited = seconds_until(lambda: agent_record(b, "agent://pair-echo-01") is None, 2.0)
        assert waited <= STALENESS_BOUND_S + SLACK_S, waited
        assert private_redis.ids(net) == set()


@no_agents
def test_a_gateway_restart_loses_nothing(private_redis: PrivateRedis) -> None:
    net = prefix()
    names = [f"agent://restart-{i:02d}" for i in range(20)]
    with gateway(*on(private_redis, net, 10.0)) as a:
        for name in names:
            register(a, name, f"test.r{len(name) % 3}")
        with gateway(*on(private_redis, net, 10.0)) as b:
            _, listing = http("GET", f"{b.url}/v1/agents")  # the first call after it started
            first = {x["endpoint_id"]: x for x in listing["agents"]}
            assert set(first) == set(names)
        # B stopped; a new B on the same Redis lists every agent at once, last-seen unchanged
        with gateway(*on(private_redis, net, 10.0)) as b2:
            _, listing = http("GET", f"{b2.url}/v1/agents")
            again = {x["endpoint_id"]: x for x in listing["agents"]}
            assert set(again) == set(names)
            for name in names:
                assert again[name]["status"] == "healthy"
                assert abs(again[name]["last_seen_at"] - first[name]["last_seen_at"]) < 0.01
    # every gateway gone: the registry lives in Redis, and the next gateway has all of it
    with gateway(*on(private_redis, net, 10.0)) as c:
        _, listing = http("GET", f"{c.url}/v1/agents")
        assert {x["endpoint_id"] for x in listing["agents"]} == set(names)


# --- Redis stopped and started (empty) under load ----------------------------------------------


@dataclass
class Load:
    """A bounded loop of sends from a thread pool, alternating between gateways."""

    urls: list[str]
    intent: str = "test.echo"
    threads: int = 4
    pace_s: float = 0.02
    limit: int = 2000
    results: list[tuple[str, int, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: ThreadPoolExecutor = field(default_factory=ThreadPoolExecutor)
    _futures: list[Future[None]] = field(default_factory=list)

    def __enter__(self) -> Load:
        self._futures = [self._pool.submit(self._caller, i) for i in range(self.threads)]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for f in self._futures:
            f.result(timeout=30)  # a caller's failure fails the test
        self._pool.shutdown()

    def count(self) -> int:
        with self._lock:
            return len(self.results)

    def _caller(self, i: int) -> None:
        n = 0
        while not self._stop.is_set() and self.count() < self.limit:
            url = self.urls[(i + n) % len(self.urls)]
            n += 1
            code, body = http(
                "POST", f"{url}/v1/send", {"intent": self.intent, "timeout_ms": 3000}, timeout=10
            )
            with self._lock:
                self.results.append((url, code, body))
            self._stop.wait(self.pace_s)


def test_redis_stopped_and_restarted_empty_under_load(
    private_redis: PrivateRedis, procs: list[Proc]
) -> None:
    # interval 0.5 s: down after 1.5 s without a heartbeat
    net = prefix()
    with gateway(*on(private_redis, net, 0.5)) as a, gateway(*on(private_redis, net, 0.5)) as b:
        procs.append(start_agent(a.url, "agent://redis-echo-a"))  # heartbeats through A
        procs.append(start_agent(b.url, "agent://redis-echo-b"))  # heartbeats through B
        procs.append(start_agent(a.url, "agent://redis-other", intents="test.other"))
        everyone = {"agent://redis-echo-a", "agent://redis-echo-b", "agent://redis-other"}
        register(b, "agent://redis-leaving", "test.leaving")  # deregistered while Redis is away
        for gw in (a, b):
            for name in everyone:
                wait_until(lambda: status_of(gw.url, name) == "healthy", 3.0)  # noqa: B023
            wait_until(lambda: agent_record(gw, "agent://redis-leaving") is not None, 3.0)  # noqa: B023
            assert healthz(gw)["available"] is True
            assert available_metric(gw) == 1.0

        with Load([a.url, b.url]) as load:
            wait_until(lambda: load.count() >= 30, 10.0)
            private_redis.kill()
            for gw in (a, b):
                wait_until(lambda: healthz(gw)["available"] is False, 5.0)  # noqa: B023
                assert available_metric(gw) == 0.0
                assert "unreachable" in healthz(gw)["detail"]
            # a registration while Redis is away: answered at once from the local view,
            # buffered, and written when Redis is back
            t0 = time.monotonic()
            register(b, "agent://redis-late", "test.late")
            assert time.monotonic() - t0 < 1.0
            # and a deregistration, through the other gateway: B's view still holds the id
            code, _ = http(
                "POST", f"{a.url}/v1/deregister", {"endpoint_id": "agent://redis-leaving"}
            )
            assert code == 200
            # B cannot learn of A's heartbeats: the agent beating through A goes down on B...
            wait_until(lambda: status_of(b.url, "agent://redis-echo-a") == "down", 5.0)
            # ...while the heartbeats each gateway takes itself keep its own agents healthy
            assert status_of(a.url, "agent://redis-echo-a") == "healthy"
            assert status_of(a.url, "agent://redis-other") == "healthy"
            assert status_of(b.url, "agent://redis-echo-b") == "healthy"
            during = load.count()

            private_redis.start()  # the same port, EMPTY: no persistence
            for gw in (a, b):
                wait_until(lambda: healthz(gw)["available"] is True, 10.0)  # noqa: B023
            # the gateways re-published what they know; the buffered registration is written
            wait_until(lambda: private_redis.ids(net) >= {*everyone, "agent://redis-late"}, 10.0)
            for gw in (a, b):
                for name in everyone:
                    wait_until(lambda: status_of(gw.url, name) == "healthy", 5.0)  # noqa: B023
                # the registration buffered on B reaches A's view through A's listener, or the
                # full reconcile its reconnection asks for: up to ~2 s of reconnect backoff
                # later (a CI run asserted it 0.3 s after A's recovery and did not see it yet)
                wait_until(lambda: agent_record(gw, "agent://redis-late") is not None, 5.0)  # noqa: B023
                # B put back the record of the id A deregistered meanwhile, but that does not
                # bring it back, whether A's buffered removal reached Redis first or not
                wait_until(lambda: events(gw)["registry.redis_reset"] >= 1, 5.0)  # noqa: B023
                wait_until(lambda: agent_record(gw, "agent://redis-leaving") is None, 5.0)  # noqa: B023
                # the metric follows the link: one Redis call failing late (a CI run saw one)
                # marks it lost until the next success, at most a few tenths of a second later
                try:
                    wait_until(lambda: available_metric(gw) == 1.0, 5.0)  # noqa: B023
                except AssertionError:
                    seen = [x for x in gw.log_lines() if x.get("event", "").startswith("registry.")]
                    raise AssertionError(f"registry_available stays 0: {seen[-8:]}") from None
            wait_until(lambda: load.count() >= during + 30, 10.0)  # load went on throughout
            assert "agent://redis-leaving" not in private_redis.ids(net)

        assert a.popen.poll() is None and b.popen.poll() is None  # no crash
        assert len(load.results) >= 100
        # every send answered, by a capable agent; each gateway always had a healthy one
        bad = [(url, code, body) for url, code, body in load.results if code != 200]
        assert not bad, (len(bad), Counter((u, c) for u, c, _ in bad), bad[:1])
        for _, _, body in load.results:
            assert body["endpoint_id"] in {"agent://redis-echo-a", "agent://redis-echo-b"}
            assert body["result"]["agent"] == body["endpoint_id"]
        for gw in (a, b):
            seen = events(gw)
            assert seen["registry.unavailable"] >= 1, seen
            assert seen["registry.recovered"] >= 1, seen
            assert seen["registry.redis_reset"] >= 1, seen
            assert not [e for e in gw.log_lines() if e.get("level") == "error"]


# --- Redis frozen: a partition in which packets go unanswered ------------------------------------


@no_agents
def test_redis_frozen_writes_are_buffered_at_once_and_written_when_it_answers(
    private_redis: PrivateRedis,
) -> None:
    # SIGSTOP: connections stay open but nothing answers, as in a partition that drops packets
    # (not refused): each Redis call would wait for its 2 s socket timeout
    net = prefix()
    with gateway(*on(private_redis, net, 10.0)) as a, gateway(*on(private_redis, net, 10.0)) as b:
        register(a, "agent://frozen-before")
        wait_until(lambda: agent_record(b, "agent://frozen-before"), 2.0)
        assert private_redis.popen is not None
        private_redis.popen.send_signal(signal.SIGSTOP)
        try:
            for gw in (a, b):  # the sync loop's next call times out
                wait_until(lambda: healthz(gw)["available"] is False, 6.0)  # noqa: B023
            t0 = time.monotonic()
            register(a, "agent://frozen-during")
            code, _ = http(
                "POST", f"{a.url}/v1/deregister", {"endpoint_id": "agent://frozen-before"}
            )
            assert code == 200
            # answered from the local view, without waiting on Redis
            assert time.monotonic() - t0 < 0.5
            assert agent_record(a, "agent://frozen-during") is not None
            assert agent_record(a, "agent://frozen-before") is None
            # B routes on its last view meanwhile
            assert agent_record(b, "agent://frozen-before") is not None
        finally:
            private_redis.popen.send_signal(signal.SIGCONT)
        for gw in (a, b):
            wait_until(lambda: healthz(gw)["available"] is True, 10.0)  # noqa: B023
        # the buffered registration and removal are written, and B's view follows
        wait_until(lambda: agent_record(b, "agent://frozen-during") is not None, 5.0)
        wait_until(lambda: agent_record(b, "agent://frozen-before") is None, 5.0)
        assert private_redis.ids(net) == {"agent://frozen-during"}


def test_no_purge_from_a_view_that_cannot_see_the_heartbeats(
    private_redis: PrivateRedis, procs: list[Proc]
) -> None:
    # interval 0.2 s: down after 0.6 s; purged 1 s after the last heartbeat B knows of
    net = prefix()
    flags = (*on(private_redis, net, 0.2), "--purge-after", "1")
    with gateway(*flags) as a, gateway(*flags) as b:
        agent = start_agent(a.url, "agent://purge-echo-01")  # heartbeats through A only
        procs.append(agent)
        # on B it may look degraded now and then: a heartbeat through A reaches B up to
        # STALENESS_BOUND_S (0.25 s) later, more than degraded-after (0.2 s) here
        routable = ("healthy", "degraded")
        wait_until(lambda: status_of(b.url, "agent://purge-echo-01") in routable, 3.0)
        assert private_redis.popen is not None
        private_redis.popen.send_signal(signal.SIGSTOP)
        try:
            for gw in (a, b):
                wait_until(lambda: healthz(gw)["available"] is False, 6.0)  # noqa: B023
            wait_until(lambda: status_of(b.url, "agent://purge-echo-01") == "down", 3.0)
            # B's view has not seen a heartbeat for longer than purge-after (B's purge runs
            # every 0.25 s): it must not delete a record that A keeps alive
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                assert status_of(b.url, "agent://purge-echo-01") == "down"
                time.sleep(0.05)  # polling interval over an observation window
        finally:
            private_redis.popen.send_signal(signal.SIGCONT)
        for gw in (a, b):
            wait_until(lambda: healthz(gw)["available"] is True, 10.0)  # noqa: B023
        wait_until(lambda: status_of(b.url, "agent://purge-echo-01") in routable, 5.0)
        assert status_of(a.url, "agent://purge-echo-01") == "healthy"
        assert private_redis.ids(net) == {"agent://purge-echo-01"}
        # nothing was deleted behind the agent's back: it never had to register again
        assert not [e for e in agent.log_lines() if e.get("event") == "agent.reregistering"]


# --- gateway A killed under load, callers failing over to B ------------------------------------


def test_gateway_killed_under_load_callers_fail_over(
    private_redis: PrivateRedis, procs: list[Proc]
) -> None:
    net = prefix()
    with gateway(*on(private_redis, net, 1.0)) as a, gateway(*on(private_redis, net, 1.0)) as b:
        # registers through A (the first URL); moves its heartbeats to B when A is gone
        procs.append(start_agent(f"{a.url},{b.url}", "agent://kill-echo-01"))
        wait_until(lambda: status_of(b.url, "agent://kill-echo-01") == "healthy", 3.0)
        total, concurrency, kill_after = 400, 8, 100
        outcomes: list[tuple[str, Any]] = []

        async def run() -> str:
            async with ReachClient(f"{a.url},{b.url}", timeout_ms=3000) as client:
                queue: asyncio.Queue[int] = asyncio.Queue()
                for i in range(total):
                    queue.put_nowait(i)

                async def caller() -> None:
                    while not queue.empty():
                        i = queue.get_nowait()
                        if i == kill_after:
                            a.popen.send_signal(signal.SIGKILL)
                        try:
                            reply = await client.send("test.echo", {"i": i}, msg_id=f"msg_k{i}")
                        except AgentReachError as exc:  # typed: anything else fails the test
                            outcomes.append(("error", exc))
                        else:
                            assert reply.msg_id == f"msg_k{i}"
                            assert reply.result["payload"] == {"i": i}
                            outcomes.append(("ok", reply))

                await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(concurrency))), 60)
                return client.gateway

        current = asyncio.run(run())
        assert a.popen.wait(5) == -signal.SIGKILL
        assert len(outcomes) == total  # every send came back: an answer or a typed error
        errors = [exc for kind, exc in outcomes if kind == "error"]
        # only sends in flight on A when it died may fail (ambiguous: they may have been
        # delivered, so they were not sent again); every later one went to B
        assert len(errors) <= concurrency, errors[:3]
        assert all(type(exc).__name__ == "GatewayUnavailable" for exc in errors), errors[:3]
        assert current == b.url
        wait_until(lambda: status_of(b.url, "agent://kill-echo-01") == "healthy", 3.0)
        code, body = http("POST", f"{b.url}/v1/send", {"intent": "test.echo"})
        assert code == 200 and body["endpoint_id"] == "agent://kill-echo-01", body


# --- shutdown while the loops are busy -----------------------------------------------------------


@no_agents
async def test_close_ends_even_when_a_cancellation_is_lost(private_redis: PrivateRedis) -> None:
    # On Python 3.11, asyncio.wait_for (which redis-py awaits while sending a command) returns
    # the result and drops the cancellation when both happen at once: a background loop
    # cancelled mid-command went on forever, and close() (a gateway's SIGTERM) hung. A sync
    # loop that hammers Redis makes that race likely within a few closes.
    for i in range(20):
        registry = RedisRegistry(private_redis.url, prefix=f"close-{i}", sync_s=0.0005)
        registry.bind(time.monotonic)
        await registry.start()
        await asyncio.sleep(0.02 + (i % 7) * 0.003)  # the loops run for a while
        t0 = time.monotonic()
        await asyncio.wait_for(registry.close(), 10.0)
        assert time.monotonic() - t0 < 7.0  # CLOSE_WAIT_S per attempt, 3 attempts at most


# --- the record cap while Redis is away ----------------------------------------------------------


@no_agents
async def test_while_redis_is_away_the_cap_is_checked_on_the_view(
    private_redis: PrivateRedis,
) -> None:
    net = prefix()
    registry = RedisRegistry(private_redis.url, prefix=net, max_records=2, connect_timeout_s=0.5)
    registry.bind(time.monotonic)

    def rec(name: str, caps: tuple[str, ...] = ("t.a",)) -> EndpointRecord:
        now = time.monotonic()
        return EndpointRecord(f"agent://{name}", caps, f"http://127.0.0.1:9/{name}", "", now, 0.0)

    await registry.start()
    try:
        await registry.upsert(rec("cap-a"))
        await registry.upsert(rec("cap-b"))
        private_redis.kill()
        for _ in range(500):  # at most 5 s: the sync loop's next call fails
            if not registry.state().available:
                break
            await asyncio.sleep(0.01)  # polling interval
        assert not registry.state().available
        t0 = time.monotonic()
        with pytest.raises(RegistryFull):  # this view holds two: refused, nothing changed
            await registry.upsert(rec("cap-c"))
        assert registry.get("agent://cap-c") is None
        await registry.upsert(rec("cap-a", ("t.again",)))  # a known id: allowed, buffered
        assert await registry.remove("agent://cap-b") is not None  # buffered too
        await registry.upsert(rec("cap-c"))  # room again
        assert time.monotonic() - t0 < 0.5  # all answered from the view, none waited on Redis
        private_redis.start()  # back, EMPTY: the view is re-published with what was buffered
        wanted = {"agent://cap-a", "agent://cap-c"}
        for _ in range(1000):  # at most 10 s
            if registry.state().available and private_redis.ids(net) == wanted:
                break
            await asyncio.sleep(0.01)  # polling interval
        assert private_redis.ids(net) == wanted
        with pytest.raises(RegistryFull):  # and Redis checks again
            await registry.upsert(rec("cap-d"))
    finally:
        await registry.close()


def test_an_a2a_answer_is_kept_when_redis_goes_before_its_owners_are_written(
    private_redis: PrivateRedis,
) -> None:
    """A review: the owners of an A2A conversation are claimed in the shared registry after
    the agent has answered; with Redis gone meanwhile, the claim's error replaced the answer
    (the work done, the caller told it failed, and a retry would do it again). The answer now
    goes back, and the lost claim is logged."""
    with gateway(*on(private_redis, prefix(), 1.0), "--matcher", "none") as gw:
        agent = start_agent(gw.url, "agent://a2a-own-01", "slow", intents="own.t", delay_ms=1500)
        try:
            message = {
                "messageId": "m-own-01",
                "role": "ROLE_USER",
                "contextId": "conv-own-01",
                "parts": [{"data": {"n": 1}}],
                "metadata": {"intent": "own.t", "timeout_ms": 10000},
            }
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {"message": message},
            }
            with ThreadPoolExecutor(1) as pool:
                sent = pool.submit(
                    http, "POST", f"{gw.url}/a2a", call, headers={"A2A-Version": "1.0"}
                )
                wait_until(lambda: metric(gw, "agent_reach_requests_in_delivery") == 1, 5)
                private_redis.kill()  # the agent is still at work
                status, answer = sent.result(timeout=15)
            assert status == 200 and "result" in answer, answer
            assert answer["result"]["message"]["parts"][0]["data"]["payload"] == {"n": 1}
            assert any(line.get("event") == "a2a.owner_unrecorded" for line in gw.log_lines())
        finally:
            agent.stop()
