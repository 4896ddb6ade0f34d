"""NATS test helpers, in one place: private nats-server processes, callers of the gateway's API
over NATS (``PREFIX.v1.*``), requests written in the NATS protocol itself, a stand-in responder
in the test's own process, the bus_echo agent process, and random subjects and prefixes.

What holds (built on tests/support.py, whose gateway and agent starters, ``free_port``,
``wait_until`` and ``until`` these use):
- A private server (:class:`PrivateNats`) listens on 127.0.0.1 on a free port, with a config
  file and a log of its own; started again after a stop it is the same server to its clients
  (same port, same file). :func:`private_server` removes it, files and all, afterwards.
- Every wait has a bound: a server that does not speak, a responder whose subscription is not
  live, a bus_echo that does not print its ``serving`` line within it fails the test.
- An answer's status is its ``Reach-Status`` header, 200 when absent (the contract's rule);
  a body that is not JSON is kept as its bytes, for the test to judge.
- :func:`unique` and :func:`new_prefix` are fresh on every call, so that tests sharing the
  nats-server at ``AGENT_REACH_TEST_NATS`` (default 127.0.0.1:4222) do not see each other.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.support import NATS_SERVER, ROOT, NatsServer, wait_until

NATS_URL = os.environ.get("AGENT_REACH_TEST_NATS", "nats://127.0.0.1:4222")
BUS_ECHO = ROOT / "tests" / "agents" / "bus_echo.py"
T = TypeVar("T")


def unique(name: str) -> str:
    """A fresh NATS subject ending in ``name``."""
    return f"reach-test.{secrets.token_hex(6)}.{name}"


def new_prefix() -> str:
    """A fresh ``--nats-prefix`` (the gateway's API subjects under it are the test's own)."""
    return f"reach-api-{secrets.token_hex(5)}"


# --- a private nats-server ---------------------------------------------------------------------


@dataclass
class PrivateNats(NatsServer):
    """A :class:`tests.support.NatsServer` with a config file (``config`` added to its
    ``listen`` line) and a log: stopped with any signal, paused, reloaded and started again at
    will."""

    config: str = ""
    conf: Path = field(init=False)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.conf = Path(tempfile.mkstemp(prefix="reach-nats-", suffix=".conf")[1])
        self.log = self.conf.with_suffix(".log")
        self.configure(self.config)

    def configure(self, config: str) -> None:
        """Write its config file anew (read at the next start, or :meth:`reload`)."""
        self.conf.write_text(f'listen: "127.0.0.1:{self.port}"\n{config}\n')

    def start(self, timeout: float = 10.0) -> None:
        """Start it; return once it speaks (its INFO line)."""
        assert self.popen is None, "already running"
        with self.log.open("ab") as log:
            popen = subprocess.Popen(
                [NATS_SERVER, "-c", str(self.conf)], stdout=log, stderr=subprocess.STDOUT
            )
        self.popen = popen

        def up() -> bool:
            if self.answers():
                return True
            assert popen.poll() is None, f"nats-server exited: {self.log_tail()}"
            return False

        try:
            wait_until(up, timeout)
        except AssertionError as exc:
            raise AssertionError(f"nats-server did not start: {self.log_tail()}") from exc

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stop it (SIGKILL: at once, nothing said to its clients; SIGTERM: it closes them)."""
        popen, self.popen = self.popen, None
        if popen is not None:
            if popen.poll() is None:
                popen.send_signal(sig)
            popen.wait(10)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """:meth:`stop` with ``sig``, then :meth:`start`: every client connection drops."""
        self.stop(sig)
        self.start()

    def signal(self, sig: int) -> None:
        """Send it ``sig`` (SIGSTOP pauses it without a word to its clients, SIGCONT resumes)."""
        assert self.popen is not None
        self.popen.send_signal(sig)

    def reload(self) -> None:
        """Make it read its config file again (SIGHUP)."""
        self.signal(signal.SIGHUP)

    def reloaded(self, times: int) -> bool:
        """Whether its log says it reloaded its configuration ``times`` times or more."""
        return self.log.read_text(errors="replace").count("Reloaded server configuration") >= times

    def remove(self) -> None:
        """Stop it (resumed first, were it paused) and delete its files."""
        if self.popen is not None and self.popen.poll() is None:
            self.signal(signal.SIGCONT)
        self.stop()
        self.conf.unlink(missing_ok=True)
        self.log.unlink(missing_ok=True)


@contextmanager
def private_server(config: str = "") -> Iterator[PrivateNats]:
    """A :class:`PrivateNats`, started, and removed afterwards."""
    server = PrivateNats(config=config)
    try:
        server.start()
        yield server
    finally:
        server.remove()


# --- callers of the API over NATS ----------------------------------------------------------------


@dataclass
class Answer:
    """A reply of the gateway's NATS API: the status (``Reach-Status``, 200 when absent), the
    parsed JSON body (the raw bytes when it is not JSON), the headers."""

    status: int
    body: Any
    headers: dict[str, str]


def answer_of(data: bytes, headers: dict[str, str]) -> Answer:
    """The :class:`Answer` a reply's body and headers make."""
    try:
        parsed: Any = json.loads(data)
    except ValueError:
        parsed = data
    return Answer(int(headers.get("Reach-Status", "200")), parsed, headers)


async def ask(
    nc: Client,
    subject: str,
    body: Any,
    headers: dict[str, str] | None = None,
    wait_s: float = 10.0,
) -> Answer:
    """A nats-py request of ``body`` (bytes as they are, anything else as JSON) to ``subject``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await nc.request(subject, data, timeout=wait_s, headers=headers)
    return answer_of(msg.data, dict(msg.headers or {}))


def check_reach_status(answer: Answer) -> None:
    """The wire rule: ``Reach-Status`` present exactly when the status is not 200, and
    ``Retry-After`` exactly beside a 429."""
    raw = answer.headers.get("Reach-Status")
    assert raw != "200", answer.headers  # a 200 is said by its absence
    assert (raw is None) == (answer.status == 200), answer
    assert ("Retry-After" in answer.headers) == (answer.status == 429), answer.headers


class Bus:
    """One nats-py connection (one reply inbox) on an event loop of its own, for sync tests."""

    def __init__(self, server: str = NATS_URL, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        options = {"connect_timeout": 2, "max_reconnect_attempts": -1, **options}
        self.nc: Client = self.run(nats.connect(server, **options))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run ``coro`` on this connection's loop; its result within ``timeout``."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def request(
        self,
        subject: str,
        body: Any,
        headers: dict[str, str] | None = None,
        wait_s: float = 10.0,
    ) -> Answer:
        """:func:`ask` on this connection, from a sync test (in a coroutine given to
        :meth:`run`, ``ask(bus.nc, ...)``)."""
        return self.run(ask(self.nc, subject, body, headers, wait_s), wait_s + 5)

    def close(self) -> None:
        try:
            self.run(self.nc.close(), 10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


# --- the NATS protocol itself, beneath what nats-py lets a client write ------------------------


def raw_connection(server: str) -> tuple[socket.socket, io.BufferedReader]:
    """A socket speaking the NATS protocol itself, past CONNECT; and its reader."""
    parts = urlsplit(server)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    reader = sock.makefile("rb")
    assert reader.readline().startswith(b"INFO ")
    connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True}
    sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")
    return sock, reader


def hpub(subject: str, reply: bytes, header_block: bytes, body: bytes) -> bytes:
    """An HPUB command (``reply`` empty: none)."""
    size = len(header_block) + len(body)
    to = b" " + reply if reply else b""
    line = b"HPUB %s%s %d %d\r\n" % (subject.encode(), to, len(header_block), size)
    return line + header_block + body + b"\r\n"


def raw_request(server: str, subject: str, header_block: bytes, body: bytes) -> Answer | None:
    """A request written in the NATS protocol itself (HPUB), so that the header block can be
    any bytes, beneath what nats-py lets a caller write; None when the server refuses it."""
    inbox = f"_INBOX.raw{secrets.token_hex(6)}"
    sock, reader = raw_connection(server)
    with sock, reader:
        sock.sendall(f"SUB {inbox} 1\r\n".encode())
        sock.sendall(hpub(subject, inbox.encode(), header_block, body) + b"PING\r\n")
        while True:
            line = reader.readline()
            if not line or line.startswith(b"-ERR"):
                return None
            if line.startswith(b"PING"):
                sock.sendall(b"PONG\r\n")
            if line.startswith((b"MSG ", b"HMSG ")):
                break
        fields = line.split()
        headers: dict[str, str] = {}
        total = int(fields[-1])
        payload = reader.read(total + 2)[:total]
        if line.startswith(b"HMSG "):
            head_len = int(fields[-2])
            for row in payload[:head_len].split(b"\r\n")[1:]:
                name, sep, value = row.partition(b":")
                if sep:
                    headers[name.strip().decode()] = value.strip().decode()
            payload = payload[head_len:]
    return Answer(int(headers.get("Reach-Status", "200")), json.loads(payload), headers)


# --- a stand-in responder, in the test's own process ------------------------------------------

Reply = tuple[bytes, dict[str, str] | None]
_PROBE = "Reach-Test-Probe"


@asynccontextmanager
async def responder(
    server: str,
    subject: str,
    answer: Callable[[Msg], Awaitable[Reply]],
    reconnected: asyncio.Event | None = None,
) -> AsyncIterator[list[Msg]]:
    """A nats-py responder on ``subject``: each request in a task of its own, answered with
    ``answer(msg)`` (body and headers) by a publish to its reply subject; reconnecting forever,
    quickly, and setting ``reconnected`` once its subscription is back. Entered once it is
    served (nats-py's ``flush()`` may overtake the SUB it buffers: a probe request to itself
    is answered first); yields the requests it received, in order (the probe left out)."""

    async def on_reconnected() -> None:
        if reconnected is not None:
            reconnected.set()

    nc = await nats.connect(
        server,
        connect_timeout=2,
        reconnect_time_wait=0.1,  # seconds, used as a float
        max_reconnect_attempts=-1,
        reconnected_cb=on_reconnected,
    )
    running: set[asyncio.Task[None]] = set()
    received: list[Msg] = []

    async def reply(msg: Msg) -> None:
        data, headers = (b"{}", None) if _PROBE in (msg.headers or {}) else await answer(msg)
        await nc.publish(msg.reply, data, headers=headers)

    async def handle(msg: Msg) -> None:
        if _PROBE not in (msg.headers or {}):
            received.append(msg)
        task = asyncio.create_task(reply(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    try:
        await nc.subscribe(subject, cb=handle)
        await nc.request(subject, b"{}", timeout=5, headers={_PROBE: "1"})
        yield received
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await nc.close()


# --- the bus_echo agent process (tests/agents/bus_echo.py) --------------------------------------


class BusEcho:
    """A running bus_echo process: ``subject``, ``pid``, :meth:`stop` (its final counts)."""

    def __init__(self, popen: subprocess.Popen[bytes], subject: str, log: Path) -> None:
        self.popen = popen
        self.subject = subject
        self.log = log
        self.pid = popen.pid
        self._buf = b""
        self._stopped: dict[str, Any] | None = None

    def _read(self) -> None:
        assert self.popen.stdout is not None
        chunk = self.popen.stdout.read()
        if chunk:
            self._buf += chunk

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines it printed so far (a line still being written is left out)."""
        self._read()
        out = []
        for line in self._buf.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def kill(self) -> None:
        """SIGKILL: gone at once, nothing said, its subscription dropped by the server."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self._finish()

    def stop(self, timeout: float = 10.0) -> dict[str, Any]:
        """SIGTERM, then its ``stopped`` line (empty when it was killed); idempotent."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.popen.poll() is None and time.monotonic() < deadline:
                self._read()  # a full pipe would hold it up
                time.sleep(0.01)
            if self.popen.poll() is None:
                self.popen.kill()
                self.popen.wait(timeout)
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        if self._stopped is None:
            stopped = [line for line in self.lines() if line.get("event") == "stopped"]
            assert self.popen.stdout is not None
            self.popen.stdout.close()
            self._stopped = stopped[-1] if stopped else {}
        return self._stopped


def start_bus_echo(server: str, subject: str, *flags: str, timeout: float = 15.0) -> BusEcho:
    """Run bus_echo on ``server`` and ``subject`` with ``flags``; return once it serves."""
    log = Path(tempfile.mkstemp(prefix="bus-echo-", suffix=".log")[1])
    cmd = [sys.executable, str(BUS_ECHO), "--server", server, "--subject", subject, *flags]
    with log.open("wb") as err:
        popen = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert popen.stdout is not None
    os.set_blocking(popen.stdout.fileno(), False)
    agent = BusEcho(popen, subject, log)

    def serving() -> bool:
        if any(line.get("event") == "serving" for line in agent.lines()):
            return True
        assert popen.poll() is None, "it exited"
        return False

    try:
        wait_until(serving, timeout)
    except AssertionError as exc:
        agent.kill()
        raise RuntimeError(
            f"bus_echo did not start ({exc}): {agent._buf!r} {log.read_text()[-2000:]}"
        ) from exc
    return agent
