"""The ``agent-reach`` command: parse flags, load settings, configure logging, start things.

``serve`` starts a gateway and ``demo`` a whole stack; the client commands (``agents``,
``send``, ``route``, ``trace``, ``doctor``) are in :mod:`agent_reach.cli.client`, ``register``,
``heartbeat`` and ``deregister`` in :mod:`agent_reach.cli.endpoints`, the ``auth``
group (keys, tokens, policy check) in :mod:`agent_reach.cli.auth`, the ``intents`` group (the
dictionary: list, check, match) in :mod:`agent_reach.cli.intents`, and what they share (flags
read from ``AGENT_REACH_*``, :class:`ExitCode`) in :mod:`agent_reach.cli.common`.

A serving gateway re-reads its intent dictionary (and, in token mode, its keys and policy) on
SIGHUP, as ``POST /v1/reload`` does; a bad file is refused (logged) and the old one stays.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
from aiohttp import web

from agent_reach.cli.a2a import a2a
from agent_reach.cli.auth import auth
from agent_reach.cli.client import COMMANDS as CLIENT_COMMANDS
from agent_reach.cli.common import ExitCode, Group, env_name, option, stdout
from agent_reach.cli.directory import directory
from agent_reach.cli.endpoints import COMMANDS as ENDPOINT_COMMANDS
from agent_reach.cli.intents import intents
from agent_reach.cli.mcp import mcp
from agent_reach.errors import AgentReachError
from agent_reach.observability import logs
from agent_reach.settings import GatewaySettings, redacted

__all__ = ["ExitCode", "main"]

SHUTDOWN_S = 5.0
# the GIL's switch interval in a gateway (sys.setswitchinterval): a thread running Python beside
# the loop (an index build, a scrape) gives the GIL back within this when the loop wants it.
# 5 ms (Python's default) -> 1 ms: scenario 15's fuzz 8.5x -> 1.6x (F3); 1 ms -> 0.25 ms: the
# p99 beside the lexical build of 50,000 tags 6.1 -> 3.4-4.0 ms (F10)
SWITCH_INTERVAL_S = 0.00025


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="agent-reach-gateway")
def main() -> None:
    """Agent-Reach: the address book, routing switch and heartbeat line between agents.

    The client commands (agents, send, route, trace, doctor, register, heartbeat, deregister)
    talk to the gateway named by --gateway or AGENT_REACH_GATEWAY (default
    http://127.0.0.1:7700; send, register, heartbeat and deregister also over NATS:
    nats://HOST:PORT[/PREFIX]), with the bearer token of --token or AGENT_REACH_TOKEN when it
    runs in token mode; --json prints the wire contract's JSON on stdout, errors included.
    `auth` makes keys and tokens and checks a policy file.

    \b
    Exit codes:
      0  success
      1  the gateway answered with an error (no_capable_agent, deadline_exceeded, ...);
         serve: the shared registry cannot be reached, the port is taken
      2  usage error (bad flag, argument or JSON payload), or a configuration refused
         (config_error: a setting, the policy file, the key directory): nothing was sent
         or started
      3  the gateway could not be reached or gave no usable answer
      4  doctor found problems
      130  interrupted (Ctrl-C)
    """


@main.command()
@option("host", str, "127.0.0.1", "bind address")
@option("port", click.IntRange(0, 65535), 7700, "port (0 picks a free one)")
@option(
    "registry",
    str,
    "memory://",
    "registry URL: memory:// (one process) or redis://HOST:PORT/DB (shared by many gateways)",
)
@option(
    "registry-prefix",
    str,
    "agent-reach",
    "key prefix in a shared registry: several agent networks can share one Redis",
)
@option(
    "workers",
    click.IntRange(1, 64),
    1,
    "gateway processes sharing the port (needs a shared registry such as redis://)",
)
@click.option("--reuse-port", is_flag=True, hidden=True)  # set by the --workers supervisor
@option(
    "heartbeat-interval",
    click.FloatRange(min=0.01),
    10.0,
    "seconds between heartbeats that agents are told to keep",
)
@option(
    "degraded-after",
    click.FloatRange(min=0.01),
    None,
    "seconds since the last heartbeat after which an endpoint is degraded [1 x interval]",
)
@option("suspect-after", click.FloatRange(min=0.01), None, "... suspect [2 x interval]")
@option("down-after", click.FloatRange(min=0.01), None, "... down [3 x interval]")
@option(
    "slow-threshold-ms",
    click.FloatRange(min=1),
    2000.0,
    "mean latency of the last 5 deliveries above which an endpoint is degraded",
)
@option(
    "overhead-reserve-ms",
    click.FloatRange(min=0),
    1000.0,
    "part of a request's deadline kept back for routing and network",
)
@option(
    "confidence-threshold",
    click.FloatRange(0, 1, min_open=True),
    0.8,
    "minimum match confidence for a fallback (non-exact) match",
)
@option(
    "intents",
    click.Path(dir_okay=False, path_type=str),
    None,
    "the intent dictionary, a TOML file (docs/intents.md); re-read on SIGHUP and POST /v1/reload",
    metavar="FILE",
)
@option(
    "intent-mode",
    click.Choice(["open", "warn", "strict"]),
    None,
    "registering a tag outside the dictionary: open (allowed), warn (allowed, logged and "
    "counted), strict (422 unknown_intent)  [default: warn with --intents, else open]",
)
@option(
    "matcher",
    str,
    "semantic",
    "the fallback matcher when no tag matches exactly or by alias: semantic (local "
    "multilingual embeddings; lexical when the semantic extra is not installed), lexical, none, "
    "or MODULE:CALLABLE (a matcher of your own, docs/matching.md)",
    metavar="NAME",
)
@option(
    "purge-after",
    click.FloatRange(min=0.01),
    None,
    "seconds without a heartbeat after which a down record is deleted [max(3600, down-after)]",
)
@option(
    "max-body-bytes",
    click.IntRange(min=1024),
    1 << 20,
    "largest request body (and agent answer) accepted",
)
@option(
    "auth",
    click.Choice(["open", "tokens"]),
    "open",
    "open: no credentials (127.0.0.1 only, unless --insecure-open-mode); tokens: every call"
    " needs a reach token, and --policy says who may reach and claim what (docs/security.md)",
)
@option(
    "keys",
    str,
    None,
    "token mode: the signing keys' directory (agent-reach auth keygen --keys DIR)",
    metavar="DIR",
)
@option(
    "policy",
    str,
    None,
    "token mode: the policy file (TOML; agent-reach auth check-policy FILE)",
    metavar="FILE",
)
@click.option(
    "--insecure-open-mode",
    is_flag=True,
    envvar=env_name("insecure-open-mode"),
    show_envvar=True,
    help="DANGEROUS: serve open mode on an address other than loopback. ANYONE WHO CAN REACH"
    " THE ADDRESS MAY REGISTER, DEREGISTER AND SEND AS ANY AGENT. Use --auth tokens instead",
)
@option(
    "rate-limit",
    click.FloatRange(min=0, min_open=True),
    None,
    "requests a second allowed per sender (429 rate_limited beyond)  [default: no limit]",
    metavar="FLOAT",
)
@option(
    "rate-burst",
    click.FloatRange(min=1),
    None,
    "requests a sender may make at once before --rate-limit applies  [default: max(1, rate)]",
    metavar="FLOAT",
)
@option(
    "endpoint-networks",
    str,
    None,
    "comma-separated CIDRs that endpoint URLs may point into  [default: any but denied ones]",
    metavar="CIDRS",
)
@option(
    "endpoint-token-ttl",
    click.FloatRange(min_open=True, min=0),
    900.0,
    "seconds an endpoint token lives (renewed by its heartbeats)",
    metavar="SECONDS",
)
@option(
    "reload-interval",
    click.FloatRange(min=0, min_open=True),
    2.0,
    "seconds between checks of the key directory and the policy file for changes",
    metavar="SECONDS",
)
@option(
    "nats",
    str,
    None,
    "NATS servers (nats://HOST:PORT, comma-separated): agents may then register nats:SUBJECT "
    "endpoints (docs/nats.md)",
    metavar="URLS",
)
@option(
    "nats-prefix",
    str,
    "agent-reach",
    "subject prefix reserved for the gateway's own API over NATS",
    metavar="SUBJECT",
)
@option(
    "a2a-card-keys",
    str,
    None,
    'a JWKS file (JSON, {"keys": [...]}) of the public keys that signed A2A Agent Cards are'
    " verified with: a card that carries signatures must then have one valid (docs/a2a.md)",
    metavar="FILE",
)
@option(
    "mcp-max-sessions",
    click.IntRange(min=0),
    100,
    "MCP sessions open at once on /mcp (503 past it); 0: no /mcp (docs/mcp.md)",
    metavar="N",
)
@option(
    "mcp-session-idle",
    click.FloatRange(min=0, min_open=True),
    600.0,
    "seconds an MCP session may sit without a request before it is closed",
    metavar="SECONDS",
)
@option(
    "max-connections",
    click.IntRange(min=0),
    0,
    "open HTTP connections held at most; past it the oldest idle one is closed for a new one"
    "  (0: the open-files limit less 256)",
    metavar="N",
)
@option(
    "idle-timeout",
    click.FloatRange(min=0, min_open=True),
    30.0,
    "seconds an HTTP connection may send nothing, before its first request or between two,"
    " before it is closed",
    metavar="SECONDS",
)
@option(
    "read-timeout",
    click.FloatRange(min=0, min_open=True),
    30.0,
    "seconds an HTTP request may take to arrive whole (head and body) from its first byte;"
    " past it the connection is closed (a client trickling bytes cannot hold it)",
    metavar="SECONDS",
)
@option(
    "max-inflight",
    click.IntRange(min=1),
    1024,
    "requests in delivery at once; past it 503 overloaded with Retry-After (low priority is"
    " refused past 70 %, normal past 90 %, high only at 100 %)",
    metavar="N",
)
@option(
    "max-inflight-per-endpoint",
    click.IntRange(min=1),
    64,
    "attempts open to one endpoint at once; past it a request goes to another candidate, or"
    " waits for a slot (high priority first, within --max-inflight)",
    metavar="N",
)
@option(
    "max-endpoints",
    click.IntRange(min=1),
    100_000,
    "records the registry holds at most (down ones count until purged); a new id past it "
    "gets 503 registry_full",
    metavar="N",
)
@option(
    "register-rate-limit",
    click.FloatRange(min=0),
    50.0,
    "registrations a second per address (open mode) or token subject; 0: no limit",
    metavar="PER_S",
)
@option(
    "register-rate-burst",
    click.FloatRange(min=1),
    500.0,
    "the registration bucket's size",
    metavar="N",
)
@option(
    "domain",
    str,
    "local",
    "this gateway's domain (federation): its endpoints are agent://NAME@DOMAIN elsewhere",
    metavar="NAME",
)
@option(
    "directory",
    str,
    None,
    "the federation directory's URL (`agent-reach directory`): publish this domain's summary"
    " there and forward what no local agent can serve (docs/federation.md)",
    metavar="URL",
)
@option(
    "summary-interval",
    click.FloatRange(min=0, min_open=True),
    5.0,
    "seconds between two publications of the summary (a peer's older than 3 is not used)",
    metavar="SECONDS",
)
@option(
    "advertise-url",
    str,
    None,
    "the URL other domains' gateways forward to  [http://HOST:PORT as bound]",
    metavar="URL",
)
@option(
    "peer-token",
    str,
    None,
    "token mode: the peer token this gateway presents to the directory and to other domains"
    "  [one it signs itself for --domain with --keys]",
    metavar="TOKEN",
)
@option(
    "log-level",
    click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    "INFO",
    "JSON log lines at this level and above go to stderr",
)
def serve(reuse_port: bool, **flags: Any) -> None:
    """Start a gateway (on the embedded in-memory registry unless --registry says otherwise)."""
    # a ConfigError (exit 2) or BackendUnavailable (exit 1) raised here, or from inside _serve,
    # goes up to the Group of cli.common, which prints it in one line and maps its exit code
    settings = GatewaySettings(**flags)
    settings.check()
    logs.configure(settings.log_level)
    if settings.workers > 1:
        from agent_reach.gateway.workers import supervise

        _check_access_files(settings)
        raise click.exceptions.Exit(supervise(settings, sys.argv))
    _run(_serve(settings, reuse_port=reuse_port))


def _check_access_files(settings: GatewaySettings) -> None:
    """Under --workers: refuse a bad intent dictionary, and in token mode bad keys or policy,
    once, in the supervisor, rather than in every worker (each would fail the same way)."""
    if settings.intents:
        from agent_reach.intents.dictionary import load_dictionary

        load_dictionary(settings.intents)  # DictionaryError: exit 2, naming the line
    if settings.open_mode:
        return
    from agent_reach.gateway.access import Access

    Access(settings).load()  # PolicyFileError, KeyDirectoryError: exit 2


def _run(main_coro: Any) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        asyncio.run(main_coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main_coro)


async def _serve(settings: GatewaySettings, *, reuse_port: bool = False) -> None:
    from agent_reach.edges.http.app import HttpEdge
    from agent_reach.edges.http.server import ReachServer, default_max_connections
    from agent_reach.gateway.node import Node

    node = Node(settings)  # a ConfigError here, or from start(), is mapped by the Group
    http = HttpEdge(node)
    mcp = None
    if settings.mcp_max_sessions:  # MCP at /mcp, beside the HTTP API (built at its first use)
        from agent_reach.edges.mcp.edge import McpEdge

        # a worker of --workers shares the port: a session would live in one process only
        mcp = McpEdge(node, stateless=reuse_port)
        http.mount("/mcp", mcp.handle)
    # the gateway as an A2A agent: its card and POST /a2a (edges/a2a)
    from agent_reach.edges.a2a.edge import CARD_PATH, RPC_PATH, A2aEdge

    a2a_edge = A2aEdge(node)
    http.mount(CARD_PATH, a2a_edge.card)
    http.mount(RPC_PATH, a2a_edge.rpc)
    bus = None
    try:
        await node.start()  # keys, policy, registry (BackendUnavailable), transports
        if node.nats is not None:  # the API over NATS too, in the prefix's queue group
            from agent_reach.edges.nats.edge import NatsEdge

            bus = NatsEdge(node)
            await bus.start()
    except BaseException:
        await node.close()
        raise
    # on SIGTERM, requests in flight get SHUTDOWN_S to finish (their deadlines may be longer)
    runner = web.ServerRunner(
        # malformed HTTP: the contract's body; the connections bounded in number and idleness
        ReachServer(
            http.handle,
            access_log=None,
            max_connections=settings.max_connections or default_max_connections(),
            keepalive_timeout=settings.idle_timeout,
            read_timeout=settings.read_timeout,
            on_read_timeout=node.metrics.http_read_timeouts.inc,
            fast=http,  # POST /v1/send and /v1/heartbeat read and answered on httptools
            on_malformed=node.metrics.http_malformed.inc,
            on_evicted=node.metrics.http_evicted.inc,
        ),
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    # Long-lived start-up objects leave the collector's view, and young collections run less
    # often: cyclic GC was ~6 % of the gateway's CPU under load with the defaults (700, 10, 10).
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    # The loop gets the GIL back within 0.25 ms, not the interpreter's 5 ms, from a thread
    # running Python beside it (a /metrics scrape, the MCP SDK's import, a matcher build):
    # with one thread alone nothing changes (docs/reliability.md, scenario 15: F3, F10)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
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
        if bus is not None:
            await bus.close()
        if mcp is not None:
            await mcp.close()
        await node.close()
        raise click.ClickException(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}"
        ) from exc
    # the signals are handled before the start line is printed: whoever waits for that line
    # may signal at once
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    rereads: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)

    def on_hangup() -> None:
        task = asyncio.ensure_future(_reread(node))
        rereads.add(task)
        task.add_done_callback(rereads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    port = runner.addresses[0][1] if runner.addresses else settings.port
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    url = f"http://{host}:{port}"
    registry = redacted(settings.registry)
    if node.membership is not None:  # federation: publish where other domains forward to
        node.membership.serving(settings.advertise_url or url)
    logs.log(logging.INFO, "gateway.listening", url=url, registry=registry)
    print(f"agent-reach gateway listening on {url} (registry {registry})", flush=True)
    try:
        with node.metrics.gc_pauses.installed():  # agent_reach_gc_pause_seconds
            await stop.wait()
    finally:
        logs.log(logging.INFO, "gateway.stopping")
        # both edges stop taking requests, and give those in hand SHUTDOWN_S, side by side
        # (MCP: its tool calls in hand too, then its sessions end, open event streams with them)
        await asyncio.gather(
            runner.cleanup(),
            bus.close(SHUTDOWN_S) if bus else asyncio.sleep(0),
            mcp.close(SHUTDOWN_S) if mcp else asyncio.sleep(0),
        )
        await node.close()
        logs.log(logging.INFO, "gateway.stopped")


async def _reread(node: Any) -> None:
    """SIGHUP: re-read the dictionary, keys and policy as ``POST /v1/reload`` does. A refusal
    is logged where it is made (``intent.dictionary_refused``, ``auth.reload_failed``) and the
    old files stay in force."""
    try:
        answer = await node.service.reread()
    except AgentReachError as exc:
        logs.log(logging.WARNING, "gateway.reload_refused", signal="SIGHUP", error=str(exc))
        return
    except Exception:  # a bug must not end the process: the next SIGHUP tries again
        logs.log(logging.ERROR, "gateway.reload_error", signal="SIGHUP", exc_info=True)
        return
    logs.log(logging.INFO, "gateway.reloaded", signal="SIGHUP", intents=answer.get("intents"))


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
    under one trace id. When a nats-server answers on $AGENT_REACH_NATS (default
    nats://127.0.0.1:4222), the gateway runs with --nats and the air agent serves over NATS
    beside them (a fifth scenario reaches it); otherwise one line says why not. Exit 0 when
    every scenario ended as expected, 1 otherwise, 3 when the stack could not start.
    """
    from agent_reach.demo.run import run

    raise click.exceptions.Exit(
        run(stdout(), host=host, port=port, keep_running=keep_running, log_dir=log_dir)
    )


for command in (*CLIENT_COMMANDS, *ENDPOINT_COMMANDS, auth, intents, mcp, a2a):
    main.add_command(command)
main.add_command(directory)
