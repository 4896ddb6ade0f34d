"""``agent-reach directory``: run the federation directory
(:mod:`agent_reach.federation.directory`).

It prints one line once it serves, ``agent-reach directory listening on http://HOST:PORT
(store: memory)``, and stops cleanly on SIGINT or SIGTERM (requests in hand get
:data:`SHUTDOWN_S`). Errors of its set-up go up to the root group (:mod:`agent_reach.cli.common`):
a configuration refused is exit 2, a store that cannot be reached exit 1.

``--host``, ``--port`` and ``--max-body-bytes`` are read from no environment variable: a
gateway's ``AGENT_REACH_PORT`` (and the others) in the same environment means something else.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

import click
from aiohttp import web

from agent_reach.cli.common import env_name, option
from agent_reach.federation.directory import Directory, DirectorySettings
from agent_reach.observability import logs
from agent_reach.settings import redacted

__all__ = ["directory"]

SHUTDOWN_S = 5.0
IDLE_TIMEOUT_S = 30.0
_D = DirectorySettings()


def _plain(flag: str, kind: Any, default: Any, help: str) -> Callable[[Any], Any]:
    """``--FLAG`` read from the command line only."""
    return click.option(f"--{flag}", type=kind, default=default, show_default=True, help=help)


@click.command()
@_plain("host", str, _D.host, "bind address")
@_plain("port", click.IntRange(0, 65535), _D.port, "port (0 picks a free one)")
@option(
    "registry",
    str,
    _D.registry,
    "where the summaries are kept: memory:// (one directory process) or redis://HOST:PORT/DB"
    " (shared by several)",
)
@option("registry-prefix", str, _D.registry_prefix, "key prefix in a shared Redis")
@option(
    "auth",
    click.Choice(["open", "tokens"]),
    _D.auth,
    "open: no credentials (127.0.0.1 only, unless --insecure-open-mode); tokens: publishing"
    " needs the domain's peer token, reading a peer or operator token",
)
@option(
    "keys",
    str,
    _D.keys,
    "token mode: the key directory the tokens are signed with (agent-reach auth keygen)",
    metavar="DIR",
)
@option(
    "summary-ttl",
    click.FloatRange(min=0, min_open=True),
    _D.summary_ttl,
    "seconds a summary is kept and handed out after it was received",
    metavar="SECONDS",
)
@_plain(
    "max-body-bytes",
    click.IntRange(min=1024),
    _D.max_body_bytes,
    "largest summary accepted (413 payload_too_large beyond)",
)
@option(
    "max-domains",
    click.IntRange(min=1),
    _D.max_domains,
    "summaries held at most; a new domain past it gets 503 registry_full",
    metavar="N",
)
@click.option(
    "--insecure-open-mode",
    is_flag=True,
    envvar=env_name("insecure-open-mode"),
    show_envvar=True,
    help="DANGEROUS: serve open mode on an address other than loopback. ANYONE WHO CAN REACH"
    " THE ADDRESS MAY PUBLISH ANY DOMAIN'S SUMMARY. Use --auth tokens instead",
)
@option(
    "log-level",
    click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    _D.log_level,
    "JSON log lines at this level and above go to stderr",
)
def directory(**flags: Any) -> None:
    """Run the federation directory: gateways of each domain publish their summaries here and
    take the others' (docs/cli.md)."""
    settings = DirectorySettings(**flags)
    settings.check()  # ConfigError: exit 2, by the root group
    logs.configure(settings.log_level)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        asyncio.run(_serve(settings))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve(settings))


async def _serve(settings: DirectorySettings) -> None:
    from agent_reach.edges.http.server import ReachServer, default_max_connections

    service = Directory(settings)
    await service.start()  # KeyDirectoryError (exit 2), BackendUnavailable (exit 1)
    runner = web.ServerRunner(
        # malformed HTTP: the contract's body; connections bounded in number and idleness
        ReachServer(
            service.handle,
            access_log=None,
            max_connections=default_max_connections(),
            keepalive_timeout=IDLE_TIMEOUT_S,
        ),
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await service.close()
        raise click.ClickException(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}"
        ) from exc
    # the signals are handled before the line is printed: whoever waits for it may signal at once
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = runner.addresses[0][1] if runner.addresses else settings.port
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{port}"
    store = "memory" if service.store.kind == "memory" else f"redis {redacted(settings.registry)}"
    logs.log(
        logging.INFO,
        "directory.listening",
        url=url,
        store=service.store.kind,
        registry=redacted(settings.registry),
        auth=settings.auth,
        summary_ttl_s=settings.summary_ttl,
    )
    print(f"agent-reach directory listening on {url} (store: {store})", flush=True)
    try:
        await stop.wait()
    finally:
        logs.log(logging.INFO, "directory.stopping")
        await runner.cleanup()
        await service.close()
        logs.log(logging.INFO, "directory.stopped")
