"""The lean forwarder: the least a gateway in Python can be, a rung of ``run.py ladder``.

What issue 18 calls the lean forwarder, written to be fast and nothing else: a raw ASGI app (no
framework) served by uvicorn with httptools and uvloop, one worker, access log off; msgspec
decodes and encodes every body; one shared ``aiohttp.ClientSession`` (a keep-alive pool) makes
the hop to the agent; an inverted index intent -> endpoints, picked round robin. No retries,
traces, metrics, health rules, deadlines beyond the caller's ``timeout_ms``, or access control.

It takes the same JSON as Agent-Reach and the seed gateway for ``POST /v1/register``,
``/v1/heartbeat`` and ``/v1/send``, delivers the request object with the contract's ``X-Reach-*``
headers, and answers a send with the contract's success shape (``"ok": true``, the agent's JSON
as ``result``, one attempt), so that the benchmarks' wrk script counts it as a good answer.
Errors have the contract's shape too: ``invalid_request`` (400), ``payload_too_large`` (413),
``no_capable_agent`` and ``endpoint_not_registered`` (404), ``agent_error`` (the agent answered
4xx) and ``all_attempts_failed`` (anything else on the hop; 502).

    python benchmarks/lean_forwarder.py --port 0   # prints "lean forwarder listening on http://..."

Registering an id again replaces its record; a heartbeat only records the time (no status is
derived from it, so every registered endpoint stays routable).
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import uvicorn

MAX_BODY = 1 << 20  # bytes of a request body, as the gateway's default --max-body-bytes
POOL = 1024  # keep-alive connections to agents: more than the benchmark's callers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Register(msgspec.Struct):
    endpoint_id: str
    capabilities: list[str]
    endpoint_url: str
    description: str = ""


class Heartbeat(msgspec.Struct):
    endpoint_id: str


class Reach(msgspec.Struct):
    """The send body, and (ids filled in) the request object delivered to the agent."""

    intent: str
    msg_id: str | None = None
    trace_id: str | None = None
    sender: str | None = None
    recipient_hint: str | None = None
    payload: Any = msgspec.field(default_factory=dict)
    priority: str = "normal"
    timeout_ms: int = 8000


class Attempt(msgspec.Struct):
    endpoint_id: str
    outcome: str
    latency_ms: float


class Answer(msgspec.Struct):
    ok: bool
    msg_id: str
    trace_id: str
    intent: str
    endpoint_id: str
    result: Any
    attempts: list[Attempt]
    latency_ms: float


@dataclass
class Endpoint:
    endpoint_id: str
    url: str
    capabilities: list[str]
    last_seen: float


@dataclass
class Registry:
    """The endpoints by id, and the inverted index intent -> endpoints with a round-robin turn."""

    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    by_intent: dict[str, list[Endpoint]] = field(default_factory=dict)
    turn: dict[str, int] = field(default_factory=dict)

    def put(self, ep: Endpoint) -> None:
        old = self.endpoints.pop(ep.endpoint_id, None)
        if old is not None:
            for intent in old.capabilities:
                rest = [e for e in self.by_intent[intent] if e is not old]
                if rest:
                    self.by_intent[intent] = rest
                else:
                    del self.by_intent[intent]
        self.endpoints[ep.endpoint_id] = ep
        for intent in dict.fromkeys(ep.capabilities):
            self.by_intent.setdefault(intent, []).append(ep)

    def pick(self, intent: str) -> Endpoint | None:
        candidates = self.by_intent.get(intent)
        if not candidates:
            return None
        n = self.turn.get(intent, 0)
        self.turn[intent] = n + 1
        return candidates[n % len(candidates)]


JSON_HEADERS = [(b"content-type", b"application/json")]
encode = msgspec.json.Encoder().encode
decode_register = msgspec.json.Decoder(Register).decode
decode_heartbeat = msgspec.json.Decoder(Heartbeat).decode
decode_reach = msgspec.json.Decoder(Reach).decode
decode_any = msgspec.json.Decoder().decode


class TooLarge(Exception):
    """The request body is over ``MAX_BODY``."""


class Forwarder:
    """The ASGI app: three routes, the registry, and the client session (made at startup)."""

    def __init__(self, heartbeat_interval: float) -> None:
        self.registry = Registry()
        self.heartbeat_interval = heartbeat_interval
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = ROUTES.get(scope["path"])
        if route is None or scope["method"] != "POST":
            await respond(send, 404, error("not_found", "POST /v1/register, heartbeat or send"))
            return
        try:
            body = await read_body(receive)
        except TooLarge:
            await respond(send, 413, error("payload_too_large", f"over {MAX_BODY} bytes"))
            return
        try:
            status, answer = await route(self, body)
        except msgspec.DecodeError as exc:  # ValidationError included
            status, answer = 400, error("invalid_request", str(exc))
        await respond(send, status, answer)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                connector = aiohttp.TCPConnector(limit=POOL, limit_per_host=POOL)
                self.session = aiohttp.ClientSession(connector=connector)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def register(self, body: bytes) -> tuple[int, bytes]:
        reg = decode_register(body)
        if not reg.capabilities or not reg.endpoint_url.startswith(("http://", "https://")):
            return 400, error("invalid_request", "capabilities empty or endpoint_url not http")
        self.registry.put(
            Endpoint(reg.endpoint_id, reg.endpoint_url, reg.capabilities, time.time())
        )
        return 200, encode(
            {
                "ok": True,
                "endpoint_id": reg.endpoint_id,
                "heartbeat_interval_s": self.heartbeat_interval,
            }
        )

    async def heartbeat(self, body: bytes) -> tuple[int, bytes]:
        beat = decode_heartbeat(body)
        ep = self.registry.endpoints.get(beat.endpoint_id)
        if ep is None:
            return 404, error("endpoint_not_registered", beat.endpoint_id)
        ep.last_seen = time.time()
        return 200, encode({"ok": True, "endpoint_id": ep.endpoint_id, "status": "healthy"})

    async def send(self, body: bytes) -> tuple[int, bytes]:
        reach = decode_reach(body)
        ep = self.registry.pick(reach.intent)
        if ep is None:
            return 404, error("no_capable_agent", reach.intent)
        if reach.msg_id is None:
            reach.msg_id = "msg_" + os.urandom(8).hex()
        if reach.trace_id is None:
            reach.trace_id = "trace_" + os.urandom(8).hex()
        headers = {
            "Content-Type": "application/json",
            "X-Reach-Trace-Id": reach.trace_id,
            "X-Reach-Msg-Id": reach.msg_id,
            "X-Reach-Attempt": "1",
            "X-Reach-Deadline-Ms": str(reach.timeout_ms),
        }
        assert self.session is not None  # made at startup, before any request
        started = time.perf_counter()
        try:
            async with self.session.post(
                ep.url,
                data=encode(reach),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=reach.timeout_ms / 1000),
            ) as resp:
                raw = await resp.read()
                status = resp.status
            result = decode_any(raw) if 200 <= status < 300 else None
        except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
            return 502, error("all_attempts_failed", f"{type(exc).__name__}: {exc}")
        if not 200 <= status < 300:
            code = "agent_error" if 400 <= status < 500 else "all_attempts_failed"
            return 502, error(code, f"the agent answered {status}")
        ms = round((time.perf_counter() - started) * 1000, 3)
        return 200, encode(
            Answer(
                ok=True,
                msg_id=reach.msg_id,
                trace_id=reach.trace_id,
                intent=reach.intent,
                endpoint_id=ep.endpoint_id,
                result=result,
                attempts=[Attempt(ep.endpoint_id, "ok", ms)],
                latency_ms=ms,
            )
        )


Route = Callable[[Forwarder, bytes], Awaitable[tuple[int, bytes]]]
ROUTES: dict[str, Route] = {
    "/v1/register": Forwarder.register,
    "/v1/heartbeat": Forwarder.heartbeat,
    "/v1/send": Forwarder.send,
}


def error(code: str, detail: str) -> bytes:
    return encode({"ok": False, "error": code, "detail": detail})


async def read_body(receive: Receive) -> bytes:
    """The whole request body; ``TooLarge`` past ``MAX_BODY``."""
    parts: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise TooLarge
        parts.append(chunk)
        more = message.get("more_body", False)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def respond(send: Send, status: int, body: bytes) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    # listening before the line is printed: a connection made as soon as it is read waits in
    # the backlog until uvicorn accepts it, rather than being refused
    sock.listen(1024)
    print(f"lean forwarder listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        Forwarder(args.heartbeat_interval),
        http="httptools",
        loop="uvloop",
        lifespan="on",
        access_log=False,
        log_level="warning",
        workers=1,
        backlog=1024,
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
