"""The ``agent-reach`` command: parse flags, load settings, configure logging, start things.

``serve`` starts a gateway; the client commands (``agents``, ``send``, ``route``, ``trace``) are
thin: they parse, make one call through :class:`~agent_reach.sdk.client.ReachClient` and print
what :mod:`agent_reach.render` makes of the answer. Their exit codes are :class:`ExitCode`.
"""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import click
import msgspec
from aiohttp import web
from rich.console import Console

from agent_reach import logs, render
from agent_reach.errors import AgentReachError, GatewayUnavailable
from agent_reach.sdk.client import DEFAULT_TIMEOUT_MS, Priority, ReachClient
from agent_reach.settings import (
    DEFAULT_GATEWAY_URL,
    GATEWAY_ENV,
    GatewaySettings,
    gateway_urls,
    redacted,
)

__all__ = ["ExitCode", "main"]

T = TypeVar("T")

SHUTDOWN_S = 5.0


def _env(flag: str) -> str:
    return "AGENT_REACH_" + flag.upper().replace("-", "_")


def _option(flag: str, kind: Any, default: Any, help: str) -> Callable[[Any], Any]:
    return click.option(
        f"--{flag}",
        type=kind,
        default=default,
        envvar=_env(flag),
        show_default=True,
        show_envvar=True,
        help=help,
    )


class ExitCode(enum.IntEnum):
    """What the client commands exit with, for scripts."""

    OK = 0
    ERROR = 1  # the gateway answered with an error for the request (no_capable_agent, ...)
    USAGE = 2  # bad flags or arguments (click's own code); nothing was sent
    UNAVAILABLE = 3  # the gateway could not be reached or gave no usable answer
    PROBLEMS = 4  # `doctor` found problems
    INTERRUPTED = 130  # Ctrl-C


class _Group(click.Group):
    """Ctrl-C ends a command with 130 (128 + SIGINT), as shells expect, not click's 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-reach-gateway")
def main() -> None:
    """Agent-Reach: the address book, routing switch and heartbeat line between agents.

    The client commands (agents, send, route, trace) talk to the gateway named by --gateway or
    AGENT_REACH_GATEWAY (default http://127.0.0.1:7700); --json prints the wire contract's JSON
    on stdout, errors included.

    \b
    Exit codes:
      0  success
      1  the gateway answered with an error (no_capable_agent, deadline_exceeded, ...)
      2  usage error (bad flag, argument or JSON payload): nothing was sent
      3  the gateway could not be reached or gave no usable answer
      4  doctor found problems
      130  interrupted (Ctrl-C)
    """


@main.command()
@_option("host", str, "127.0.0.1", "bind address")
@_option("port", click.IntRange(0, 65535), 7700, "port (0 picks a free one)")
@_option(
    "registry",
    str,
    "memory://",
    "registry URL: memory:// (one process) or redis://HOST:PORT/DB (shared by many gateways)",
)
@_option(
    "registry-prefix",
    str,
    "agent-reach",
    "key prefix in a shared registry: several agent networks can share one Redis",
)
@_option(
    "workers",
    click.IntRange(1, 64),
    1,
    "gateway processes sharing the port (needs a shared registry such as redis://)",
)
@click.option("--reuse-port", is_flag=True, hidden=True)  # set by the --workers supervisor
@_option(
    "heartbeat-interval",
    click.FloatRange(min=0.01),
    10.0,
    "seconds between heartbeats that agents are told to keep",
)
@_option(
    "degraded-after",
    click.FloatRange(min=0.01),
    None,
    "seconds since the last heartbeat after which an endpoint is degraded [1 x interval]",
)
@_option("suspect-after", click.FloatRange(min=0.01), None, "... suspect [2 x interval]")
@_option("down-after", click.FloatRange(min=0.01), None, "... down [3 x interval]")
@_option(
    "slow-threshold-ms",
    click.FloatRange(min=1),
    2000.0,
    "mean latency of the last 5 deliveries above which an endpoint is degraded",
)
@_option(
    "overhead-reserve-ms",
    click.FloatRange(min=0),
    1000.0,
    "part of a request's deadline kept back for routing and network",
)
@_option(
    "confidence-threshold",
    click.FloatRange(0, 1, min_open=True),
    0.8,
    "minimum match confidence for a fallback (non-exact) match",
)
@_option(
    "purge-after",
    click.FloatRange(min=0.01),
    None,
    "seconds without a heartbeat after which a down record is deleted [max(3600, down-after)]",
)
@_option(
    "max-body-bytes",
    click.IntRange(min=1024),
    1 << 20,
    "largest request body (and agent answer) accepted",
)
@_option(
    "log-level",
    click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    "INFO",
    "JSON log lines at this level and above go to stderr",
)
def serve(reuse_port: bool, **flags: Any) -> None:
    """Start a gateway (on the embedded in-memory registry unless --registry says otherwise)."""
    settings = GatewaySettings(**flags)
    try:
        settings.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    logs.configure(settings.log_level)
    if settings.workers > 1:
        from agent_reach.gateway.workers import supervise

        raise click.exceptions.Exit(supervise(settings, sys.argv))
    _run(_serve(settings, reuse_port=reuse_port))


def _run(main_coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        asyncio.run(main_coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coro)


async def _serve(settings: GatewaySettings, *, reuse_port: bool = False) -> None:
    from agent_reach.gateway.app import GatewayHTTP

    try:
        http = GatewayHTTP(settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        await http.start()
    except ConnectionError as exc:  # the shared registry cannot be reached
        await http.close()
        raise click.ClickException(str(exc)) from exc
    # on SIGTERM, requests in flight get SHUTDOWN_S to finish (their deadlines may be longer)
    runner = web.ServerRunner(
        web.Server(http.handle, access_log=None),
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    # Long-lived start-up objects leave the collector's view, and young collections run less
    # often: cyclic GC was ~6 % of the gateway's CPU under load with the defaults (700, 10, 10).
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    site = web.TCPSite(
        runner,
        settings.host,
        settings.port,
        backlog=1024,
        reuse_address=True,
        reuse_port=reuse_port or None,
    )
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await http.close()
        raise click.ClickException(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}"
        ) from exc
    port = runner.addresses[0][1] if runner.addresses else settings.port
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{port}"
    registry = redacted(settings.registry)
    logs.log(logging.INFO, "gateway.listening", url=url, registry=registry)
    print(f"agent-reach gateway listening on {url} (registry {registry})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        logs.log(logging.INFO, "gateway.stopping")
        await runner.cleanup()
        await http.close()
        logs.log(logging.INFO, "gateway.stopped")


# --- client commands ---------------------------------------------------------------------------


def _stdout() -> Console:
    # no highlighting of numbers and strings: the colours carry meaning (status, outcome) only
    return Console(highlight=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _gateway(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    # one URL or several, comma-separated: the client fails over between them
    try:
        return ",".join(gateway_urls(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def _client_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--gateway URL`` and ``--json``, the options of every client command."""
    command = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="print the contract's JSON on stdout (error answers too), and nothing else",
    )(command)
    return click.option(
        "--gateway",
        metavar="URL",
        envvar=GATEWAY_ENV,
        show_envvar=True,
        callback=_gateway,
        help=f"the gateway to talk to (several: comma-separated, tried in turn)"
        f"  [default: {DEFAULT_GATEWAY_URL}]",
    )(command)


def _reach(gateway: str, as_json: bool, call: Callable[[ReachClient], Awaitable[T]]) -> T:
    """Run one client call; on an error answer print it and exit 1 (3: no usable gateway)."""

    async def go() -> T:
        async with ReachClient(gateway) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except AgentReachError as exc:
        _fail(exc, as_json)


def _fail(exc: AgentReachError, as_json: bool) -> NoReturn:
    if as_json:
        click.echo(render.to_json(exc.to_body()))
    else:
        _stderr().print(render.error_text(exc), soft_wrap=True)
    unavailable = isinstance(exc, GatewayUnavailable)
    raise click.exceptions.Exit(ExitCode.UNAVAILABLE if unavailable else ExitCode.ERROR)


def _payload(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """The JSON payload argument (``-``: read stdin), parsed before anything is sent."""
    if value is None:
        return {}
    source = "stdin" if value == "-" else "the argument"
    raw = sys.stdin.buffer.read() if value == "-" else value.encode()
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise click.BadParameter(
            f"the payload ({source}) is not valid JSON: {exc}", ctx, param
        ) from exc


@main.command()
@click.option("--intent", metavar="TAG", help="only the agents that declare this intent")
@click.option(
    "--status",
    "statuses",
    type=click.Choice(render.STATUSES),
    multiple=True,
    help="only the agents with this status (repeatable)",
)
@_client_options
def agents(gateway: str, as_json: bool, intent: str | None, statuses: tuple[str, ...]) -> None:
    """List the registered agents.

    One row per endpoint: its intents, status, last heartbeat and latencies.
    """
    listing = _reach(gateway, as_json, lambda client: client.agents())
    listing = render.filter_agents(listing, intent=intent, statuses=statuses)
    if as_json:
        click.echo(render.to_json(render.agents_body(listing)))
    else:
        _stdout().print(render.agents_table(listing, now=time.time()))


@main.command()
@click.argument("intent")
@click.argument("payload", required=False, callback=_payload, metavar="[JSON]")
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
@_client_options
def send(
    gateway: str,
    as_json: bool,
    intent: str,
    payload: Any,
    recipient_hint: str | None,
    timeout_ms: int,
    priority: str,
    trace_id: str | None,
    msg_id: str | None,
    sender: str | None,
) -> None:
    """Send a request to the agent that serves INTENT.

    JSON is the payload (default {}; - reads it from stdin). Prints the agent's result, the
    endpoint that answered, the attempts and the trace id.
    """
    reply = _reach(
        gateway,
        as_json,
        lambda client: client.send(
            intent,
            payload,
            recipient_hint=recipient_hint,
            timeout_ms=timeout_ms,
            priority=cast(Priority, priority),
            trace_id=trace_id,
            msg_id=msg_id,
            sender=sender,
        ),
    )
    if as_json:
        click.echo(render.to_json(render.reply_body(reply)))
    else:
        _stdout().print(render.reply_view(reply), soft_wrap=True)


@main.command()
@click.argument("intent")
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
@_client_options
def route(
    gateway: str, as_json: bool, intent: str, recipient_hint: str | None, timeout_ms: int | None
) -> None:
    """Explain the route a send of INTENT would take now.

    A dry run: nothing is delivered. Shows the candidates with status, confidence and why each
    is eligible or not, the one that would be chosen, its per-try timeout and how many retries
    the deadline allows.
    """
    explanation = _reach(
        gateway,
        as_json,
        lambda client: client.explain(intent, recipient_hint=recipient_hint, timeout_ms=timeout_ms),
    )
    if as_json:
        click.echo(render.to_json(render.route_body(explanation)))
    else:
        out = _stdout()
        out.print(render.route_view(explanation, width=out.width))


@main.command()
@click.argument("trace_id", metavar="TRACE_ID")
@_client_options
def trace(gateway: str, as_json: bool, trace_id: str) -> None:
    """Show the hops of a recent request as a timeline.

    An unknown (or expired) trace id is trace_not_found, exit 1.
    """
    found = _reach(gateway, as_json, lambda client: client.trace(trace_id))
    if as_json:
        click.echo(render.to_json(render.trace_body(found)))
    else:
        _stdout().print(render.trace_view(found), soft_wrap=True)


# --- doctor ------------------------------------------------------------------------------------


@main.command()
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
@_client_options
def doctor(
    gateway: str,
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

    findings = diagnose(_reach(gateway, as_json, read))
    if as_json:
        click.echo(render.to_json(render.findings_body(findings)))
    else:
        _stdout().print(render.findings_view(findings, verbose=verbose), soft_wrap=True)
    if worst(findings).rank >= Severity.WARNING.rank:
        raise click.exceptions.Exit(ExitCode.PROBLEMS)


# --- demo --------------------------------------------------------------------------------------


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="the gateway's bind address")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="the gateway's port (0 picks a free one)",
)
@click.option(
    "--keep-running",
    is_flag=True,
    help="after the scenarios, keep the gateway and agents up until Ctrl-C (make run)",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="where each process writes its JSON log lines  [default: a new temporary directory]",
)
def demo(host: str, port: int, keep_running: bool, log_dir: Path | None) -> None:
    """Start a gateway and the demo agents, play the seed's scenarios, stop.

    The weather, note and scheduler agents (python -m agent_reach.demo.NAME) register with a
    gateway on the in-memory registry; then: a request routed by intent, a side effect delivered
    once, an unknown intent refused (no_capable_agent), and the scheduler reaching the two others
    under one trace id. Exit 0 when every scenario ended as expected, 1 otherwise, 3 when the
    stack could not start.
    """
    from agent_reach.demo.run import run

    raise click.exceptions.Exit(
        run(_stdout(), host=host, port=port, keep_running=keep_running, log_dir=log_dir)
    )
