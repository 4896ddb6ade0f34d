"""The endpoint commands: ``register``, ``heartbeat`` and ``deregister``.

For endpoints not kept by the agent SDK (a script, a NATS responder of one's own, a test) and
for operators. Thin, as the other client commands: one call through
:class:`~agent_reach.sdk.client.ReachClient` each, over HTTP or over NATS (these three and
``send`` are what the gateway serves over NATS), printed as the answer says; exit codes are
:class:`~agent_reach.cli.common.ExitCode`.
"""

from __future__ import annotations

import click
import msgspec

from agent_reach.cli import render
from agent_reach.cli.common import client_options, reach
from agent_reach.core.names import is_endpoint_id
from agent_reach.sdk.client import ReachClient

__all__ = ["COMMANDS", "deregister", "heartbeat", "register"]


def _endpoint_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``agent://NAME``, or ``NAME`` for it; a usage error otherwise, before anything is sent."""
    endpoint_id = value if value.startswith("agent://") else f"agent://{value}"
    if not is_endpoint_id(endpoint_id):
        raise click.BadParameter(f"an agent://NAME id is needed, not {value!r}", ctx, param)
    return endpoint_id


def _intents(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    """Repeated and comma-separated tags, in order, each once."""
    found = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if not found:
        raise click.BadParameter("at least one intent is needed", ctx, param)
    return list(dict.fromkeys(found))


@click.command()
@click.argument("endpoint_id", metavar="ENDPOINT_ID", callback=_endpoint_id)
@click.argument("endpoint_url", metavar="ENDPOINT_URL")
@click.option(
    "--intent",
    "intents",
    multiple=True,
    required=True,
    callback=_intents,
    metavar="TAG",
    help="an intent the endpoint serves (repeatable, or comma-separated)",
)
@click.option("--description", default="", help="what the endpoint does, for people and matching")
@client_options
def register(
    gateway: str,
    token: str | None,
    as_json: bool,
    endpoint_id: str,
    endpoint_url: str,
    intents: list[str],
    description: str,
) -> None:
    """Register (or replace) ENDPOINT_ID, delivered to at ENDPOINT_URL.

    ENDPOINT_URL: http(s)://HOST:PORT/PATH, or nats:SUBJECT on a gateway started with --nats.
    Prints the heartbeat interval the endpoint must keep and, in token mode (--token: an
    enrollment token), the endpoint token its heartbeats and deregistration present.
    """
    answer = reach(
        gateway,
        token,
        lambda client: client.register(endpoint_id, intents, endpoint_url, description),
        over_nats=True,
    )
    if as_json:
        click.echo(render.to_json(msgspec.to_builtins(answer)))
        return
    every = f"{answer.heartbeat_interval_s:g}"
    click.echo(f"registered {answer.endpoint_id}: heartbeat every {every} s")
    if answer.token is not None:
        click.echo(f"endpoint token {answer.token}")


@click.command()
@click.argument("endpoint_id", metavar="ENDPOINT_ID", callback=_endpoint_id)
@client_options
def heartbeat(gateway: str, token: str | None, as_json: bool, endpoint_id: str) -> None:
    """Send one heartbeat for ENDPOINT_ID; prints its status.

    An id the gateway does not know is endpoint_not_registered (exit 1): register it again.
    In token mode, --token is the endpoint token (a renewed one is printed when the gateway
    gives it).
    """

    async def beat(client: ReachClient) -> tuple[str, str | None]:
        status = await client.heartbeat(endpoint_id)
        return status, client.endpoint_token(endpoint_id)  # a renewal, if one came

    status, renewed = reach(gateway, token, beat, over_nats=True)
    if as_json:
        body = {"endpoint_id": endpoint_id, "status": status}
        if renewed is not None:
            body["token"] = renewed
        click.echo(render.to_json(body))
        return
    click.echo(f"{endpoint_id} {status}")
    if renewed is not None:
        click.echo(f"endpoint token {renewed}")


@click.command()
@click.argument("endpoint_id", metavar="ENDPOINT_ID", callback=_endpoint_id)
@client_options
def deregister(gateway: str, token: str | None, as_json: bool, endpoint_id: str) -> None:
    """Remove ENDPOINT_ID's record (endpoint_not_registered, exit 1, if there is none).

    In token mode, --token is the endpoint token (or an operator token).
    """
    reach(gateway, token, lambda client: client.deregister(endpoint_id), over_nats=True)
    if as_json:
        click.echo(render.to_json({"ok": True}))
    else:
        click.echo(f"deregistered {endpoint_id}")


COMMANDS = (register, heartbeat, deregister)
