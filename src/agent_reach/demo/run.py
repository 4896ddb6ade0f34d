"""``agent-reach demo`` and ``make run``: the stack, the seed's three scenarios, one more hop,
one agent on NATS when a nats-server answers, one built with the a2a-sdk, and two requests in
words.

The scenarios: a request routed by intent (``weather.query``), a side effect delivered once
(``note.create``), a request refused rather than misdelivered (``unknown.action`` ->
``no_capable_agent``, with the nearest tags), and an agent reaching two others through the
gateway under one trace id (``schedule.plan``). With NATS (``$AGENT_REACH_NATS``, default
``nats://127.0.0.1:4222``, probed with a bound before anything starts) the gateway runs with
``--nats`` and one more scenario reaches an agent that serves over NATS (``air.query``);
without it, one line says that NATS was skipped and why, and the rest is the same. With the
a2a-sdk's server installed (:func:`~agent_reach.demo.stack.a2a_unavailable`), an A2A agent built
with it (``agent://travel-a2a-01``, :mod:`agent_reach.demo.travel`) is registered by its Agent
Card, and one more scenario reaches it by its skill's tag (``travel.plan``): the gateway delivers
it as A2A ``SendMessage``, and the output names the ``a2a+http`` endpoint and the answer's text;
without it, one line says that A2A was skipped and why. Then two
requests in words only (``intent_text``, no tag, no payload), matched against the demo's
dictionary (``intents.toml``): one in Chinese that reaches the weather agent by meaning (the
output says how it matched: method, tag, confidence), and one that nothing serves, refused with
the nearest tags and their confidences. The first needs the semantic matcher: when the gateway
runs another one (the semantic extra not installed), one line says so and it is skipped.
Scenarios are numbered in the order played; the summary counts those played. ``run`` returns
the exit code: 0 when every scenario ended as expected, 1 when one did not, 3 when the stack
could not start.
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
    a2a_unavailable,
    nats_unavailable,
    start,
)
from agent_reach.errors import ReachError
from agent_reach.sdk.client import EMPTY, SyncReachClient
from agent_reach.settings import redacted

__all__ = ["A2A_SCENARIOS", "NATS_SCENARIOS", "SCENARIOS", "WORDS_SCENARIOS", "Scenario", "run"]

_INDENT = 3  # a scenario's lines, under its title


class Scenario(NamedTuple):
    """One request of the demo and the outcome it should have."""

    title: str
    intent: str | None  # None: words only
    payload: dict[str, Any] | None  # None: none sent
    expect: str  # "ok" or the contract error code expected
    text: str | None = None  # the request in words (intent_text)
    semantic: bool = False  # needs the semantic matcher (skipped under another)


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
# played when the demo has its A2A agent: a request delivered as A2A SendMessage
A2A_SCENARIOS = (Scenario("Over A2A, ingested by its card", "travel.plan", {"city": "成都"}, "ok"),)
# played last: requests in words only, matched against the demo's dictionary
WORDS_SCENARIOS = (
    Scenario(
        "Ask in words, no tag", None, None, "ok", text="帮我查一下明天成都的天气", semantic=True
    ),
    Scenario("Out of scope, in words", None, None, "no_capable_agent", text="tell me a joke"),
)


def _play(
    client: SyncReachClient, n: int, sc: Scenario, out: Console, urls: dict[str, str]
) -> bool:
    asked = [f"[cyan]{sc.intent}[/]"] if sc.intent else []
    if sc.text is not None:
        asked.append(escape(f"--text {json.dumps(sc.text, ensure_ascii=False)}"))
    if sc.payload is not None:
        asked.append(escape(json.dumps(sc.payload, ensure_ascii=False)))
    elif sc.intent is None:
        asked.append("(no intent, no payload)")
    out.print(f"\n[bold]{n}. {sc.title}[/]: send {' '.join(asked)}")
    payload = EMPTY if sc.payload is None else sc.payload
    try:
        reply = client.send(sc.intent, payload, intent_text=sc.text, timeout_ms=5000)
    except ReachError as exc:
        good = exc.code == sc.expect
        mark = "[green]as expected[/]" if good else f"[red]expected {sc.expect}[/]"
        out.print(f"   refused: [yellow]{exc.code}[/] ({escape(exc.detail)}) {mark}")
        if "suggestions" in exc.fields:
            out.print(f"   nearest tags: {_nearest(exc.fields['suggestions'])}")
        out.print(f"   trace {exc.trace_id}, attempts {len(exc.attempts)}")
        return good
    hops = " -> ".join(f"{a.endpoint_id} {a.outcome} {a.latency_ms:.1f} ms" for a in reply.attempts)
    out.print(f"   answered by [green]{reply.endpoint_id}[/] in {reply.latency_ms:.1f} ms ({hops})")
    match = reply.match
    if match is not None and match.method != "exact":
        out.print(
            f"   matched [cyan]{match.tag}[/] (method {match.method},"
            f" confidence {match.confidence:.2f})"
        )
    endpoint = urls.get(reply.endpoint_id, "")
    if endpoint.startswith("nats:"):
        shown = escape(endpoint)
        out.print(f"   delivered over NATS to [cyan]{shown}[/] (the agent opens no port)")
    said = _a2a_text(reply.result) if endpoint.startswith("a2a+") else None
    if said is not None:
        # the A2A Message as received is long (ids, roles, parts): its text says enough
        out.print(f"   delivered over A2A (SendMessage) to [cyan]{escape(endpoint)}[/]")
        out.print(f"   answer {escape(json.dumps(said, ensure_ascii=False))}", soft_wrap=True)
    else:
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


def _a2a_text(result: Any) -> str | None:
    """The text parts of an A2A answer (``{"message": ...}`` or a task's artifacts), joined;
    None when it has none."""
    if not isinstance(result, dict):
        return None
    holders: list[Any] = []
    if isinstance(result.get("message"), dict):
        holders.append(result["message"])
    if isinstance(result.get("task"), dict) and isinstance(result["task"].get("artifacts"), list):
        holders += result["task"]["artifacts"]
    texts = [
        part["text"]
        for holder in holders
        if isinstance(holder, dict) and isinstance(holder.get("parts"), list)
        for part in holder["parts"]
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    return " ".join(texts) if texts else None


def _nearest(suggestions: Any) -> str:
    """A refusal's suggestions as printed: ``tag confidence`` each, best first."""
    listed = [
        f"{escape(str(s.get('tag')))} {float(s.get('confidence', 0.0)):.2f}"
        for s in (suggestions if isinstance(suggestions, list) else [])
        if isinstance(s, dict)
    ]
    return ", ".join(listed) if listed else "none (no known tag resembles it)"


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
    intents = f"  intents     {escape(stack.intents)} (--intents)\n" if stack.intents else ""
    air = (
        f'  agent-reach send air.query \'{{"city": "成都"}}\' --gateway {url}   # over NATS\n'
        if stack.on_nats()
        else ""
    )
    travel = "".join(
        f'  agent-reach send travel.plan \'{{"city": "北京"}}\' --gateway {url}   # over A2A\n'
        f"  agent-reach a2a add {card} --gateway {url}   # by its card, again\n"
        for card in stack.cards.values()
    )
    out.print(
        f"""
[bold]Agent-Reach is running.[/]
  gateway     {url}
  dashboard   {url}/
  metrics     {url}/metrics
  mcp         {url}/mcp  (for an LLM host: streamable HTTP; docs/mcp.md)
{nats}{intents}  logs        {stack.log_dir}/  (JSON lines, one file per process)
"""
        + "".join(_agent_line(stack, eid, mod, urls) for eid, mod in stack.agents.items())
        + f"""
Try:
  agent-reach agents --gateway {url}
  agent-reach send weather.query '{{"city": "成都"}}' --gateway {url}
{air}{travel}  agent-reach send --text '北京明天会下雨吗' --gateway {url}   # in words, any language
  agent-reach route weather.query --gateway {url}
  agent-reach intents --gateway {url}
  agent-reach doctor --gateway {url}

Point an MCP host at it (docs/mcp.md), by URL or as a command over stdio:
  claude mcp add --transport http agent-reach {url}/mcp
  claude mcp add agent-reach -- {escape(_agent_reach_command())} mcp --gateway {url}

Ctrl-C stops everything.""",
        highlight=False,
    )
    while not stop.wait(0.5):
        gone = stack.exited()
        if gone is not None:
            out.print(f"[red]{gone} exited[/] (see {stack.log_dir}/{gone}.log); stopping the rest")
            break


def _agent_reach_command() -> str:
    """The ``agent-reach`` command of this install (an MCP host starts it by its path)."""
    import shutil
    import sys

    beside = Path(sys.executable).with_name("agent-reach")
    return str(beside) if beside.exists() else shutil.which("agent-reach") or "agent-reach"


def _agent_line(stack: Stack, endpoint_id: str, module: str, urls: dict[str, str]) -> str:
    if endpoint_id in stack.cards:
        card = escape(stack.cards[endpoint_id])
        return f"  {endpoint_id:<24}python -m {module}  (A2A, ingested by its card {card})\n"
    if endpoint_id not in stack.on_nats():
        return f"  {endpoint_id:<24}python -m {module}\n"
    where = escape(urls.get(endpoint_id, "nats:"))
    serve = _shown(stack.nats or "")
    return f"  {endpoint_id:<24}{SERVE_ENV}={serve} python -m {module}  (over {where})\n"


def _shown(servers: str) -> str:
    """NATS server addresses as printed: without their passwords."""
    return ",".join(redacted(url.strip()) for url in servers.split(","))


def _skipped_for_matcher(stack: Stack) -> list[str]:
    """The titles of the scenarios that the gateway's matcher cannot play (none: semantic)."""
    return [] if stack.matcher == "semantic" else [s.title for s in WORDS_SCENARIOS if s.semantic]


def _matcher_line(stack: Stack) -> str:
    """The gateway's dictionary and matcher (in its own words), and what is skipped for it."""
    where = escape(stack.intents) if stack.intents else "none"
    note = escape(stack.matcher_note or f"matcher {stack.matcher or 'unknown'}")
    skipped = "".join(f"; {title!r} skipped" for title in _skipped_for_matcher(stack))
    return f"Intents: dictionary {where}; {note}{skipped}"


def _nats_servers(given: str | None) -> tuple[str | None, str]:
    """The NATS servers to use (None: skip NATS) and, when skipped, why."""
    servers = given if given is not None else os.environ.get(NATS_ENV, DEFAULT_NATS)
    if not servers.strip():
        return None, f"{NATS_ENV} is empty"
    reason = nats_unavailable(servers)
    return (None, reason) if reason else (servers, "")


def _a2a_line(stack: Stack, urls: dict[str, str], skipped: str) -> str:
    """Which agents speak A2A, by which card; or why none does."""
    if not stack.cards:
        return f"A2A skipped: {escape(skipped)}; no agent over A2A"
    listed = ", ".join(
        f"{eid} ({urls.get(eid, '?')}) built with the a2a-sdk, ingested by its card {card}"
        for eid, card in stack.cards.items()
    )
    return f"A2A: {escape(listed)}"


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
    no_a2a = a2a_unavailable()
    try:
        stack = start(logs, host=host, port=port, nats=servers, a2a=no_a2a is None)
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
            out.print(_a2a_line(stack, urls, no_a2a or ""))
            out.print(_matcher_line(stack))
            unplayable = _skipped_for_matcher(stack)
            words = tuple(sc for sc in WORDS_SCENARIOS if sc.title not in unplayable)
            a2a = A2A_SCENARIOS if stack.cards else ()
            scenarios = SCENARIOS + (NATS_SCENARIOS if servers else ()) + a2a + words
            results = [_play(client, n, sc, out, urls) for n, sc in enumerate(scenarios, 1)]
        ok = all(results)
        out.print(
            f"\n{sum(results)}/{len(results)} scenarios as expected"
            + (f"; on NATS: {', '.join(stack.on_nats())}" if servers else "; NATS skipped")
            + (f"; over A2A: {', '.join(stack.on_a2a())}" if stack.cards else "; A2A skipped")
            + "".join(f"; {title!r} skipped ({stack.matcher} matcher)" for title in unplayable)
            + ("" if ok else " [red](see the logs)[/]")
        )
        if keep_running:
            _serve_until_stopped(stack, out, urls)
        return 0 if ok else 1
    finally:
        stack.stop()
