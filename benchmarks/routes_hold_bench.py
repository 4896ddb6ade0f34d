"""How long each read route of a large gateway makes every other request wait.

``python benchmarks/routes_hold_bench.py [--endpoints 50000] [--reps 3] [--mcp-only]``

A real gateway process (``agent-reach serve``, no fallback matcher, no registration limit)
with ``--endpoints`` registered endpoints, each declaring a tag of its own and one of
``--endpoints`` / 10 shared tags (ten endpoints each). For each route, ``--reps`` requests one
after another on one connection, while a process of its own sends ``GET /healthz`` back to back
on another (apart from the reader of the big answers, whose GIL would delay it): the route's
time, and the slowest ``/healthz`` answered meanwhile, which is what any request waited behind
the route's longest hold of the event loop (plus the loopback's and the prober's own noise: an
idle gateway answers ``/healthz`` in ~0.3-1 ms here).

The MCP tools (``list_agents``, ``list_intents``) and the tools' list are asked the same way
over ``/mcp``, by the 2025 protocol (in a session opened just before) and by the 2026 one (each
request on its own); a call that is not answered as a success stops the run.

Bounded: the registrations (four connections, ~15 s at 50,000) and ``--reps`` x 23 requests.
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

ROUTES: list[tuple[str, str, Any]] = [
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
    # the MCP tools over /mcp, by the 2025 protocol (a session opened first) and by the 2026 one
    # (no session): list_agents with no argument is the whole v1 list, as GET /v1/agents
    ("MCP", "2025", ("list_agents", {})),
    ("MCP", "2026", ("list_agents", {})),
    ("MCP", "2025", ("list_intents", {})),
    ("MCP", "2026", ("list_intents", {})),
    ("MCP", "2025", ("list_agents", {"limit": 100})),
    # the tools' list: the descriptions of reach and explain_route name the intents reachable
    ("MCP", "2025", ("tools/list", {})),
    ("MCP", "2026", ("tools/list", {})),
]
MCP_VERSION = "2025-06-18"
MCP_MODERN = "2026-07-28"


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
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: object = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body)
        sent = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, path, data, {**sent, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()

    def mcp_session(self) -> dict[str, str]:
        """An initialized MCP session: the headers its requests carry."""
        conn = self.conn()
        headers = {"Accept": "application/json, text/event-stream"}
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": MCP_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "routes_hold_bench", "version": "1"},
            },
        }
        conn.request(
            "POST", "/mcp", json.dumps(hello), {**headers, "Content-Type": "application/json"}
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status
        headers["Mcp-Session-Id"] = response.headers["Mcp-Session-Id"]
        headers["Mcp-Protocol-Version"] = MCP_VERSION
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        status, answer = self.call(conn, "POST", "/mcp", done, headers)
        assert status == 202, (status, answer)
        return headers

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


def beside(
    gw: Gateway, method: str, path: str, body: Any, reps: int, headers: dict[str, str]
) -> str:
    go, stop, out = Event(), Event(), Queue()
    prober = Process(target=probe, args=(gw.port, go, stop, out))
    prober.start()
    go.set()
    time.sleep(0.2)
    took, size, status = [], 0, 0
    conn = gw.conn()
    send_headers = None
    if method == "MCP":  # a tool called over /mcp: path is the protocol, body (tool, arguments)
        protocol, tool, arguments = path, str(body[0]), dict(body[1])
        rpc = "tools/list" if tool == "tools/list" else "tools/call"
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if rpc == "tools/list":
            params = {}
        send_headers = headers
        if protocol == "2026":  # each request stands alone: its envelope in _meta and headers
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": MCP_MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            send_headers = {
                "Accept": "application/json, text/event-stream",
                "Mcp-Protocol-Version": MCP_MODERN,
                "Mcp-Method": rpc,
            }
            if rpc == "tools/call":
                send_headers["Mcp-Name"] = tool
        called = tool if rpc == "tools/list" else f"{tool}({json.dumps(arguments)})"
        method, path = "POST", f"/mcp {protocol} {called}"
        body = {"jsonrpc": "2.0", "id": 10, "method": rpc, "params": params}
    for _ in range(reps):
        started = time.perf_counter()
        status, data = gw.call(conn, method, path.split(" ")[0], body, send_headers)
        took.append(time.perf_counter() - started)
        size = len(data)
        if path.startswith("/mcp"):  # a JSON-RPC error or an isError result is no figure
            ok = b'"result"' in data and b'"isError":true' not in data
            assert status == 200 and ok, (path, status, data[:300])
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
    parser.add_argument("--mcp-only", action="store_true", help="only the MCP rows")
    args = parser.parse_args()
    gw = Gateway()
    try:
        started = time.monotonic()
        register(gw, args.endpoints)
        print(f"{args.endpoints} endpoints registered in {time.monotonic() - started:.1f} s")
        mcp: dict[str, str] = {}
        for method, path, body in ROUTES:
            if args.mcp_only and method != "MCP":
                continue
            if method == "MCP" and not mcp:  # a session of the 2025 protocol, opened now
                mcp = gw.mcp_session()
            print(beside(gw, method, path, body, args.reps, mcp), flush=True)
    finally:
        gw.stop()


if __name__ == "__main__":
    main()
