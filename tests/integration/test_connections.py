"""Idle connections cannot lock the gateway out (issue 17's finding: about 1,000 connections that
never send a request stayed open forever, and with a 1,024 open-files limit the gateway stopped
answering). A real gateway, raw sockets: one that sends nothing is closed after
``--idle-timeout``; past ``--max-connections`` the oldest idle one is closed for a new one, and
the gateway answers throughout."""

from __future__ import annotations

import socket
import time

from tests.support import gateway, http, wait_until


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _closed(sock: socket.socket) -> bool:
    """Whether the gateway has closed ``sock`` (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() -> None:
    with gateway("--matcher", "none", "--idle-timeout", "1") as gw:
        sock = _connect(gw.url)
        started = time.monotonic()
        try:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the gateway, not by this timeout
            took = time.monotonic() - started
        finally:
            sock.close()
        assert 0.9 <= took < 3.0, took
        # a connection in use is not: a request after 0.5 s of quiet is answered
        assert http("GET", f"{gw.url}/healthz")[0] == 200


def test_past_the_cap_the_oldest_idle_connections_make_room() -> None:
    with gateway("--matcher", "none", "--max-connections", "10") as gw:
        idle = [_connect(gw.url) for _ in range(30)]
        try:
            # the gateway still answers: each new connection closes the oldest idle one
            for _ in range(5):
                assert http("GET", f"{gw.url}/healthz")[0] == 200
            wait_until(lambda: sum(_closed(s) for s in idle) >= 20, 5)
            newest = idle[-5:]
            assert not any(_closed(s) for s in newest)  # the oldest went first
            lines = [
                line for line in gw.log_lines() if line.get("event") == "http.connections_full"
            ]
            assert lines and lines[0]["limit"] == 10, lines
            assert lines[0]["closed"] == "the oldest idle connection"
            assert len(lines) <= 3  # rate-limited: 35 evictions, about a line a second
        finally:
            for sock in idle:
                sock.close()
