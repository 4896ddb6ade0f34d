"""Test helpers: real gateway and agent processes on 127.0.0.1, waited on with bounds.

Two switches run the same tests over other backends (the Makefile's ``test-e2e-redis`` and
``test-e2e-nats``): ``AGENT_REACH_TEST_REGISTRY`` puts every gateway on a shared registry, and
``AGENT_REACH_TEST_SERVE`` (e.g. ``nats://127.0.0.1:4222``) puts the agents on NATS: every
gateway then runs with ``--nats`` (and a ``--nats-prefix`` of its own), and every agent process
started here (:func:`start_agent`, :func:`start_sdk_agent`) gets ``AGENT_REACH_SERVE``, so that
it serves its deliveries over NATS (it still registers and heartbeats over HTTP).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib import error, request

import pytest
from aiohttp import web

from agent_reach.auth.keys import KeyRing, generate_key
from agent_reach.auth.tokens import Kind, TokenService

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("AGENT_REACH_TEST_REDIS", "redis://127.0.0.1:6379/0")
BEHAVE = ROOT / "tests" / "agents" / "behave.py"
# the NATS switch: the servers the agents serve over (None: over HTTP, as by default)
TEST_SERVE = os.environ.get("AGENT_REACH_TEST_SERVE", "").strip() or None
NATS_SERVER = os.environ.get("AGENT_REACH_TEST_NATS_SERVER", "/usr/sbin/nats-server")
# what a process prints once it serves: a gateway's or an HTTP agent's URL, or where an agent
# on NATS listens ("agent://x serving [...] at nats:agents.x")
_URL = re.compile(rb"(http://127\.0\.0\.1:\d+\S*)| at (nats:\S+)")


@dataclass
class Proc:
    """A child process with the URL it printed and its stderr in a file."""

    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (whole lines only: the process may be in the
        middle of writing the last one, which the next read gets)."""
        out = []
        text = self.log_path.read_text(errors="replace")
        # split on "\n" alone: a JSON string may hold U+2028, U+0085 unescaped (a fuzzed value
        # logged as given), which str.splitlines() would take for line ends
        for line in text[: text.rfind("\n") + 1].split("\n"):
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode


def _start(
    cmd: list[str],
    timeout: float = 15.0,
    env: dict[str, str] | None = None,
    pattern: re.Pattern[bytes] = _URL,
) -> Proc:
    # ``pattern``: what the printed URL looks like (group 1, else 2); tests/netns_support.py
    # passes one for addresses other than 127.0.0.1
    log = Path(tempfile.mkstemp(prefix="agent-reach-", suffix=".log")[1])
    env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as err:
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
    assert popen.stdout is not None
    os.set_blocking(popen.stdout.fileno(), False)
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = popen.stdout.read()
        if chunk:
            buf += chunk
            match = pattern.search(buf)
            if match and b"\n" in buf[match.end() :]:  # the whole line
                return Proc(popen, (match.group(1) or match.group(2)).decode(), log)
        if popen.poll() is not None:
            break
        time.sleep(0.02)
    popen.kill()
    popen.wait()
    popen.stdout.close()
    raise RuntimeError(f"{cmd} did not start: {buf!r} {log.read_text()[-2000:]}")


@contextmanager
def gateway(*flags: str) -> Iterator[Proc]:
    """A real `agent-reach serve` process on a free port.

    With ``AGENT_REACH_TEST_REGISTRY`` set (e.g. ``redis://127.0.0.1:6379/0``, as
    ``make test-e2e-redis`` does), a gateway not given ``--registry`` runs on that registry
    under a key prefix of its own, dropped afterwards. With ``AGENT_REACH_TEST_SERVE`` set
    (``make test-e2e-nats``), a gateway not given ``--nats`` runs with ``--nats`` on those
    servers, under a ``--nats-prefix`` of its own.
    """
    port = [] if "--port" in flags else ["--port", "0"]
    shared = os.environ.get("AGENT_REACH_TEST_REGISTRY")
    prefix = f"test-{os.urandom(6).hex()}"
    registry = (
        ["--registry", shared, "--registry-prefix", prefix]
        if shared and "--registry" not in flags
        else []
    )
    nats = ["--nats", TEST_SERVE, "--nats-prefix", prefix] if TEST_SERVE else []
    if "--nats" in flags:
        nats = []
    cmd = [sys.executable, "-m", "agent_reach", "serve", *port, *registry, *nats, *flags]
    proc = _start(cmd)
    try:
        yield proc
    finally:
        proc.stop()
        if registry:
            drop_prefix(prefix, shared or REDIS_URL)


def start_agent(
    gw: str,
    endpoint_id: str,
    mode: str = "ok",
    *,
    intents: str = "test.echo",
    delay_ms: float = 0.0,
    token: str | None = None,
) -> Proc:
    """A real agent process (tests/agents/behave.py), registered when this returns; with
    ``token`` (its enrollment token, as AGENT_REACH_TOKEN), it verifies deliveries. Over NATS
    under the switch (:func:`start_sdk_agent`)."""
    return start_sdk_agent(
        [
            sys.executable,
            str(BEHAVE),
            "--gateway",
            gw,
            "--id",
            endpoint_id,
            "--mode",
            mode,
            "--intents",
            intents,
            "--delay-ms",
            str(delay_ms),
        ],
        env={"AGENT_REACH_TOKEN": token} if token else None,
    )


def start_sdk_agent(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 15.0
) -> Proc:
    """An agent process built on the SDK (a demo agent, an example), started with
    :func:`_start`; under the NATS switch with ``AGENT_REACH_SERVE`` set, so that it serves
    over NATS (unless ``env`` says otherwise)."""
    serve = {"AGENT_REACH_SERVE": TEST_SERVE} if TEST_SERVE else {}
    env = {**serve, **(env or {})}
    proc = _start(cmd, timeout, env=env)
    if env.get("AGENT_REACH_SERVE"):  # the switch took: it serves on a subject, no port
        assert proc.url.startswith("nats:"), (cmd, proc.url)
    return proc


# a test without agent processes: under the NATS switch only its gateway's flags would change,
# and nothing it checks travels over NATS (skipped there: it ran in the plain pass)
no_agents = pytest.mark.skipif(
    TEST_SERVE is not None,
    reason="no agent process: nothing this test checks travels over NATS",
)
# a test that starts its processes itself, not through these helpers (the demo, a docs page's
# shell script): neither switch reaches them, so a switched pass would only run it again
own_processes = pytest.mark.skipif(
    TEST_SERVE is not None or bool(os.environ.get("AGENT_REACH_TEST_REGISTRY")),
    reason="starts its own processes, which no switch reaches: it ran in the plain pass",
)


def free_port() -> int:
    """A port nothing listens on now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    """A nats-server of the test's own on a free port (no JetStream, nothing kept)."""

    port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def answers(self) -> bool:
        """Whether it answers as a nats-server does (its INFO line), within a short bound."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.settimeout(0.5)
                return s.recv(4) == b"INFO"
        except OSError:
            return False

    def start(self, timeout: float = 10.0) -> None:
        binary = NATS_SERVER if os.access(NATS_SERVER, os.X_OK) else shutil.which("nats-server")
        if binary is None:
            pytest.skip(f"no nats-server ({NATS_SERVER}; apt-get install -y nats-server)")
        cmd = [binary, "-a", "127.0.0.1", "-p", str(self.port)]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nats-server did not start on {self.port}")
            time.sleep(0.02)  # polling interval, not a settle delay

    def stop(self) -> None:
        """SIGKILL: every client connection drops at once."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        self.popen = None


@contextmanager
def private_nats() -> Iterator[NatsServer]:
    """A :class:`NatsServer`, started, and stopped afterwards."""
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    timeout: float = 30.0,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One HTTP call; returns (status, parsed JSON or text). ``token``: a bearer token."""
    status, payload, _ = http_full(
        method, url, body, raw=raw, timeout=timeout, token=token, headers=headers
    )
    return status, payload


def http_full(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    timeout: float = 30.0,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """:func:`http`, with the answer's headers too."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    req = request.Request(url, data=data, method=method, headers=sent)
    try:
        with request.urlopen(req, timeout=timeout) as resp:
            status, payload, got = resp.status, resp.read(), dict(resp.headers)
    except error.HTTPError as exc:
        status, payload, got = exc.code, exc.read(), dict(exc.headers)
    try:
        return status, json.loads(payload), got
    except ValueError:
        return status, payload.decode(errors="replace"), got


def wait_until(predicate: Any, timeout: float, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


async def until(
    predicate: Callable[[], Any], bound: float, what: str = "", interval: float = 0.02
) -> Any:
    """:func:`wait_until` for async tests: poll ``predicate`` (a plain call, or one that returns
    an awaitable) without holding up the event loop until it gives a truthy value, and return
    that; fail after ``bound`` seconds, saying ``what`` was waited for."""
    deadline = time.monotonic() + bound
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound} s: {what}")
        await asyncio.sleep(interval)


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on 127.0.0.1 (a free port) for the block: its base URL. A stand-in for a
    gateway or an agent, written in the test; no access log."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


T = TypeVar("T")


async def turns_during(work: Awaitable[T]) -> tuple[T, int]:
    """``work``'s result and how often a task beside it got the event loop meanwhile (a work
    that never gives the loop back: 0 or 1)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    try:
        return await work, ticks - before
    finally:
        ticker.cancel()


def metric(gw: Proc, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in ``gw``'s /metrics whose labels include ``labels``."""
    status, text = http("GET", f"{gw.url}/metrics")
    assert status == 200
    total = 0.0
    for line in str(text).splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def health(gw: Proc) -> dict[str, Any]:
    """``gw``'s /healthz (which must answer 200)."""
    status, body = http("GET", f"{gw.url}/healthz")
    assert status == 200, body
    return dict(body)


def status_of(gw: str, endpoint_id: str) -> str:
    code, body = http("GET", f"{gw}/v1/agents/{endpoint_id.removeprefix('agent://')}")
    return body["status"] if code == 200 else f"http {code}"


def drop_prefix(prefix: str, url: str = REDIS_URL) -> None:
    """Delete every key of a registry prefix (a test's own); a sync client, so that sync and
    async tests call it alike."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def cli(*args: str, env: dict[str, str] | None = None) -> Run:
    """``agent-reach ARGS`` to completion, with no AGENT_REACH_* variable but ``env``'s."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AGENT_REACH_") or k.startswith("AGENT_REACH_TEST_")
    }
    result = subprocess.run(
        [sys.executable, "-m", "agent_reach", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env={**base, "COLUMNS": "300", **(env or {})},
        check=False,
    )
    return Run(result.returncode, result.stdout, result.stderr)


# --- token mode ------------------------------------------------------------------------------


def service_of(keys: Path, **options: Any) -> TokenService:
    """A token service over the key directory ``keys`` (signs as the gateway would)."""
    ring = KeyRing(keys)
    ring.load()
    return TokenService(ring, **options)


@dataclass
class Secured:
    """What a token-mode gateway is started with: a key directory, a policy file, an operator
    token, and the serve flags that name them."""

    keys: Path
    policy: Path
    operator: str
    flags: list[str]

    def token(self, kind: Kind, subject: str, **claims: Any) -> str:
        """A token signed offline with the gateway's key directory (as the CLI does)."""
        return service_of(self.keys).issue(kind, subject, 600, **claims)[0]


def secured_setup(root: Path, policy: str) -> Secured:
    """A new key directory and ``policy`` under ``root``, and an operator token."""
    keys = root / "keys"
    generate_key(keys)
    path = root / "policy.toml"
    path.write_text(policy)
    operator, _ = service_of(keys).issue(Kind.OPERATOR, "operator:test", 600)
    return Secured(
        keys, path, operator, ["--auth", "tokens", "--keys", str(keys), "--policy", str(path)]
    )


# --- MCP ---------------------------------------------------------------------------------------

# what an MCP host sends first (the 2025 protocol's handshake), and the Accept it sends with it
MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}
