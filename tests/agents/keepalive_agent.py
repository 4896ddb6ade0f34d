"""A bare ASGI agent served by uvicorn, with uvicorn's idle keep-alive close as a flag.

One uvicorn server listens on ``--endpoints`` ports, each registered as its own endpoint
(``ID-01``, ``ID-02``, ...) for its own intent (``INTENT-01``, ...), so that each of a test's
caller streams has a connection pool of its own in the gateway. The agent keeps heartbeating,
answers every POST with ``{"ok": true, "n": N}`` (N counts the requests it received), and
prints its first URL on stdout once every endpoint is registered and every socket listens.
``--timeout-keep-alive 1`` closes idle connections after 1 s, as busy agent servers do
(gunicorn's default is 2 s), so that a gateway writing on a connection just as the agent
closes it can be caught at it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib import error, request

import uvicorn

Scope = dict[str, Any]
Message = dict[str, Any]

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--intent", default="keepalive.echo")
parser.add_argument("--endpoints", type=int, default=1)
parser.add_argument("--timeout-keep-alive", type=int, default=5)  # seconds, as uvicorn's flag
args = parser.parse_args()

received = 0


async def app(
    scope: Scope,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    global received
    if scope["type"] != "http":
        return
    more = True
    while more:  # the whole request body
        message = await receive()
        more = message.get("more_body", False)
    received += 1
    body = json.dumps({"ok": True, "n": received}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = request.Request(
        f"{args.gateway}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def register(n: int) -> float:
    code, answer = post(
        "/v1/register",
        {
            "endpoint_id": f"{args.id}-{n:02d}",
            "capabilities": [f"{args.intent}-{n:02d}"],
            "endpoint_url": urls[n - 1],
        },
    )
    assert code == 200, answer
    return float(answer["heartbeat_interval_s"])


async def heartbeat(interval: float) -> None:
    while True:
        await asyncio.sleep(interval / 2)
        for n in range(1, args.endpoints + 1):
            beat = {"endpoint_id": f"{args.id}-{n:02d}"}
            code, _ = await asyncio.to_thread(post, "/v1/heartbeat", beat)
            if code == 404:
                await asyncio.to_thread(register, n)


async def main() -> None:
    interval = min(register(n) for n in range(1, args.endpoints + 1))
    print(f"{args.id} listening on {' '.join(urls)}", flush=True)  # the test waits for this
    beat = asyncio.create_task(heartbeat(interval))
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=args.timeout_keep_alive,
    )
    try:
        await uvicorn.Server(config).serve(sockets=socks)
    finally:
        beat.cancel()


socks = [socket.socket() for _ in range(args.endpoints)]
for sock in socks:
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
urls = [f"http://127.0.0.1:{sock.getsockname()[1]}/reach" for sock in socks]
asyncio.run(main())
