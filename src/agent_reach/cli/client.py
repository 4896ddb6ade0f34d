"""The client commands: ``agents``, ``send``, ``route``, ``trace`` and ``doctor`` (and, in
:mod:`agent_reach.cli.endpoints`, ``register``, ``heartbeat`` and ``deregister``).

Thin: they parse, make one call through :class:`~agent_reach.sdk.client.ReachClient` and print
what :mod:`agent_reach.cli.render` makes of the answer. Their exit codes are
:class:`~agent_reach.cli.common.ExitCode`.
"""

from __future__ import annotations

import sys
import time
from typing import Any, cast

import click
import msgspec

from agent_reach.cli import render
from agent_reach.cli.common import ExitCode, client_options, reach, stdout
from agent_reach.sdk.client import DEFAULT_TIMEOUT_MS, Priority, ReachClient
from agent_reach.wire.bodies import AGENTS_MAX_LIMIT

__all__ = ["COMMANDS", "agents", "doctor", "route", "send", "trace"]


def _payload(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """The JSON payload argument (``-``: read stdin), parsed before anything is sent."""
    if value is None:
        return {}
    source = "stdin" if value == "-" else "the argument"
    # surrogateescape: an argument's bytes as the shell gave them (not UTF-8: not JSON, said)
    raw = sys.stdin.buffer.read() if value == "-" else value.encode(errors="surrogateescape")
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        why = str(exc) or "nested too deeply"
        raise click.BadParameter(
            f"the payload ({source}) is not valid JSON: {why}", ctx, param
        ) from None


@click.command()
@click.option("--intent", metavar="TAG", help="only the agents that declare this intent")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(render.STATUSES),
    multiple=True,
    help="only the agents with this status (repeatable)",
)
@client_options
def agents(
    gateway: str, token: str | None, as_json: bool, intent: str | None, statuses: tuple[str, ...]
) -> None:
    """List the registered agents, in endpoint id order.

    One row per endpoint: its intents, status, last heartbeat and latencies. The gateway
    filters, and the list is read a page of 1,000 agents at a time.
    """
    listing = reach(
        gateway,
        token,
        lambda client: client.agents(intent=intent, status=statuses, page_size=AGENTS_MAX_LIMIT),
    )
    if as_json:
        click.echo(render.to_json(render.agents_body(listing)))
    else:
        out = stdout()
        out.print(render.agents_table(listing, now=time.time(), width=out.width))


_TEXT = click.option(
    "--text",
    "intent_text",
    metavar="WORDS",
    help="what you want, in words (any language): with it INTENT may be left out, and the "
    "gateway's matcher finds the tag when no agent declares INTENT (docs/intents.md)",
)
_NO_FALLBACK = click.option(
    "--no-fallback",
    "no_fallback",
    is_flag=True,
    help="only an exact tag: no alias of the dictionary, no match by meaning",
)


@click.command()
@click.argument("intent", required=False)
@click.argument("payload", required=False, callback=_payload, metavar="[JSON]")
@_TEXT
@_NO_FALLBACK
@click.option(
    "--to",
    "--recipient-hint",
    "recipient_hint",
    metavar="ENDPOINT_ID",
    help="deliver to this endpoint only (agent://NAME), even when it is suspect",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=DEFAULT_TIMEOUT_MS,
    show_default=True,
    help="the whole deadline of the request",
)
@click.option(
    "--priority",
    type=click.Choice(["low", "normal", "high"]),
    default="normal",
    show_default=True,
    help="carried to the agent",
)
@click.option("--trace-id", help="the request's trace id  [default: generated]")
@click.option("--msg-id", help="the request's message id  [default: generated]")
@click.option("--sender", metavar="ENDPOINT_ID", help="who sends (agent://NAME)")
@client_options
def send(
    gateway: str,
    token: str | None,
    as_json: bool,
    intent: str | None,
    payload: Any,
    intent_text: str | None,
    no_fallback: bool,
    recipient_hint: str | None,
    timeout_ms: int,
    priority: str,
    trace_id: str | None,
    msg_id: str | None,
    sender: str | None,
) -> None:
    """Send a request to the agent that serves INTENT (or what --text says).

    JSON is the payload (default {}; - reads it from stdin). Prints the agent's result, the
    endpoint that answered, how the tag matched, the attempts and the trace id.
    """
    if intent is None and intent_text is None:
        raise click.UsageError("give INTENT, --text WORDS or both")
    reply = reach(
        gateway,
        token,
        lambda client: client.send(
            intent,
            payload,
            intent_text=intent_text,
            fallback=not no_fallback,
            recipient_hint=recipient_hint,
            timeout_ms=timeout_ms,
            priority=cast(Priority, priority),
            trace_id=trace_id,
            msg_id=msg_id,
            sender=sender,
        ),
        over_nats=True,
    )
    if as_json:
        click.echo(render.to_json(render.reply_body(reply)))
    else:
        stdout().print(render.reply_view(reply), soft_wrap=True)


@click.command()
@click.argument("intent", required=False)
@_TEXT
@_NO_FALLBACK
@click.option(
    "--to",
    "--recipient-hint",
    "recipient_hint",
    metavar="ENDPOINT_ID",
    help="explain a send to this endpoint only (agent://NAME)",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="the deadline the retries are counted for  [default: the gateway's, 8000]",
)
@client_options
def route(
    gateway: str,
    token: str | None,
    as_json: bool,
    intent: str | None,
    intent_text: str | None,
    no_fallback: bool,
    recipient_hint: str | None,
    timeout_ms: int | None,
) -> None:
    """Explain the route a send of INTENT (or what --text says) would take now.

    A dry run: nothing is delivered. Shows the candidates with status, confidence and why each
    is eligible or not, the one that would be chosen, its per-try timeout and how many retries
    the deadline allows.
    """
    if intent is None and intent_text is None:
        raise click.UsageError("give INTENT, --text WORDS or both")
    explanation = reach(
        gateway,
        token,
        lambda client: client.explain(
            intent,
            intent_text=intent_text,
            fallback=not no_fallback,
            recipient_hint=recipient_hint,
            timeout_ms=timeout_ms,
        ),
    )
    if as_json:
        click.echo(render.to_json(render.route_body(explanation)))
    else:
        out = stdout()
        out.print(render.route_view(explanation, width=out.width))


@click.command()
@click.argument("trace_id", metavar="TRACE_ID")
@client_options
def trace(gateway: str, token: str | None, as_json: bool, trace_id: str) -> None:
    """Show the hops of a recent request as a waterfall.

    One row per request, route and attempt, with its offset, duration and a bar on the
    trace's time line; the requests an agent made while handling one (same trace id) are
    nested under the attempt that reached it. An unknown (or expired) trace id is
    trace_not_found, exit 1.
    """
    found = reach(gateway, token, lambda client: client.trace(trace_id))
    if as_json:
        click.echo(render.to_json(render.trace_body(found)))
    else:
        out = stdout()
        out.print(render.trace_view(found, width=out.width))


# --- doctor ------------------------------------------------------------------------------------


@click.command()
@click.option(
    "--intent",
    "intents",
    multiple=True,
    metavar="TAG",
    help="an intent your callers use (repeatable): checked even if this gateway never saw it",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    help="the deadline your callers use: sizes the retry advice  [default: the gateway's 8000]",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.01),
    help="for gateways without /v1/diagnostics only (others say their own)",
)
@click.option("--verbose", "-v", is_flag=True, help="also show the evidence of passed checks")
@client_options
def doctor(
    gateway: str,
    token: str | None,
    as_json: bool,
    intents: tuple[str, ...],
    timeout_ms: int | None,
    heartbeat_interval: float | None,
    verbose: bool,
) -> None:
    """Run the troubleshooting checklist against a live gateway.

    \b
    Checks: agents failing to register (empty registry); intents callers ask that no agent
    declares (tag near misses); agents not routed (status, heartbeat age, route reason);
    sporadic timeouts (p95 latency vs per-try timeout); retry storms (retry rate, budget).
    Each finding comes with its evidence and the next step. Exit 0 when nothing is worse than
    info, 4 when a warning or an error was found, 3 when the gateway cannot be read.
    """
    from agent_reach.doctor import Severity, diagnose, gather, worst

    async def read(client: ReachClient) -> Any:
        async def text(path: str) -> str:
            if path != "/metrics":
                raise ValueError(f"doctor reads only /metrics as text, not {path}")
            return await client.metrics()

        return await gather(
            client.get,
            text,
            now=time.time(),
            heartbeat_interval=heartbeat_interval,
            intents=intents,
            timeout_ms=timeout_ms,
        )

    findings = diagnose(reach(gateway, token, read))
    if as_json:
        click.echo(render.to_json(render.findings_body(findings)))
    else:
        stdout().print(render.findings_view(findings, verbose=verbose), soft_wrap=True)
    if worst(findings).rank >= Severity.WARNING.rank:
        raise click.exceptions.Exit(ExitCode.PROBLEMS)


COMMANDS = (agents, send, route, trace, doctor)
