"""Helpers for the agent SDK's tests: start the SDK's test agents, deliver to them directly
(as the gateway would), and read what the gateway and their logs say."""

from __future__ import annotations

import json
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib import error, parse, request

from tests.support import Proc, _start, http

HERE = Path(__file__).resolve().parent
SDK_AGENT = HERE / "sdk_agent.py"
ASGI_AGENT = HERE / "asgi_agent.py"


def start_sdk_agent(
    gw: str, endpoint_id: str, *, workers: int = 4, max_inflight: int | None = None
) -> Proc:
    """tests/agents/sdk_agent.py, started and past its first registration attempt."""
    cap = () if max_inflight is None else ("--max-inflight", str(max_inflight))
    return _start(
        [
            sys.executable,
            str(SDK_AGENT),
            *("--gateway", gw, "--id", endpoint_id, "--workers", str(workers)),
            *cap,
        ]
    )


def start_asgi_agent(gw: str, endpoint_id: str, style: str) -> Proc:
    """tests/agents/asgi_agent.py under uvicorn, started and registered (or trying)."""
    return _start(
        [sys.executable, str(ASGI_AGENT), "--gateway", gw, "--id", endpoint_id, "--style", style]
    )


def free_port() -> int:
    """A port nothing listens on now (for a gateway started later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key() -> str:
    """A fresh key for side-effect counters and gates."""
    return uuid.uuid4().hex[:12]


def send(gw: str, **body: Any) -> tuple[int, Any]:
    """``POST /v1/send``."""
    return http("POST", f"{gw}/v1/send", body)


def deliver(
    url: str,
    intent: str,
    payload: Any = None,
    *,
    msg_id: str | None = None,
    trace_id: str = "trace_direct",
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """POST a delivery straight to an agent, with the headers the gateway sends."""
    msg_id = msg_id or f"msg_{key()}"
    body = {"intent": intent, "payload": payload, "msg_id": msg_id, "trace_id": trace_id}
    req = request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "X-Reach-Msg-Id": msg_id,
            "X-Reach-Trace-Id": trace_id,
            "X-Reach-Attempt": "1",
            "X-Reach-Deadline-Ms": "60000",
        },
    )
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def declare_too_large(url: str, length: int) -> tuple[int, Any]:
    """POST headers declaring a ``length``-byte body, and no body: the agent must answer 413
    from the headers alone (sending the body too would race the agent closing the socket)."""
    parts = parse.urlsplit(url)
    conn = HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.putrequest("POST", parts.path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def runs(url: str, k: str) -> int:
    """How often the agent's counting handlers ran for key ``k``."""
    status, counts = deliver(url, "sdk.runs")
    assert status == 200, counts
    return int(counts.get(k, 0))


def agent_record(gw: str, endpoint_id: str) -> tuple[int, Any]:
    """``GET /v1/agents/NAME``."""
    return http("GET", f"{gw}/v1/agents/{endpoint_id.removeprefix('agent://')}")


def events(proc: Proc, event: str, **match: Any) -> list[dict[str, Any]]:
    """The agent's JSON log lines of ``event`` whose keys match ``match``."""
    return [
        line
        for line in proc.log_lines()
        if line.get("event") == event and all(line.get(k) == v for k, v in match.items())
    ]


class Background:
    """Run a call on a thread and keep its result (for deliveries that block)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # handed to the test by join()
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result
