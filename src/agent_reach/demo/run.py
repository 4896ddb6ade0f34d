"""``agent-reach demo`` and ``make run``: the stack, the seed's three scenarios, one more hop,
and one agent on NATS when a nats-server answers.

The scenarios: a request routed by intent (``weather.query``), a side effect delivered once
(``note.create``), a request refused rather than misdelivered (``unknown.action`` ->
``no_capable_agent``), and an agent reaching two others through the gateway under one trace id
(``schedule.plan``). With NATS (``$AGENT_REACH_NATS``, default ``nats://127.0.0.1:4222``,
probed with a bound before anything starts) the gateway runs with ``--nats`` and one more
scenario reaches an agent that serves over NATS (``air.query``); without it, one line says
that NATS was skipped and why, and the rest is the same. ``run`` returns the exit code: 0 when
every scenario ended as expected, 1 when one did not, 3 when the stack could not start.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from agent_reach.cli.trace_view import trace_view
from agent_reach.demo.stack import (
    DEFAULT_NATS,
    NATS_ENV,
    SERVE_ENV,
    Stack,
    StackError,
    nats_unavailable,
    start,
)
from agent_reach.errors import ReachError
from agent_reach.sdk.client import SyncReachClient
from agent_reach.settings import redacted

__all__ = ["NATS_SCENARIOS", "SCENARIOS", "Scenario", "run"]

_INDENT = 3  # a scenario's lines, under its title


class Scenario(NamedTuple):
    """One request of the demo and the outcome it should have."""

    title: str
    intent: str
    payload: dict[str, Any]
    expect: str  # "ok" or the contract error code expected


SCENARIOS = (
    Scenario("Route by intent", "weather.query", {"city": "成都", "date": "2025-01-02"}, "ok"),
    Scenario("A side effect, once", "note.create", {"title": "todo", "text": "buy tea"}, "ok"),
    Scenario("Refuse rather than misdeliver", "unknown.action", {}, "no_capable_agent"),
    Scenario(
        "Agent to agent, one trace id",
        "schedule.plan",
        {"task": "visit the panda base", "city": "成都", "date": "2025-01-02"},
        "ok",
    ),
)
# played when the demo has NATS: a request whose delivery travels over NATS
NATS_SCENARIOS = (
    Scenario(
        "Over NATS, no inbound port", "air.query", {"city": "成都", "date": "2025-01-02"}, "ok"
    ),
)


def _play(
    client: SyncReachClient, n: int, sc: Scenario, out: Console, urls: dict[str, str]
) -> bool:
    payload = escape(json.dumps(sc.payload, ensure_ascii=False))
    out.print(f"\n[bold]{n}. {sc.title}[/]: send [cyan]{sc.intent}[/] {payload}")
    try:
        reply = client.send(sc.intent, sc.payload, timeout_ms=5000)
    except ReachError as exc:
        good = exc.code == sc.expect
        mark = "[green]as expected[/]" if good else f"[red]expected {sc.expect}[/]"
        out.print(f"   refused: [yellow]{exc.code}[/] ({escape(exc.detail)}) {mark}")
        out.print(f"   trace {exc.trace_id}, attempts {len(exc.attempts)}")
        return good
    hops = " -> ".join(f"{a.endpoint_id} {a.outcome} {a.latency_ms:.1f} ms" for a in reply.attempts)
    out.print(f"   answered by [green]{reply.endpoint_id}[/] in {reply.latency_ms:.1f} ms ({hops})")
    endpoint = urls.get(reply.endpoint_id, "")
    if endpoint.startswith("nats:"):
        shown = escape(endpoint)
        out.print(f"   delivered over NATS to [cyan]{shown}[/] (the agent opens no port)")
    result = escape(json.dumps(reply.result, ensure_ascii=False))
    out.print(f"   result {result}", soft_wrap=True)
    if sc.intent == "schedule.plan":
        _waterfall(client, reply.trace_id, out)
    else:
        out.print(f"   trace {reply.trace_id}")
    good = sc.expect == "ok"
    if not good:
        out.print(f"   [red]expected {sc.expect}[/]")
    return good


def _waterfall(client: SyncReachClient, trace_id: str, out: Console) -> None:
    """The trace as ``agent-reach trace`` shows it (its first line names the trace): the
    scheduler's request, and its two onward hops nested under the attempt that reached it."""
    width = max(1, out.width - _INDENT)
    view = trace_view(client.trace(trace_id), width=width)
    # indented line by line rather than padded: nothing is written after a line's text
    for segments in out.render_lines(view, out.options.update(width=width), pad=False):
        line = Text(" " * _INDENT)
        for segment in segments:
            line.append(segment.text, segment.style)
        out.print(line)


def _serve_until_stopped(stack: Stack, out: Console, urls: dict[str, str]) -> None:
    # the handlers first: a Ctrl-C right after the banner must stop the stack in order too
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = stack.url
    nats = ""
    if stack.nats:
        nats = f"  nats        {_shown(stack.nats)} (the gateway runs with --nats)\n"
    air = (
        f'  agent-reach send air.query \'{{"city": "成都"}}\' --gateway {url}   # over NATS\n'
        if stack.on_nats()
        else ""
    )
    out.print(
        f"""
[bold]Agent-Reach is running.[/]
  gateway     {url}
  dashboard   {url}/
  metrics     {url}/metrics
{nats}  logs        {stack.log_dir}/  (JSON lines, one file per process)
"""
        + "".join(_agent_line(stack, eid, mod, urls) for eid, mod in stack.agents.items())
        + f"""
Try:
  agent-reach agents --gateway {url}
  agent-reach send weather.query '{{"city": "成都"}}' --gateway {url}
{air}  agent-reach route weather.query --gateway {url}
  agent-reach doctor --gateway {url}

Ctrl-C stops everything.""",
        highlight=False,
    )
    while not stop.wait(0.5):
        gone = stack.exited()
        if gone is not None:
            out.print(f"[red]{gone} exited[/] (see {stack.log_dir}/{gone}.log); stopping the rest")
            break


def _agent_line(stack: Stack, endpoint_id: str, module: str, urls: dict[str, str]) -> str:
    if endpoint_id not in stack.on_nats():
        return f"  {endpoint_id:<24}python -m {module}\n"
    where = escape(urls.get(endpoint_id, "nats:"))
    serve = _shown(stack.nats or "")
    return f"  {endpoint_id:<24}{SERVE_ENV}={serve} python -m {module}  (over {where})\n"


def _shown(servers: str) -> str:
    """NATS server addresses as printed: without their passwords."""
    return ",".join(redacted(url.strip()) for url in servers.split(","))


def _nats_servers(given: str | None) -> tuple[str | None, str]:
    """The NATS servers to use (None: skip NATS) and, when skipped, why."""
    servers = given if given is not None else os.environ.get(NATS_ENV, DEFAULT_NATS)
    if not servers.strip():
        return None, f"{NATS_ENV} is empty"
    reason = nats_unavailable(servers)
    return (None, reason) if reason else (servers, "")


def run(
    out: Console,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    keep_running: bool = False,
    log_dir: Path | None = None,
    nats: str | None = None,
) -> int:
    """Start the stack, play the scenarios, then stop (or serve until Ctrl-C); the exit code.

    ``nats``: the NATS servers to try (default ``$AGENT_REACH_NATS``, else
    ``nats://127.0.0.1:4222``; empty: no NATS)."""
    logs = log_dir or Path(tempfile.mkdtemp(prefix="agent-reach-demo-"))
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    servers, skipped = _nats_servers(nats)
    try:
        stack = start(logs, host=host, port=port, nats=servers)
    except StackError as exc:
        out.print(f"[red]demo could not start:[/] {escape(str(exc))}")
        return 3
    try:
        out.print(
            f"gateway {stack.url} and {len(stack.agents)} agents registered"
            f" in {time.monotonic() - started:.1f} s (logs in {logs})"
        )
        with SyncReachClient(stack.url) as client:
            urls = {a.endpoint_id: a.endpoint_url for a in client.agents()}
            on_nats = ", ".join(f"{eid} ({urls.get(eid, '?')})" for eid in stack.on_nats())
            if servers:
                shown = _shown(servers)
                out.print(f"NATS {shown}: {escape(on_nats)} over NATS, the others over HTTP")
            else:
                out.print(f"NATS skipped: {escape(skipped)}; every agent over HTTP")
            scenarios = SCENARIOS + (NATS_SCENARIOS if servers else ())
            results = [_play(client, n, sc, out, urls) for n, sc in enumerate(scenarios, 1)]
        ok = all(results)
        out.print(
            f"\n{sum(results)}/{len(results)} scenarios as expected"
            + (f"; on NATS: {', '.join(stack.on_nats())}" if servers else "; NATS skipped")
            + ("" if ok else " [red](see the logs)[/]")
        )
        if keep_running:
            _serve_until_stopped(stack, out, urls)
        return 0 if ok else 1
    finally:
        stack.stop()
