"""Start a gateway and the demo agents as child processes, and stop them again.

Used by ``agent-reach demo`` and ``make run``. Each process writes its JSON log lines to a file
of its own in ``log_dir``; the gateway's URL is read from the line it prints when it listens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agent_reach.errors import GatewayUnavailable
from agent_reach.gateway.children import die_with_parent, listening_url
from agent_reach.sdk.client import SyncReachClient

__all__ = ["AGENTS", "Stack", "StackError", "start"]

# endpoint id -> module run with ``python -m``
AGENTS = {
    "agent://weather-cn-01": "agent_reach.demo.weather",
    "agent://note-01": "agent_reach.demo.note",
    "agent://scheduler-01": "agent_reach.demo.scheduler",
}


class StackError(Exception):
    """The stack could not be started (port taken, a process exited, no registration)."""


class Stack:
    """The running processes: the gateway first, then the agents."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.url = ""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``python args...`` with stderr (its JSON logs) in ``log_dir/NAME.log``."""
        log_file = (self.log_dir / f"{name}.log").open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
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


def start(
    log_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    serve_args: Sequence[str] = (),
    timeout: float = 20.0,
) -> Stack:
    """Start the gateway, then every demo agent; return once all of them are registered."""
    stack = Stack(log_dir)
    deadline = time.monotonic() + timeout
    try:
        gw = stack.spawn(
            "gateway",
            ["-m", "agent_reach", "serve", "--host", host, "--port", str(port), *serve_args],
        )
        url = listening_url(gw, deadline)
        if url is None:
            raise StackError(
                f"the gateway did not start on {host}:{port} (see {log_dir}/gateway.log;"
                " is the port taken?)"
            )
        stack.url = url
        for endpoint_id, module in AGENTS.items():
            name = endpoint_id.removeprefix("agent://")
            stack.spawn(name, ["-m", module, "--gateway", stack.url, "--id", endpoint_id])
        _wait_registered(stack, deadline)
    except BaseException:
        stack.stop()
        raise
    return stack


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
            if listed >= set(AGENTS):
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(set(AGENTS) - listed))
                raise StackError(f"not registered in time: {missing} (logs in {stack.log_dir})")
            time.sleep(0.05)
