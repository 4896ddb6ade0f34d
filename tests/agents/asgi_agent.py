"""A test agent mounted into an existing Starlette app, served by uvicorn.

``--style mount`` mounts the delivery endpoint with ``Mount("/reach", ...)`` and registers
``.../reach/`` (a Mount redirects the bare path); ``--style route`` uses
``Route("/reach", ..., methods=["POST"])`` and registers ``.../reach``. The app keeps a route of
its own (``GET /``) to show that the agent shares the app rather than owning it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", required=True)
parser.add_argument("--id", required=True)
parser.add_argument("--style", choices=["mount", "route"], default="mount")
args = parser.parse_args()

logs.configure("INFO")
agent = Agent(args.id, gateway=args.gateway, description="mounted in a Starlette app")


@agent.handle("asgi.echo")
def echo(payload: Any, ctx: ReachContext) -> dict[str, Any]:
    logs.log(logging.INFO, "asgi.echo.work")
    return {"pid": os.getpid(), "payload": payload, "trace_id": ctx.trace_id, "via": args.style}


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
if args.style == "mount":
    url = f"http://127.0.0.1:{port}/reach/"
    delivery: Mount | Route = Mount("/reach", app=agent.asgi())
else:
    url = f"http://127.0.0.1:{port}/reach"
    delivery = Route("/reach", agent.asgi(), methods=["POST"])


async def home(request: Request) -> JSONResponse:
    return JSONResponse({"app": "the team's own app"})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with agent.lifespan(endpoint_url=url)(app):
        print(f"{args.id} mounted at {url}", flush=True)  # the test waits for this line
        yield


app = Starlette(routes=[Route("/", home), delivery], lifespan=lifespan)
config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
