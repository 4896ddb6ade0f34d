"""Demo agent: ``travel.plan``, an A2A 1.0 agent built with the a2a-sdk's own server.

Unlike the other demo agents it knows nothing of Agent-Reach: no agent SDK, no registration,
no heartbeat. It serves its Agent Card at ``/.well-known/agent-card.json`` (one skill, whose id
is the tag ``travel.plan``) and JSON-RPC ``SendMessage`` at ``/``, on uvicorn. The demo's stack
registers it with the gateway by that card (``POST /v1/register`` with ``a2a_card_url``); the
gateway maps the skill to the intent by its id, delivers each request as ``SendMessage`` and
keeps the agent alive by fetching the card (docs/a2a.md).

Each ``SendMessage`` is answered with a Message of two parts: a text part (a short, canned plan
for one day) and a data part ``{"city", "plan"}``. The city is the first data part's ``city``
(the gateway sends a send's payload as a data part), else the first city of
:data:`~agent_reach.demo.weather.CITIES` named in the text; with neither, the request is
refused with invalid params (JSON-RPC -32602, the gateway's ``agent_error``), never guessed.

``python -m agent_reach.demo.travel [--port 0]`` binds 127.0.0.1 itself (port 0: any free one)
and, once listening, prints one line to stdout, ``a2a agent agent://travel-a2a-01 listening on
CARD_URL``; logs go to stderr as JSON lines. SIGTERM or SIGINT stops it, exit status 0. It needs
the a2a-sdk's server (``a2a-sdk[http-server]``) and uvicorn: the stack checks for them first
(:func:`agent_reach.demo.stack.a2a_unavailable`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import signal
import socket
from typing import Any

import uvicorn
from a2a.helpers import get_data_parts, new_data_part, new_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from a2a.utils.errors import InvalidParamsError, UnsupportedOperationError
from starlette.applications import Starlette

from agent_reach.demo.weather import understand
from agent_reach.observability import logs

__all__ = [
    "DESCRIPTION",
    "ENDPOINT_ID",
    "EXAMPLES",
    "PLANS",
    "SKILL",
    "build_app",
    "build_card",
    "main",
    "plan_for",
]

ENDPOINT_ID = "agent://travel-a2a-01"  # the id the stack registers the card under
SKILL = "travel.plan"  # the skill's id: a valid tag, so the gateway maps it by its id
DESCRIPTION = "Plans a trip: where to go and what to see in a city"
# the skill's examples, as the dictionary's entry for travel.plan has them (intents.toml):
# sightseeing, kept apart from schedule.plan's "plan my day" so that words find the right one
EXAMPLES = [
    "what should I see in Beijing",
    "plan a sightseeing trip to Hangzhou",
    "成都有什么好玩的地方",
    "去上海旅游应该看哪些景点",
]
# a city's answered name -> its day: morning, afternoon, evening
PLANS = {
    "成都": ("the Giant Panda Base at opening time", "Kuanzhai Alley", "a hotpot dinner"),
    "北京": ("the Forbidden City", "the hutongs around Houhai", "Peking duck"),
    "上海": ("the Bund at sunrise", "Yu Garden and the old town", "xiaolongbao"),
    "杭州": ("a boat on West Lake", "the Longjing tea fields", "a walk on the Su causeway"),
}
_ANY_CITY = ("the old town", "the city museum", "the night market")
_NO_CITY = "give a city: a data part {'city': ...}, or words naming one (e.g. 成都, Beijing)"


def plan_for(city: str) -> tuple[str, list[str]]:
    """The canned day in ``city``: the text answered, and its stops in order."""
    morning, afternoon, evening = PLANS.get(city, _ANY_CITY)
    text = f"A day in {city}: {morning}, then {afternoon}, and {evening}."
    return text, [morning, afternoon, evening]


def build_card(base_url: str) -> AgentCard:
    """The agent's card, for an agent serving at ``base_url`` (``http://HOST:PORT``)."""
    skill = AgentSkill(
        id=SKILL,
        name="Trip planner",
        description=DESCRIPTION,
        tags=["travel", "plan"],
        examples=EXAMPLES,
    )
    return AgentCard(
        name=ENDPOINT_ID.removeprefix("agent://"),  # `agent-reach a2a add` names it after this
        description="A demo A2A agent built with the a2a-sdk: a day's plan for a city",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=f"{base_url}/", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[skill],
    )


def _city(data: list[Any], text: str) -> str | None:
    """The city asked about: the first data part's ``city``, else the first one the text names."""
    for part in data:
        if isinstance(part, dict) and isinstance(part.get("city"), str) and part["city"]:
            return str(part["city"])
    return understand(text, dt.date.today())[0] if text else None


class TravelExecutor(AgentExecutor):
    """Answers each message with the plan for its city (module docstring)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """One ``SendMessage``: a Message with the plan as text and as data."""
        message = context.message
        data = get_data_parts(message.parts) if message is not None else []
        city = _city(data, context.get_user_input())
        if city is None:
            raise InvalidParamsError(message=_NO_CITY)
        text, stops = plan_for(city)
        # the gateway's trace id rides in the message's metadata: logged, so that this
        # agent's log line can be found from the gateway's trace
        meta = message.metadata if message is not None else None
        trace_id = str(meta["trace_id"]) if meta is not None and "trace_id" in meta else None
        logs.log(logging.INFO, "travel.planned", city=city, trace_id=trace_id)
        parts = [new_text_part(text), new_data_part({"city": city, "plan": stops})]
        await event_queue.enqueue_event(new_message(parts, context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Not offered: every answer is immediate, there is no task to cancel."""
        raise UnsupportedOperationError()


def build_app(card: AgentCard) -> Starlette:
    """The ASGI app: the card's route and the JSON-RPC route at ``/``."""
    handler = DefaultRequestHandler(
        agent_executor=TravelExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(
        routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")]
    )


class _Server(uvicorn.Server):
    """uvicorn's server, saying once on stdout where its card is, when it listens."""

    def __init__(self, config: uvicorn.Config, card_url: str) -> None:
        super().__init__(config)
        self._card_url = card_url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start, then print the line the stack waits for (only once it listens)."""
        await super().startup(sockets)
        if self.started:
            print(f"a2a agent {ENDPOINT_ID} listening on {self._card_url}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Serve on 127.0.0.1 until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description="The demo's A2A agent (travel.plan)")
    parser.add_argument("--port", type=int, default=0, help="port to serve on (0: any free)")
    args = parser.parse_args(argv)
    logs.configure("INFO")  # JSON lines on stderr, uvicorn's own lines too
    # bound here, not by uvicorn: port 0 is known (for the card's URLs) before it serves
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(
        build_app(build_card(base_url)),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    # uvicorn re-raises the signal it caught once it has shut down; with these handlers in
    # place the process then ends with status 0 rather than dying of the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda sig, frame: None)
    asyncio.run(_Server(config, base_url + AGENT_CARD_WELL_KNOWN_PATH).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
