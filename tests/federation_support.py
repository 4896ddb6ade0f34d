"""Helpers of the federation tests: a directory process, gateways joined to it, waits on what
they learnt. Real processes only (tests/support.py starts them)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support import Proc, _start, http, wait_until

INTERVAL = 0.5  # --summary-interval of the tests' gateways: a summary is stale after 1.5 s


@contextmanager
def directory(*flags: str) -> Iterator[Proc]:
    """A real `agent-reach directory` process on a free port (memory store unless told)."""
    port = [] if "--port" in flags else ["--port", "0"]
    proc = _start([sys.executable, "-m", "agent_reach", "directory", *port, *flags])
    try:
        yield proc
    finally:
        proc.stop()


def domain_flags(domain: str, directory_url: str, *more: str) -> tuple[str, ...]:
    return (
        "--domain",
        domain,
        "--directory",
        directory_url,
        "--summary-interval",
        str(INTERVAL),
        "--matcher",
        "none",
        *more,
    )


def federation(gw: Proc | str, token: str | None = None) -> dict[str, Any]:
    url = gw if isinstance(gw, str) else gw.url
    code, answer = http("GET", f"{url}/v1/federation", token=token)
    assert code == 200, answer
    return answer  # type: ignore[no-any-return]


def offered(gw: Proc | str, domain: str, tag: str, token: str | None = None) -> bool:
    """Whether ``gw`` holds a fresh, reachable summary of ``domain`` offering ``tag``."""
    for peer in federation(gw, token)["peers"]:
        if peer["domain"] == domain and not peer["stale"] and peer["reachable"]:
            counts = peer["intents"].get(tag)
            return bool(counts and counts["healthy"] + counts["degraded"] > 0)
    return False


def wait_offered(
    gw: Proc | str, domain: str, tag: str, timeout: float = 10.0, token: str | None = None
) -> None:
    wait_until(lambda: offered(gw, domain, tag, token), timeout=timeout)


def send(gw: Proc | str, body: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    url = gw if isinstance(gw, str) else gw.url
    return http("POST", f"{url}/v1/send", body, **kw)
