"""``agent-reach serve --workers N``: N gateway processes on one port, over a shared registry.

The supervisor (this process) reserves the port with ``SO_REUSEPORT`` (so ``--port 0`` works
too), starts N ordinary ``serve`` processes that bind the same port with ``SO_REUSEPORT`` (the
kernel spreads connections across them), prints one line when all of them listen, restarts a
worker that dies (at most one restart a second), and passes SIGINT/SIGTERM (and SIGHUP: reload
the dictionary) on to all of them.
Each worker is a whole gateway with its own local view of the shared registry; nothing else is
shared between them. The gateway's bounds of work in delivery (``--max-inflight``,
``--max-inflight-per-endpoint``) are the gateway's, not each process's: every worker gets its
share, the bound divided by N rounded up (at least 1), so that N workers together open at most
about what one gateway would (CONTRACT.md v1.1: "across the gateway").
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from agent_reach.gateway.children import die_with_parent, listening_url
from agent_reach.settings import GatewaySettings, redacted

__all__ = ["supervise"]

START_TIMEOUT_S = 30.0


def _reserve(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))  # bound, never listening: it only holds the port number
    return sock


# the flags the supervisor sets for each worker itself (their own values dropped)
_SET = ("--workers", "--port", "--max-inflight", "--max-inflight-per-endpoint")


def share(bound: int, workers: int) -> int:
    """One worker's part of a gateway-wide ``bound`` shared by ``workers``: rounded up, >= 1."""
    return max(1, math.ceil(bound / workers))


def _worker_argv(argv: Sequence[str], port: int, settings: GatewaySettings) -> list[str]:
    """The supervisor's own ``serve`` arguments, with one worker on the reserved port and its
    share of the gateway's bounds."""
    args = list(argv[1:])
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in _SET:
            skip = i + 1 < len(args)
            continue
        if arg.startswith(tuple(f"{flag}=" for flag in _SET)):
            continue
        out.append(arg)
    n = settings.workers
    return [
        sys.executable,
        "-m",
        "agent_reach",
        *out,
        "--workers",
        "1",
        "--port",
        str(port),
        "--reuse-port",
        "--max-inflight",
        str(share(settings.max_inflight, n)),
        "--max-inflight-per-endpoint",
        str(share(settings.max_inflight_per_endpoint, n)),
    ]


def _drain(stdout: IO[bytes]) -> None:
    """Keep reading a worker's stdout so that it never blocks on a full pipe."""
    for _ in iter(stdout.readline, b""):
        pass


def supervise(settings: GatewaySettings, argv: Sequence[str]) -> int:
    """Run ``settings.workers`` gateway processes until SIGINT/SIGTERM; the exit code."""
    env = {**os.environ, "AGENT_REACH_WORKERS": "1"}
    try:
        holder = _reserve(settings.host, settings.port)
    except OSError as exc:
        print(
            f"Error: cannot reserve {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        return 1
    port = holder.getsockname()[1]
    cmd = _worker_argv(argv, port, settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workers: list[subprocess.Popen[bytes]] = []

    def reload_all(*_: object) -> None:  # SIGHUP: each worker re-reads its files itself
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGHUP)

    signal.signal(signal.SIGHUP, reload_all)

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, preexec_fn=die_with_parent)

    workers.extend(spawn() for _ in range(settings.workers))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        urls = [listening_url(w, deadline, stop) for w in workers]
        if stop.is_set():  # SIGINT/SIGTERM while starting: stop them all, as asked
            return 0
        if None in urls:
            print("Error: not every worker started (see the log lines above)", file=sys.stderr)
            return 1
        for w in workers:
            assert w.stdout is not None
            threading.Thread(target=_drain, args=(w.stdout,), daemon=True).start()
        print(
            f"agent-reach gateway listening on {urls[0]} (registry {redacted(settings.registry)},"
            f" {settings.workers} workers, pids {' '.join(str(w.pid) for w in workers)})",
            flush=True,
        )
        last_restart = 0.0
        while not stop.wait(0.2):
            for i, w in enumerate(workers):
                if w.poll() is None or time.monotonic() - last_restart < 1.0:
                    continue
                print(
                    f"agent-reach worker {w.pid} exited with {w.returncode}; starting another",
                    file=sys.stderr,
                    flush=True,
                )
                last_restart = time.monotonic()
                old, workers[i] = w.pid, spawn()
                deadline = time.monotonic() + START_TIMEOUT_S
                if listening_url(workers[i], deadline, stop) is not None:
                    threading.Thread(target=_drain, args=(workers[i].stdout,), daemon=True).start()
                    print(
                        f"agent-reach worker {workers[i].pid} listening (replaces {old})",
                        file=sys.stderr,
                        flush=True,
                    )
                elif workers[i].poll() is None and not stop.is_set():
                    workers[i].kill()  # alive but never listening: replaced on a later round
        return 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        holder.close()
