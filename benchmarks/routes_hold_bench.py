"""How long each read route of a large gateway makes every other request wait.

``python benchmarks/routes_hold_bench.py [--endpoints 50000] [--reps 3]``

A real gateway process (``agent-reach serve``, no fallback matcher, no registration limit)
with ``--endpoints`` registered endpoints, each declaring a tag of its own and one of
``--endpoints`` / 10 shared tags (ten endpoints each). For each route, ``--reps`` requests one
after another on one connection, while a process of its own sends ``GET /healthz`` back to back
on another (apart from the reader of the big answers, whose GIL would delay it): the route's
time, and the slowest ``/healthz`` answered meanwhile, which is what any request waited behind
the route's longest hold of the event loop (plus the loopback's and the prober's own noise: an
idle gateway answers ``/healthz`` in ~0.3-1 ms here).

Bounded: the registrations (four connections, ~15 s at 50,000) and ``--reps`` x 16 requests.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Event, Process, Queue
from typing import Any

ROUTES = [
    ("GET", "/v1/agents", None),
    ("GET", "/v1/agents?limit=100", None),
    ("GET", "/v1/agents?intent=probe.t7&limit=100", None),
    ("GET", "/v1/agents?status=healthy&limit=1000", None),
    ("GET", "/v1/agents/p77", None),
    ("GET", "/v1/intents", None),
    ("GET", "/v1/route?intent=probe.t7", None),
    ("GET", "/v1/traces", None),
    ("GET", "/v1/inflight", None),
    ("GET", "/v1/federation", None),
    ("GET", "/v1/diagnostics", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/dashboard", None),
    ("GET", "/.well-known/agent-card.json", None),
    ("POST", "/v1/send", {"intent": "probe.nothere.x", "timeout_ms": 500}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self) -> None:
        self.port = free_port()
        flags = ["--port", str(self.port), "--matcher", "none", "--register-rate-limit", "0"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_reach", "serve", *flags, "--heartbeat-interval", "600"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.call(self.conn(), "GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the gateway did not answer /healthz within 20 s")
            time.sleep(0.1)

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    @staticmethod
    def call(
        conn: http.client.HTTPConnection, method: str, path: str, body: object = None
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, path, data, headers)
        response = conn.getresponse()
        return response.status, response.read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def register(gw: Gateway, endpoints: int) -> None:
    shared = max(1, endpoints // 10)

    def some(lo: int, hi: int) -> None:
        conn = gw.conn()
        for i in range(lo, hi):
            body = {
                "endpoint_id": f"agent://p{i}",
                "capabilities": [f"probe.t{i % shared}", f"probe.u{i}"],
                "endpoint_url": f"http://127.0.0.1:9/r{i}",
            }
            status, answer = gw.call(conn, "POST", "/v1/register", body)
            assert status == 200, answer

    step = endpoints // 4 + 1
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda lo: some(lo, min(endpoints, lo + step)), range(0, endpoints, step)))


def probe(port: int, go: Any, stop: Any, out: Any) -> None:
    """In a process of its own: ``GET /healthz`` back to back from ``go`` to ``stop``; puts the
    waits (s) on ``out``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    Gateway.call(conn, "GET", "/healthz")  # the connection made before it counts
    waits: list[float] = []
    go.wait(30)
    while not stop.is_set():
        started = time.perf_counter()
        Gateway.call(conn, "GET", "/healthz")
        waits.append(time.perf_counter() - started)
    out.put(waits)


def beside(gw: Gateway, method: str, path: str, body: object, reps: int) -> str:
    go, stop, out = Event(), Event(), Queue()
    prober = Process(target=probe, args=(gw.port, go, stop, out))
    prober.start()
    go.set()
    time.sleep(0.2)
    took, size, status = [], 0, 0
    conn = gw.conn()
    for _ in range(reps):
        started = time.perf_counter()
        status, data = gw.call(conn, method, path, body)
        took.append(time.perf_counter() - started)
        size = len(data)
    stop.set()
    during = out.get(timeout=60) or [0.0]
    prober.join(10)
    return (
        f"{method:4s} {path[:46]:46s} {status} {size / 1e6:6.2f} MB"
        f"  route {min(took) * 1e3:6.1f}-{max(took) * 1e3:6.1f} ms"
        f"  /healthz max {max(during) * 1e3:6.1f} ms (n={len(during)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    gw = Gateway()
    try:
        started = time.monotonic()
        register(gw, args.endpoints)
        print(f"{args.endpoints} endpoints registered in {time.monotonic() - started:.1f} s")
        for method, path, body in ROUTES:
            print(beside(gw, method, path, body, args.reps), flush=True)
    finally:
        gw.stop()


if __name__ == "__main__":
    main()
