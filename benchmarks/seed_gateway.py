"""The baseline: a minimal gateway written the way the seed article sketches it.

FastAPI routes, one shared ``httpx.AsyncClient``, and a plain dict of agents that ``/v1/send``
scans and sorts by latency on every request; served by plain uvicorn with its defaults (it picks
uvloop when installed, and h11 since httptools is not installed). It takes the same JSON as
Agent-Reach for ``/v1/register``, ``/v1/heartbeat`` and ``/v1/send``.

Fair-play choices, so that it is a baseline and not a straw man: the access log is off (as the
Agent-Reach gateway runs at ``--log-level WARNING``); the client's pool keeps a keep-alive
connection for each of the benchmark's connections, so none is reopened under load (httpx's
default pool measured no faster here); and the sniffio stand-in below.

    python benchmarks/seed_gateway.py --port 0   # prints "seed gateway listening on http://..."
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
import types
import uuid
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel


def stand_in_for_sniffio() -> None:
    """httpcore runs ``import sniffio`` on every request, and anyio 4 no longer installs sniffio:
    without it each request pays a failed import (a sys.path scan, about a fifth of this
    gateway's CPU). That is a packaging accident, not the design under comparison, so unless
    ``--as-installed`` is given, a stand-in gives sniffio's answer under asyncio."""
    try:
        import sniffio  # noqa: F401
    except ImportError:
        stub = types.ModuleType("sniffio")
        stub.current_async_library = lambda: "asyncio"  # type: ignore[attr-defined]
        sys.modules["sniffio"] = stub  # after anyio's import: only httpcore's lookup sees it


agents: dict[str, dict[str, Any]] = {}
client: httpx.AsyncClient | None = None
HEARTBEAT_INTERVAL = 10.0  # an agent is routable for 3 intervals after its last heartbeat


class Register(BaseModel):
    endpoint_id: str
    capabilities: list[str]
    endpoint_url: str
    description: str = ""


class Heartbeat(BaseModel):
    endpoint_id: str


class Send(BaseModel):
    intent: str
    msg_id: str | None = None
    trace_id: str | None = None
    sender: str | None = None
    recipient_hint: str | None = None
    payload: Any = {}
    priority: str = "normal"
    timeout_ms: int = 8000


@asynccontextmanager
async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
    global client
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(limits=limits) as client:
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/v1/register")
async def register(body: Register) -> dict[str, Any]:
    agents[body.endpoint_id] = {**body.model_dump(), "last_seen": time.time(), "latency": 0.0}
    return {"ok": True, "endpoint_id": body.endpoint_id, "heartbeat_interval_s": HEARTBEAT_INTERVAL}


@app.post("/v1/heartbeat")
async def heartbeat(body: Heartbeat) -> Any:
    agent = agents.get(body.endpoint_id)
    if agent is None:
        return JSONResponse({"ok": False, "error": "endpoint_not_registered"}, status_code=404)
    agent["last_seen"] = time.time()
    return {"ok": True, "endpoint_id": body.endpoint_id, "status": "healthy"}


@app.post("/v1/send")
async def send(body: Send) -> Any:
    now = time.time()
    candidates = [
        a
        for a in agents.values()
        if body.intent in a["capabilities"] and now - a["last_seen"] < 3 * HEARTBEAT_INTERVAL
    ]
    if not candidates:
        return JSONResponse({"ok": False, "error": "no_capable_agent"}, status_code=404)
    candidates.sort(key=lambda a: a["latency"])
    agent = candidates[0]
    message = body.model_dump()
    message["msg_id"] = body.msg_id or uuid.uuid4().hex
    message["trace_id"] = body.trace_id or uuid.uuid4().hex
    started = time.perf_counter()
    try:
        resp = await client.post(  # type: ignore[union-attr]
            agent["endpoint_url"], json=message, timeout=body.timeout_ms / 1000
        )
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        return JSONResponse(
            {"ok": False, "error": "all_attempts_failed", "detail": str(exc)}, status_code=502
        )
    agent["latency"] = 0.8 * agent["latency"] + 0.2 * (time.perf_counter() - started) * 1000
    return {
        "ok": True,
        "msg_id": message["msg_id"],
        "trace_id": message["trace_id"],
        "endpoint_id": agent["endpoint_id"],
        "result": resp.json(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--heartbeat-interval", type=float, default=HEARTBEAT_INTERVAL)
    parser.add_argument(
        "--as-installed",
        action="store_true",
        help="no sniffio stand-in: every request pays httpcore's failed import",
    )
    args = parser.parse_args()
    if not args.as_installed:
        stand_in_for_sniffio()
    HEARTBEAT_INTERVAL = args.heartbeat_interval
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"seed gateway listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
