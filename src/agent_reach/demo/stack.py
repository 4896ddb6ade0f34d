"""Start a gateway and the demo agents as child processes, and stop them again.

Used by ``agent-reach demo`` and ``make run``. Each process writes its JSON log lines to a file
of its own in ``log_dir``; the gateway's URL is read from the line it prints when it listens.

With a NATS server (``start(..., nats=URL)``, after :func:`nats_unavailable` said it answers),
the gateway runs with ``--nats URL`` and the agents of :data:`NATS_AGENTS` serve over NATS
(``AGENT_REACH_SERVE=URL`` in their environment: no inbound port, a ``nats:SUBJECT`` endpoint);
the agents of :data:`AGENTS` always serve over HTTP (``AGENT_REACH_SERVE`` is taken out of their
environment, whatever the caller's shell holds). Without NATS only :data:`AGENTS` run.

With ``start(..., a2a=True)`` (after :func:`a2a_unavailable` said the a2a-sdk's server is
installed) the agents of :data:`A2A_AGENTS` run too: built with the a2a-sdk, not with our agent
SDK, they do not register themselves. Each prints its Agent Card's URL once it listens, and the
stack registers it by that card (``POST /v1/register`` with ``a2a_card_url``, through the client
SDK's ``register_card``); the gateway then keeps it alive by fetching the card
(docs/a2a.md). ``Stack.cards`` holds the card URL of each.

The gateway runs with ``--intents`` on the dictionary shipped in this package
(:data:`DICTIONARY`, ``intents.toml``, read through :mod:`importlib.resources`, so that it works
from a wheel as from a checkout) and the default matcher. :func:`start` returns once every agent
is registered and, with a fallback matcher on, once the matcher answers (its first index, built
off the request path as the gateway starts, is in force): a request in words played at once is
matched, not refused for want of an index. ``Stack.matcher`` is the matcher the gateway says it
runs (its ``intent.matcher`` log line: ``semantic``, ``lexical`` or ``none``; the lexical one
when the semantic extra is not installed) and ``Stack.matcher_note`` its note.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from agent_reach.errors import AgentReachError, GatewayUnavailable, NoCapableAgent
from agent_reach.gateway.children import die_with_parent, listening_url
from agent_reach.sdk.client import ReachClient, SyncReachClient
from agent_reach.settings import SERVE_ENV, redacted

__all__ = [
    "A2A_AGENTS",
    "AGENTS",
    "DEFAULT_NATS",
    "DICTIONARY",
    "NATS_AGENTS",
    "NATS_ENV",
    "SERVE_ENV",
    "Stack",
    "StackError",
    "a2a_unavailable",
    "nats_unavailable",
    "start",
]

# endpoint id -> module run with ``python -m``: the agents serving over HTTP
AGENTS = {
    "agent://weather-cn-01": "agent_reach.demo.weather",
    "agent://note-01": "agent_reach.demo.note",
    "agent://scheduler-01": "agent_reach.demo.scheduler",
}
# ... and those serving over NATS, when the demo has a NATS server
NATS_AGENTS = {"agent://air-nats-01": "agent_reach.demo.air"}
# ... and those built with the a2a-sdk's server, registered by their Agent Card
A2A_AGENTS = {"agent://travel-a2a-01": "agent_reach.demo.travel"}
# what the A2A agents import (module -> its distribution): the a2a-sdk (the `a2a` extra, which
# the gateway's card parser needs too), its server extra (`a2a-sdk[http-server]`), uvicorn
_A2A_SERVER = {
    "a2a": "a2a-sdk",
    "starlette": "starlette",
    "sse_starlette": "sse-starlette",
    "uvicorn": "uvicorn",
}
DEFAULT_NATS = "nats://127.0.0.1:4222"
NATS_ENV = "AGENT_REACH_NATS"  # the NATS servers, for the demo as for `agent-reach serve`
DICTIONARY = "intents.toml"  # the demo's intent dictionary, a resource of this package
# words that every matcher of a gateway with the demo's dictionary scores once its index is in
# force (the lexical one too: they are the words of the tag weather.query)
_READY_PROBE = "weather query"


class StackError(Exception):
    """The stack could not be started (port taken, a process exited, no registration)."""


class Stack:
    """The running processes: the gateway first, then the agents."""

    def __init__(self, log_dir: Path, nats: str | None = None) -> None:
        self.log_dir = log_dir
        self.url = ""
        self.nats = nats  # the NATS servers the gateway and the NATS agents use, if any
        self.agents: dict[str, str] = {}  # endpoint id -> module, of every agent started
        self.cards: dict[str, str] = {}  # endpoint id -> Agent Card URL, of the A2A agents
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.intents = ""  # the dictionary file the gateway runs with (--intents)
        self.matcher = ""  # the fallback matcher the gateway runs: semantic, lexical or none
        self.matcher_note = ""  # ... and what its start line says of it
        self._files = contextlib.ExitStack()  # keeps the dictionary's file while the stack runs

    def on_nats(self) -> list[str]:
        """The endpoint ids of the agents started to serve over NATS."""
        return [eid for eid in self.agents if eid in NATS_AGENTS]

    def on_a2a(self) -> list[str]:
        """The endpoint ids of the A2A agents started (registered by their card)."""
        return list(self.cards)

    def spawn(
        self, name: str, args: Sequence[str], env: Mapping[str, str | None] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``python args...`` with stderr (its JSON logs) in ``log_dir/NAME.log``;
        ``env``: variables set (or, given None, taken out) on top of this process's own."""
        log_file = (self.log_dir / f"{name}.log").open("ab")
        env = _environment({**(env or {}), "PYTHONUNBUFFERED": "1"})
        try:
            # a session of its own: Ctrl-C reaches the demo only, which stops the agents
            # before the gateway (so that they can deregister)
            proc = subprocess.Popen(
                [sys.executable, *args],
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            log_file.close()
        self.procs[name] = proc
        return proc

    def exited(self) -> str | None:
        """The name of a process that has exited, if any."""
        return next((n for n, p in self.procs.items() if p.poll() is not None), None)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the agents and wait (they deregister from the gateway), then the gateway;
        kill what does not stop within ``timeout``."""
        procs = list(self.procs.values())
        deadline = time.monotonic() + timeout
        for group in (procs[1:], procs[:1]):  # the gateway was started first
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for proc in procs:
            if proc.stdout is not None:
                proc.stdout.close()
        self._files.close()

    def use_dictionary(self) -> str:
        """The path of the shipped dictionary (:data:`DICTIONARY`), now :attr:`intents`: the
        file itself from an unpacked install, else a copy that lives until :meth:`stop`."""
        resource = importlib.resources.files("agent_reach.demo") / DICTIONARY
        self.intents = str(self._files.enter_context(importlib.resources.as_file(resource)))
        return self.intents

    def read_matcher(self) -> None:
        """Fill :attr:`matcher` and :attr:`matcher_note` from the gateway's ``intent.matcher``
        log line (written before it listens)."""
        for line in (self.log_dir / "gateway.log").read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and entry.get("event") == "intent.matcher":
                self.matcher = str(entry.get("matcher", ""))
                self.matcher_note = str(entry.get("note", ""))


def _environment(changes: Mapping[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def nats_unavailable(servers: str, timeout_s: float = 1.0) -> str | None:
    """Why the demo cannot put agents on the NATS system ``servers`` (comma-separated
    ``nats://HOST:PORT``), or None when it can: nats-py is installed (the gateway's ``--nats``
    needs it) and one of the servers answers as a nats-server does, with its ``INFO`` line.

    Bounded: at most ``timeout_s`` per server (the connect and the first bytes together).
    """
    if importlib.util.find_spec("nats") is None:
        return "nats-py is not installed (pip install 'agent-reach-gateway[nats]')"
    urls = [part.strip() for part in servers.split(",") if part.strip()]
    if not urls:
        return "no NATS server given"
    reasons = [_probe(url, timeout_s) for url in urls]
    return None if None in reasons else reasons[0]


def a2a_unavailable() -> str | None:
    """Why the demo cannot run its A2A agents (a plain install lacks the a2a-sdk's server), or
    None when it can. Looked up, not imported: the a2a-sdk takes ~0.4 s to load."""
    missing = [
        dist for module, dist in _A2A_SERVER.items() if importlib.util.find_spec(module) is None
    ]
    if not missing:
        return None
    return (
        f"the a2a-sdk's server is not installed (missing {', '.join(missing)};"
        " pip install 'agent-reach-gateway[a2a]' 'a2a-sdk[http-server]' uvicorn)"
    )


def _probe(url: str, timeout_s: float) -> str | None:
    shown = redacted(url)
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 4222
    except ValueError:  # a port that is not a number, a broken [IPv6] address
        host, port = None, 0
    if not host or not url.startswith(("nats://", "tls://")):
        return f"{shown!r} is not a nats://HOST:PORT address"
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            first = b""
            while len(first) < 4:  # a nats-server speaks first: "INFO {...}"
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(4 - len(first))
                if not chunk:
                    break
                first += chunk
    except TimeoutError:
        return f"no nats-server answered on {shown} within {timeout_s:g} s"
    except OSError as exc:
        return f"no nats-server answers on {shown} ({exc.strerror or exc})"
    if first != b"INFO":
        return f"{shown} answered, but not as a nats-server"
    return None


def start(
    log_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    serve_args: Sequence[str] = (),
    timeout: float = 20.0,
    nats: str | None = None,
    a2a: bool = False,
) -> Stack:
    """Start the gateway, then every demo agent; return once all of them are registered.

    ``nats``: NATS servers to run the gateway with (``--nats``) and to serve the agents of
    :data:`NATS_AGENTS` over; None: no NATS, only the HTTP agents. ``a2a``: also start the
    agents of :data:`A2A_AGENTS` and register them by their card.
    """
    stack = Stack(log_dir, nats)
    deadline = time.monotonic() + timeout
    args = ["-m", "agent_reach", "serve", "--host", host, "--port", str(port)]
    args += ["--nats", nats] if nats else []
    try:
        if "--intents" not in serve_args:
            args += ["--intents", stack.use_dictionary()]
        gw = stack.spawn(
            "gateway",
            [*args, *serve_args],
            # `serve` reads $AGENT_REACH_NATS too: NATS only when the demo chose it
            env={NATS_ENV: None},
        )
        # the A2A agents need no gateway to start: started now, they load the a2a-sdk (~0.6 s)
        # while the gateway starts (after it: the stack stops the first process last)
        a2a_procs = {
            eid: stack.spawn(eid.removeprefix("agent://"), ["-m", module, "--port", "0"])
            for eid, module in (A2A_AGENTS.items() if a2a else ())
        }
        url = listening_url(gw, deadline)
        if url is None:
            raise StackError(
                f"the gateway did not start on {host}:{port} (see {log_dir}/gateway.log;"
                + (" is the port taken? does NATS answer?)" if nats else " is the port taken?)")
            )
        stack.url = url
        stack.read_matcher()
        agents: list[tuple[str, str, str | None]] = [(e, m, None) for e, m in AGENTS.items()]
        if nats:
            agents += [(eid, module, nats) for eid, module in NATS_AGENTS.items()]
        for endpoint_id, module, serve in agents:
            name = endpoint_id.removeprefix("agent://")
            stack.agents[endpoint_id] = module
            stack.spawn(
                name,
                ["-m", module, "--gateway", stack.url, "--id", endpoint_id],
                env={SERVE_ENV: serve},
            )
        for endpoint_id, proc in a2a_procs.items():
            stack.agents[endpoint_id] = A2A_AGENTS[endpoint_id]
            card_url = listening_url(proc, deadline)  # its line: "... listening on CARD_URL"
            if card_url is None:
                name = endpoint_id.removeprefix("agent://")
                raise StackError(f"{endpoint_id} did not start (see {log_dir}/{name}.log)")
            stack.cards[endpoint_id] = card_url
        if stack.cards:
            _register_cards(stack, deadline)
        _wait_registered(stack, deadline)
        if stack.matcher not in ("", "none"):
            _wait_matcher(stack, deadline)
    except BaseException:
        stack.stop()
        raise
    return stack


def _register_cards(stack: Stack, deadline: float) -> None:
    """Register each A2A agent by its card: the gateway fetches and maps it before it answers,
    so an agent is registered (or refused, a StackError) once its call returns."""

    async def register() -> None:
        timeout_s = max(0.5, deadline - time.monotonic())
        async with ReachClient(stack.url, timeout_s=timeout_s) as client:
            for endpoint_id, card_url in stack.cards.items():
                await client.register_card(endpoint_id, card_url)

    try:
        # the blocking facade has no register_card: the async client, on a loop of its own
        asyncio.run(register())
    except AgentReachError as exc:
        raise StackError(
            f"the gateway did not register the A2A agents by their cards: {exc}"
            f" (see {stack.log_dir}/gateway.log)"
        ) from exc


def _wait_registered(stack: Stack, deadline: float) -> None:
    with SyncReachClient(stack.url, timeout_s=2.0) as client:
        while True:
            gone = stack.exited()
            if gone is not None:
                raise StackError(f"{gone} exited (see {stack.log_dir}/{gone}.log)")
            try:
                listed = {a.endpoint_id for a in client.agents()}
            except GatewayUnavailable:
                listed = set()
            if listed >= set(stack.agents):
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(set(stack.agents) - listed))
                raise StackError(f"not registered in time: {missing} (logs in {stack.log_dir})")
            time.sleep(0.05)


def _wait_matcher(stack: Stack, deadline: float) -> None:
    """Until the gateway's matcher scores words (a dry run of :data:`_READY_PROBE` is matched,
    or refused with suggestions): before its first index is in force, it has none to give."""
    with SyncReachClient(stack.url, timeout_s=2.0) as client:
        while True:
            try:
                client.explain(None, intent_text=_READY_PROBE)
                return
            except NoCapableAgent as exc:
                if exc.fields.get("suggestions"):
                    return
            except GatewayUnavailable:
                pass
            gone = stack.exited()
            if gone is not None:
                raise StackError(f"{gone} exited (see {stack.log_dir}/{gone}.log)")
            if time.monotonic() > deadline:
                raise StackError(
                    f"the gateway's {stack.matcher} matcher did not answer in time"
                    f" (see {stack.log_dir}/gateway.log)"
                )
            time.sleep(0.05)
