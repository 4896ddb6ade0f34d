"""The floor: the cheapest forwarder on Agent-Reach's own stack (aiohttp server + one aiohttp
ClientSession on uvloop), with no routing, health, retries, traces or metrics.

Not a competitor: it shows what any gateway built on aiohttp costs at least on this machine, so
that Agent-Reach's figures can be split into "the framework" and "our code". ``/v1/send``
forwards the body to the one ``--agent`` URL; ``/v1/heartbeat`` answers a fixed body.

    python benchmarks/floor_gateway.py --agent http://127.0.0.1:PORT/reach
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aiohttp
from aiohttp import web

JSON = {"Content-Type": "application/json"}
HEARTBEAT = b'{"ok":true,"endpoint_id":"agent://bench-agent","status":"healthy"}'
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
AGENT: web.AppKey[str] = web.AppKey("agent", str)


async def send(request: web.Request) -> web.Response:
    body = await request.read()
    async with request.app[SESSION].post(request.app[AGENT], data=body, headers=JSON) as resp:
        data = await resp.read()
    return web.Response(body=b'{"ok":true,"result":' + data + b"}", headers=JSON)


async def heartbeat(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=HEARTBEAT, headers=JSON)


async def main(args: argparse.Namespace) -> None:
    app = web.Application()
    app.router.add_post("/v1/send", send)
    app.router.add_post("/v1/heartbeat", heartbeat)
    connector = aiohttp.TCPConnector(limit=1024, limit_per_host=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        app[SESSION] = session
        app[AGENT] = args.agent
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"floor gateway listening on http://{args.host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--agent", required=True, help="URL every /v1/send is forwarded to")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(args))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main(args))
