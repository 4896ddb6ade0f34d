"""A real A2A 1.0 agent for tests, built on the a2a-sdk's server and served by uvicorn.

It serves its Agent Card at ``/.well-known/agent-card.json`` and JSON-RPC at ``--rpc-path``, and
answers ``SendMessage`` by ``--mode``:

- ``message``: a Message; ``task``: a completed Task with one artifact (``answer``);
- ``input``: a multi-turn Task: the first message leaves it ``TASK_STATE_INPUT_REQUIRED``, a
  follow-up with its ``taskId`` completes it as in ``task`` mode;
- ``fail``: an internal error (JSON-RPC -32603); ``reject``: invalid params (-32602);
- ``hang``: never answers (until the process is stopped); ``slow``: a Message after
  ``--delay-ms``.

``CancelTask`` cancels a task that is not finished (an ``input`` mode task waiting for its
follow-up); a finished one is not cancelable (-32002, the SDK's check).

Each answer (a Message's parts, or the artifact's) is a text part ``echo: <user text>`` and a
data part telling what arrived: ``{"agent", "pid", "data" (the first data part received, or
null), "metadata" (the message's metadata), "context_id", "task_id" (the message's ids as the
client sent them, null when it sent none: the SDK fills in generated ones before the executor
runs), "parts" (the kinds of the parts received, in order), "assertion" (the request's
``X-Reach-Assertion`` header, null without one)}``. Numbers in it come back as
floats (protobuf's ``Value``: ``pid`` and ``deadline_ms`` too).

``--sign-key PEM`` (and ``--kid``) signs the card (ES256, the SDK's signer).

``--v03`` also lists a v0.3 JSON-RPC interface (so the SDK serves a 1.0 + 0.3 hybrid card and
takes v0.3 method names) and serves the pure v0.3 card at ``/.well-known/agent.json``.

Once listening it prints one line to stdout, ``a2a agent NAME serving card at URL``; logs go to
stderr. SIGTERM (or SIGINT) stops it cleanly, exit status 0; a hanging request is then
answered with an internal error rather than held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from types import FrameType
from typing import Any

import uvicorn
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.helpers import (
    get_data_parts,
    new_data_part,
    new_message,
    new_task_from_user_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
)
from a2a.utils.errors import InternalError, InvalidParamsError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Scope = MutableMapping[str, Any]
AsgiEvent = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[AsgiEvent]]
Send = Callable[[AsgiEvent], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

# messageId -> the (contextId, taskId) the client sent, recorded before the SDK fills them in,
# and the request's X-Reach-Assertion header
SENT_IDS: dict[str, tuple[str | None, str | None, str | None]] = {}
STOPPING = asyncio.Event()  # set on SIGTERM/SIGINT: a hanging request gives up


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="a2a-test-agent")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument(
        "--skill", action="append", default=[], metavar="ID=DESCRIPTION", help="repeatable"
    )
    p.add_argument("--example", action="append", default=[], metavar="ID=TEXT", help="repeatable")
    p.add_argument(
        "--mode",
        choices=["message", "task", "input", "fail", "hang", "slow", "reject"],
        default="message",
    )
    p.add_argument("--delay-ms", type=float, default=0.0, help="slow mode's delay")
    p.add_argument("--rpc-path", default="/")
    p.add_argument("--v03", action="store_true", help="also serve a v0.3 card and methods")
    p.add_argument("--card-version", default="1.0.0")
    p.add_argument(
        "--sign-key", metavar="PEM", help="sign the card with this private key (ES256, JWS)"
    )
    p.add_argument("--kid", default="card-key", help="the signature's key id")
    args = p.parse_args(argv)
    if not args.rpc_path.startswith("/"):
        p.error("--rpc-path starts with /")
    for flag, values in (("--skill", args.skill), ("--example", args.example)):
        for value in values:
            if "=" not in value or not value.partition("=")[0]:
                p.error(f"{flag} takes ID=TEXT, not {value!r}")
    return args


def build_card(args: argparse.Namespace, port: int) -> AgentCard:
    """The agent's card: one skill per ``--skill`` (tags: the id's dot-separated segments)."""
    base = f"http://127.0.0.1:{port}"
    examples: dict[str, list[str]] = {}
    for value in args.example:
        skill_id, _, text = value.partition("=")
        examples.setdefault(skill_id, []).append(text)
    skills = []
    for value in args.skill:
        skill_id, _, description = value.partition("=")
        skills.append(
            AgentSkill(
                id=skill_id,
                name=skill_id,
                description=description or skill_id,
                tags=[t for t in skill_id.split(".") if t] or [skill_id],
                examples=examples.get(skill_id, []),
            )
        )
    interfaces = [
        AgentInterface(url=base + args.rpc_path, protocol_binding="JSONRPC", protocol_version="1.0")
    ]
    if args.v03:
        interfaces.append(
            AgentInterface(
                url=base + args.rpc_path, protocol_binding="JSONRPC", protocol_version="0.3"
            )
        )
    return AgentCard(
        name=args.name,
        description=f"test agent {args.name} ({args.mode} mode)",
        version=args.card_version,
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


def seen_part(args: argparse.Namespace, ctx: RequestContext) -> list[Part]:
    """The answer's parts: the echo and what arrived (module docstring)."""
    message = ctx.message
    assert message is not None
    data = get_data_parts(message.parts)
    context_id, task_id, assertion = SENT_IDS.pop(message.message_id, (None, None, None))
    seen = {
        "agent": args.name,
        "pid": os.getpid(),
        "data": data[0] if data else None,
        "metadata": MessageToDict(message.metadata),
        "context_id": context_id,
        "task_id": task_id,
        "parts": [part.WhichOneof("content") for part in message.parts],
        "assertion": assertion,
    }
    return [new_text_part("echo: " + ctx.get_user_input()), new_data_part(seen)]


class ModeExecutor(AgentExecutor):
    """Answers by ``--mode`` (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """One SendMessage."""
        mode = self.args.mode
        if mode == "fail":
            raise InternalError(message="scripted failure")
        if mode == "reject":
            raise InvalidParamsError(message="scripted rejection")
        if mode == "hang":
            await STOPPING.wait()
            raise InternalError(message="stopping")
        if mode == "slow":
            await asyncio.sleep(self.args.delay_ms / 1000.0)
        if mode in ("message", "slow"):
            await event_queue.enqueue_event(
                new_message(
                    seen_part(self.args, context),
                    context_id=context.context_id,
                    task_id=None,
                )
            )
            return
        assert context.message is not None
        task = context.current_task
        if task is None:
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)  # must precede the status updates
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        if mode == "input" and context.current_task is None:
            await updater.requires_input(
                new_message([new_text_part("more, please")], task.context_id, task.id)
            )
            return
        await updater.start_work()
        await updater.add_artifact(seen_part(self.args, context), name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Cancels the task (the SDK refuses a finished one before this is called)."""
        if context.task_id is None or context.context_id is None:
            raise UnsupportedOperationError()
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class RecordSentIds:
    """Wraps the JSON-RPC app: notes the ids each message was sent with, then replays the body.

    The SDK writes generated ids into the message before the executor sees it, so what the
    client sent is only known from the body itself. (A class, not a function: Starlette would
    take a function for a request -> response endpoint.)"""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app."""
        chunks: list[bytes] = []
        while True:
            event = await receive()
            if event["type"] != "http.request":  # gone before the body came
                return
            chunks.append(event.get("body", b""))
            if not event.get("more_body", False):
                break
        body = b"".join(chunks)
        if len(SENT_IDS) > 1000:  # ids of messages no answer reported (fail, hang): dropped
            SENT_IDS.clear()
        try:
            message = json.loads(body)["params"]["message"]
            headers = dict(scope.get("headers") or [])
            assertion = headers.get(b"x-reach-assertion")
            SENT_IDS[str(message["messageId"])] = (
                message.get("contextId"),
                message.get("taskId"),
                None if assertion is None else assertion.decode("latin-1"),
            )
        except (ValueError, KeyError, TypeError):
            pass  # not a SendMessage: the SDK answers it as it should
        replayed = False

        async def replay() -> AsgiEvent:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def build_app(args: argparse.Namespace, card: AgentCard) -> Starlette:
    """The Starlette app: the card route(s) and the JSON-RPC route."""
    handler = DefaultRequestHandler(
        agent_executor=ModeExecutor(args), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = [*create_agent_card_routes(card)]
    if args.v03:
        v03 = to_compat_agent_card(card).model_dump(mode="json", by_alias=True, exclude_none=True)

        async def legacy_card(request: Request) -> JSONResponse:
            return JSONResponse(v03)

        routes.append(Route("/.well-known/agent.json", legacy_card, methods=["GET"]))
    for route in create_jsonrpc_routes(handler, rpc_url=args.rpc_path, enable_v0_3_compat=args.v03):
        routes.append(Route(route.path, RecordSentIds(route.app), methods=["POST"]))
    return Starlette(routes=routes)


class _Server(uvicorn.Server):
    """uvicorn's server, saying once where it serves and ending hanging requests on a signal."""

    def __init__(self, config: uvicorn.Config, name: str, card_url: str) -> None:
        super().__init__(config)
        self._name = name
        self._card_url = card_url
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:  # listening now: the test may connect
            print(f"a2a agent {self._name} serving card at {self._card_url}", flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # a signal handler: wake the loop safely rather than touching the event directly
        if self._loop is not None:
            self._loop.call_soon_threadsafe(STOPPING.set)


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    card = build_card(args, port)
    if args.sign_key:  # a signed card: a detached JWS over the card's canonical JSON
        from a2a.utils.signing import create_agent_card_signer

        with open(args.sign_key, "rb") as pem:
            key = pem.read()
        card = create_agent_card_signer(key, {"kid": args.kid, "alg": "ES256", "typ": "JOSE"})(card)
    config = uvicorn.Config(
        build_app(args, card),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    card_url = f"http://127.0.0.1:{port}/.well-known/agent-card.json"
    # uvicorn re-raises the signal it caught once it has shut down; with these handlers in
    # place the process then ends with status 0 rather than dying of the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda sig, frame: None)
    asyncio.run(_Server(config, args.name, card_url).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
