"""Child gateway processes: started by the demo's stack and by ``serve --workers``."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["die_with_parent", "listening_url"]

_LISTENING = re.compile(rb"listening on (http://\S+)")


def die_with_parent() -> None:
    """``preexec_fn`` of a child: on Linux, SIGTERM it when the parent dies (even by SIGKILL),
    so that a killed supervisor leaves no process holding its port."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def listening_url(
    proc: subprocess.Popen[bytes], deadline: float, stop: threading.Event | None = None
) -> str | None:
    """The URL a gateway child prints once it listens; None when it exits, stays silent until
    ``deadline`` (monotonic), or ``stop`` is set meanwhile."""
    stdout = proc.stdout
    assert stdout is not None
    buf = b""
    while proc.poll() is None and not (stop is not None and stop.is_set()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        # a bounded wait: a child that never prints must not hold its parent forever
        # (raw reads, so that nothing waits unseen in a file object's buffer)
        ready, _, _ = select.select([stdout.fileno()], [], [], min(left, 0.2))
        if not ready:
            continue
        chunk = os.read(stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        match = _LISTENING.search(buf)
        if match:
            return match.group(1).decode()
    return None
