"""The ``agent-reach`` command: parse flags, load settings, configure logging, start things."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from typing import Any

import click
from aiohttp import web

from agent_reach import logs
from agent_reach.settings import GatewaySettings

__all__ = ["main"]

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-reach-gateway")
def main() -> None:
    """Agent-Reach: the address book, routing switch and heartbeat line between agents."""


@main.command()
@_option("host", str, "127.0.0.1", "bind address")
@_option("port", click.IntRange(0, 65535), 7700, "port (0 picks a free one)")
@_option("registry", str, "memory://", "registry URL")
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
def serve(**flags: Any) -> None:
    """Start a gateway on the embedded in-memory registry."""
    settings = GatewaySettings(**flags)
    try:
        settings.check()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    logs.configure(settings.log_level)
    _run(_serve(settings))


def _run(main_coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        asyncio.run(main_coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coro)


async def _serve(settings: GatewaySettings) -> None:
    from agent_reach.gateway.app import GatewayHTTP

    try:
        http = GatewayHTTP(settings)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    await http.start()
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
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024, reuse_address=True)
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
    logs.log(logging.INFO, "gateway.listening", url=url, registry=settings.registry)
    print(f"agent-reach gateway listening on {url} (registry {settings.registry})", flush=True)
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
