"""Child processes that do not outlive their parent (the demo's stack, --workers)."""

from __future__ import annotations

import contextlib
import signal
import sys

__all__ = ["die_with_parent"]


def die_with_parent() -> None:
    """``preexec_fn`` of a child: on Linux, SIGTERM it when the parent dies (even by SIGKILL),
    so that a killed supervisor leaves no process holding its port."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
