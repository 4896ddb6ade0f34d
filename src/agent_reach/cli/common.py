"""What the ``agent-reach`` commands share: flag helpers, consoles, the client call, and the
one mapping from errors to what is printed and to exit codes (:class:`Group`, :func:`exit_code`).

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
from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    ConfigError,
    GatewayUnavailable,
    InternalError,
    InvalidRequest,
)
from agent_reach.sdk.client import ReachClient
from agent_reach.settings import (
    DEFAULT_GATEWAY_URL,
    GATEWAY_ENV,
    TOKEN_ENV,
    gateway_urls,
    nats_gateway,
    not_over_nats,
)

__all__ = [
    "ExitCode",
    "Group",
    "client_options",
    "env_name",
    "exit_code",
    "fail",
    "gateway_options",
    "json_option",
    "one_line",
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
    """What every command exits with, for scripts; :func:`exit_code` maps errors to them."""

    OK = 0
    # the gateway answered with an error for the request (no_capable_agent, ...), or something
    # this process needs is away (backend_unavailable: the shared registry) or broke
    ERROR = 1
    # bad flags or arguments (click's own code), or a configuration refused (config_error: a
    # setting, the policy file, the key directory): nothing was sent, nothing started
    USAGE = 2
    UNAVAILABLE = 3  # the gateway could not be reached or gave no usable answer
    PROBLEMS = 4  # `doctor` found problems
    INTERRUPTED = 130  # Ctrl-C


# where a command's --json flag is kept for the error mapping (click's meta is shared by a
# command's context and the root group's)
_JSON_META = "agent_reach.json"


def exit_code(exc: AgentReachError) -> ExitCode:
    """The exit code of a command that ended in ``exc``: the one table of the CLI.

    ``gateway_unavailable`` is 3; a configuration refused by this process, or a value the
    client refused before sending anything (:class:`ConfigError`, :class:`InvalidRequest`, not
    rebuilt from an answer) is 2; every other error is 1: an error answer of the gateway
    (whatever its code), a backing service that cannot be reached, a fault of ours.
    """
    if isinstance(exc, GatewayUnavailable):
        return ExitCode.UNAVAILABLE
    if isinstance(exc, ConfigError | InvalidRequest) and exc.http_status is None:
        return ExitCode.USAGE
    return ExitCode.ERROR


def _of_this_process(exc: AgentReachError) -> bool:
    """Whether ``exc`` is about this process's own set-up (a configuration, a backing
    service, a fault) rather than about a call to a gateway."""
    return exc.http_status is None and isinstance(
        exc, ConfigError | BackendUnavailable | InternalError
    )


def one_line(exc: AgentReachError) -> str:
    """An error in one line, naming the file or setting at fault (and the line) when known:
    ``policy.toml line 3: ...``."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ConfigError) and exc.source and exc.source not in text:
        where = exc.source if exc.line is None else f"{exc.source} line {exc.line}"
        text = f"{where}: {text}"
    return text


def fail(exc: AgentReachError, as_json: bool) -> NoReturn:
    """Print how a command failed and exit with :func:`exit_code`.

    An error of this process's set-up is one line on stderr (``Error: ...``, as click prints
    its own). An error of a call to a gateway is its code, detail and fields on stderr, or, with
    ``--json``, the contract's error body on stdout.
    """
    if _of_this_process(exc):
        click.echo(f"Error: {one_line(exc)}", err=True)
    elif as_json:
        click.echo(render.to_json(exc.to_body()))
    else:
        stderr().print(render.error_text(exc), soft_wrap=True)
    raise click.exceptions.Exit(exit_code(exc)) from None


class Group(click.Group):
    """The root group: every command's errors end here, in :func:`fail` (printed, then the
    exit code of :func:`exit_code`); Ctrl-C ends a command with 130 (128 + SIGINT), as shells
    expect, not click's 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
        except AgentReachError as exc:
            fail(exc, bool(ctx.meta.get(_JSON_META)))


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta[_JSON_META] = value
    return value


def json_option(help: str) -> Callable[[Any], Any]:
    """``--json`` (as ``as_json``): a command's output as JSON; its error answers too."""
    return click.option("--json", "as_json", is_flag=True, callback=_remember_json, help=help)


def stdout() -> Console:
    """The console of results (no highlighting: the colours carry meaning only)."""
    return Console(highlight=False)


def stderr() -> Console:
    """The console of errors."""
    return Console(stderr=True, highlight=False)


def _gateway(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    # one URL or several, comma-separated: the client fails over between them (or, nats://
    # ones, the servers of one NATS system); a command that cannot go over NATS says so in
    # reach(), when it calls the gateway (offline `auth token --keys` never does)
    try:
        return ",".join(gateway_urls(value))
    except ConfigError as exc:
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
        help=f"the gateway to talk to (several: comma-separated, tried in turn); or"
        f" nats://HOST:PORT[/PREFIX] for register, heartbeat, deregister and send over NATS"
        f"  [default: {DEFAULT_GATEWAY_URL}]",
    )(command)


def client_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--gateway URL``, ``--token TOKEN`` and ``--json``, the options of every client
    command."""
    command = json_option(
        "print the contract's JSON on stdout (error answers too), and nothing else"
    )(command)
    return gateway_options(
        command,
        token_help="bearer token for a gateway in token mode (docs/security.md)"
        "  [default: none: open mode]",
    )


def reach(
    gateway: str,
    token: str | None,
    call: Callable[[ReachClient], Awaitable[T]],
    *,
    over_nats: bool = False,
) -> T:
    """Run one client call and return its result; an error answer (or no usable gateway) goes
    up to :class:`Group`, which prints it as ``--json`` asks and exits 1 (3).

    ``over_nats``: whether the call is one the gateway serves over NATS (register, heartbeat,
    deregister, send); if not, a ``nats://`` gateway is refused before anything is sent
    (ConfigError, exit 2), naming the command."""
    if not over_nats and nats_gateway(gateway_urls(gateway)) is not None:
        context = click.get_current_context(silent=True)
        raise not_over_nats(f"`{context.command_path}`" if context else "this command")

    async def go() -> T:
        async with ReachClient(gateway, token=token) as client:
            return await call(client)

    return asyncio.run(go())
