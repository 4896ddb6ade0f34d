"""What the ``agent-reach`` commands share: flag helpers, exit codes, consoles, the client call.

Kept apart from :mod:`agent_reach.cli.main` so that command groups in other modules
(:mod:`agent_reach.cli.auth`) use the same helpers without importing the entry point.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from agent_reach.cli import render
from agent_reach.errors import AgentReachError, ConfigError, GatewayUnavailable
from agent_reach.sdk.client import ReachClient
from agent_reach.settings import DEFAULT_GATEWAY_URL, GATEWAY_ENV, TOKEN_ENV, gateway_urls

__all__ = [
    "ExitCode",
    "Group",
    "client_options",
    "env_name",
    "fail",
    "gateway_options",
    "option",
    "reach",
    "stderr",
    "stdout",
]

T = TypeVar("T")


def env_name(flag: str) -> str:
    """The variable a flag is also read from: ``--rate-limit`` -> ``AGENT_REACH_RATE_LIMIT``."""
    return "AGENT_REACH_" + flag.upper().replace("-", "_")


def option(
    flag: str, kind: Any, default: Any, help: str, *, metavar: str | None = None
) -> Callable[[Any], Any]:
    """``--FLAG`` also read from ``AGENT_REACH_<FLAG>`` (the flag wins), default shown."""
    return click.option(
        f"--{flag}",
        type=kind,
        default=default,
        envvar=env_name(flag),
        show_default=True,
        show_envvar=True,
        metavar=metavar,
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


class Group(click.Group):
    """Ctrl-C ends a command with 130 (128 + SIGINT), as shells expect, not click's 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None


def stdout() -> Console:
    """The console of results (no highlighting: the colours carry meaning only)."""
    return Console(highlight=False)


def stderr() -> Console:
    """The console of errors."""
    return Console(stderr=True, highlight=False)


def _gateway(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    # one URL or several, comma-separated: the client fails over between them
    try:
        return ",".join(gateway_urls(value))
    except (ValueError, ConfigError) as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def gateway_options(command: Callable[..., Any], *, token_help: str) -> Callable[..., Any]:
    """``--gateway URL`` and ``--token TOKEN``: where a command's calls go, and as whom."""
    command = click.option(
        "--token",
        metavar="TOKEN",
        envvar=TOKEN_ENV,
        show_envvar=True,
        help=token_help,
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


def client_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--gateway URL``, ``--token TOKEN`` and ``--json``, the options of every client
    command."""
    command = click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="print the contract's JSON on stdout (error answers too), and nothing else",
    )(command)
    return gateway_options(
        command,
        token_help="bearer token for a gateway in token mode (docs/security.md)"
        "  [default: none: open mode]",
    )


def reach(
    gateway: str,
    token: str | None,
    as_json: bool,
    call: Callable[[ReachClient], Awaitable[T]],
) -> T:
    """Run one client call; on an error answer print it and exit 1 (3: no usable gateway)."""

    async def go() -> T:
        async with ReachClient(gateway, token=token) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except AgentReachError as exc:
        fail(exc, as_json)


def fail(exc: AgentReachError, as_json: bool) -> NoReturn:
    """Print an error answer (stderr, or its contract JSON on stdout) and exit 1 (3: the
    gateway could not be reached)."""
    if as_json:
        click.echo(render.to_json(exc.to_body()))
    else:
        stderr().print(render.error_text(exc), soft_wrap=True)
    unavailable = isinstance(exc, GatewayUnavailable)
    raise click.exceptions.Exit(ExitCode.UNAVAILABLE if unavailable else ExitCode.ERROR)
