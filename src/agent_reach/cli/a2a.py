"""``agent-reach a2a add CARD_URL``: register an A2A agent by its Agent Card (docs/a2a.md)."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib import error, request

import click

from agent_reach.cli import render
from agent_reach.cli.common import client_options, reach
from agent_reach.cli.endpoints import _endpoint_id, _intents
from agent_reach.core.names import is_endpoint_id
from agent_reach.errors import ConfigError

__all__ = ["a2a"]


@click.group()
def a2a() -> None:
    """A2A agents: register one by its Agent Card (docs/a2a.md)."""


def _name_of(card_url: str) -> str:
    """``agent://NAME`` from the card's ``name`` (lower case, runs of other characters as
    ``-``); ConfigError when the card cannot be read from here (give --id then)."""
    try:
        with request.urlopen(card_url, timeout=10) as answer:
            card: Any = json.loads(answer.read(1 << 20))
    except (OSError, ValueError, error.URLError) as exc:
        raise ConfigError(
            f"cannot read the card at {card_url} to name the agent ({exc}): give --id"
        ) from exc
    name = re.sub(r"[^a-z0-9._-]+", "-", str(card.get("name", "")).lower()).strip("-._")[:120]
    endpoint_id = f"agent://{name}"
    if not name or not is_endpoint_id(endpoint_id):
        raise ConfigError(f"the card's name {card.get('name')!r} is no agent://NAME: give --id")
    return endpoint_id


@a2a.command()
@click.argument("card_url", metavar="CARD_URL")
@click.option(
    "--id",
    "endpoint_id",
    callback=lambda ctx, param, value: None if value is None else _endpoint_id(ctx, param, value),
    help="the agent's id  [default: agent:// and the card's name]",
)
@click.option(
    "--intent",
    "intents",
    multiple=True,
    callback=lambda ctx, param, values: _intents(ctx, param, values) if values else [],
    metavar="TAG",
    help="the intents it serves (repeatable), instead of those its skills map to",
)
@client_options
def add(
    gateway: str,
    token: str | None,
    as_json: bool,
    card_url: str,
    endpoint_id: str | None,
    intents: list[str],
) -> None:
    """Register the A2A agent whose Agent Card is at CARD_URL.

    The gateway fetches the card (A2A 1.0 at /.well-known/agent-card.json; a v0.3 card at
    /.well-known/agent.json is read too), delivers to its JSON-RPC interface, maps its skills
    to intents (a skill id that is a tag; else the dictionary tag its words match at the
    threshold; else unmapped), and keeps it alive by fetching the card every heartbeat
    interval: the agent itself needs to do nothing.
    """
    if not card_url.startswith(("http://", "https://")):
        raise click.BadParameter("an http(s) URL of an Agent Card is needed", param_hint="CARD_URL")
    chosen = endpoint_id or _name_of(card_url)
    answer = reach(
        gateway, token, lambda client: client.register_card(chosen, card_url, intents or None)
    )
    if as_json:
        click.echo(render.to_json(answer))
        return
    card = answer.get("a2a", {})
    click.echo(f"registered {answer['endpoint_id']} from its A2A {card.get('card_version')} card")
    for skill in card.get("skills", []):
        where = skill.get("intent") or "unmapped"
        how = (
            f" ({skill['how']}"
            + (
                f", confidence {skill['confidence']:.2f})"
                if skill.get("how") == "dictionary"
                else ")"
            )
            if skill.get("how")
            else ""
        )
        click.echo(f"  skill {skill['id']} -> {where}{how}")
