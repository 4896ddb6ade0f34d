"""Idle connections cannot lock the gateway out (issue 17's finding: about 1,000 connections that
never send a request stayed open forever, and with a 1,024 open-files limit the gateway stopped
answering). A real gateway, raw sockets: one that sends nothing is closed after
``--idle-timeout``; past ``--max-connections`` the oldest idle one is closed for a new one, and
the gateway answers throughout."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import pytest

from tests.support import gateway, http, metric, wait_until


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
            # every one counted (the scrape's own connection may make one more)
            assert metric(gw, "agent_reach_http_connections_closed_at_bound_total") >= 20
        finally:
            for sock in idle:
                sock.close()


def _status_line(sock: socket.socket) -> bytes:
    """Read an answer's head off ``sock``; its status line (the answers here are small)."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"closed with the request unanswered: {head!r}"
        head += chunk
    return head.split(b"\r\n")[0]


_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def test_a_request_sent_during_a_stall_longer_than_the_idle_timeout_is_answered() -> None:
    # docs/reliability.md's B1: when the loop resumed, the idle check ran before the loop read
    # the request waiting in the socket, closed the connection, and the client got a reset
    with gateway("--matcher", "none", "--idle-timeout", "1") as gw:
        sock = _connect(gw.url)
        try:
            sock.sendall(_HEALTHZ)
            assert _status_line(sock) == b"HTTP/1.1 200 OK"
            time.sleep(0.3)  # a kept-alive connection between two requests, the loop waiting
            gw.popen.send_signal(signal.SIGSTOP)
            try:
                # the stall itself, twice the idle timeout; the request sent at its end (sent
                # at its start, the loop's wait was woken by it: that one was read in time)
                time.sleep(2.0)
                sock.sendall(_HEALTHZ)
            finally:
                gw.popen.send_signal(signal.SIGCONT)
            assert _status_line(sock) == b"HTTP/1.1 200 OK"
        finally:
            sock.close()
        # and the connection is still an idle one like any other: closed a timeout later
        quiet = _connect(gw.url)
        try:
            quiet.settimeout(5)
            assert quiet.recv(1) == b""
        finally:
            quiet.close()


def _trickle_head(path: bytes) -> bytes:
    return (
        b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n{"
    )


def _trickle_until_closed(sock: socket.socket, every_s: float, limit_s: float) -> float | None:
    """Send a byte of body every ``every_s`` until the gateway closes ``sock``: the seconds
    that took (None: still open after ``limit_s``)."""
    started = time.monotonic()
    sock.settimeout(every_s)
    while time.monotonic() - started < limit_s:
        try:
            sock.sendall(b" ")
            if sock.recv(1) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue  # nothing came back: still open
        except OSError:
            return time.monotonic() - started
    return None


TRICKLED = (b"/v1/send", b"/v1/register", b"/a2a", b"/mcp")


def test_a_request_trickled_past_the_read_timeout_is_closed_whichever_reader_has_it() -> None:
    # a byte every 0.2 s keeps --idle-timeout (5 s) from ever firing: only the read deadline
    # (1 s from the request's first byte) ends it, on the front's route (/v1/send) as on
    # aiohttp's (the API's /v1/register, the A2A edge's /a2a, the MCP SDK's /mcp)
    flags = ("--matcher", "none", "--idle-timeout", "5", "--read-timeout", "1")
    with gateway(*flags) as gw:
        took = {}
        for path in TRICKLED:
            sock = _connect(gw.url)
            try:
                sock.sendall(_trickle_head(path))
                took[path] = _trickle_until_closed(sock, 0.2, 10.0)
            finally:
                sock.close()
        assert http("GET", f"{gw.url}/healthz")[0] == 200
        counted = metric(gw, "agent_reach_http_read_timeouts_total")
        lines = [line for line in gw.log_lines() if line.get("event") == "http.read_timeout"]
    for path, seconds in took.items():
        assert seconds is not None and 0.9 <= seconds < 4.0, (path, seconds)
    assert counted == len(TRICKLED)
    assert lines and lines[0]["read_timeout_s"] == 1.0


def _healthz_answered(url: str) -> bool:
    sock = _connect(url)
    try:
        sock.sendall(_HEALTHZ)
        return _status_line(sock) == b"HTTP/1.1 200 OK"
    except (AssertionError, OSError):  # closed unanswered: the new connection was refused
        return False
    finally:
        sock.close()


def _read_by_gateway(url: str, n: int) -> bool:
    """Whether ``n`` connections to the gateway at ``url`` are open and it has read every byte
    sent on them (nothing waits in its receive queues: ``ss``)."""
    port = url.rsplit(":", 1)[1]
    lines = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return len(lines) >= n and all(line.split()[0] == "0" for line in lines)


@pytest.mark.parametrize("path", [b"/v1/send", b"/v1/register"], ids=["front", "aiohttp"])
def test_at_the_cap_a_connection_trickling_a_request_goes_for_the_new_one(path: bytes) -> None:
    # every connection holds a request that never finishes arriving (none is idle): before,
    # each new connection was the one closed, for as long as the bytes kept coming
    flags = ("--matcher", "none", "--max-connections", "4", "--read-timeout", "60")
    with gateway(*flags) as gw:
        held = [_connect(gw.url) for _ in range(4)]
        try:
            for sock in held:
                sock.sendall(_trickle_head(path))
            began = time.monotonic()
            wait_until(lambda: _read_by_gateway(gw.url, 4), 5)
            # a request begun less than a second ago is spared (the new one is closed), then
            # the one arriving longest goes
            wait_until(lambda: _healthz_answered(gw.url), 5)
            took = time.monotonic() - began
            closed = [_closed(s) for s in held]
        finally:
            for sock in held:
                sock.close()
    assert took >= 0.9, took
    assert closed == [True, False, False, False]  # the oldest reader made room


def test_chunk_framing_past_any_body_closes_the_connection() -> None:
    # chunk extensions are no body bytes: the front kept every byte of them (here 4 MB of
    # them, fast, well within --read-timeout, against --max-body-bytes 1 MiB)
    with gateway("--matcher", "none") as gw:
        sock = _connect(gw.url)
        try:
            sock.sendall(
                b"POST /v1/send HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n1;"
            )
            junk = b"a" * 65536
            sent = 0
            try:
                while sent < 4 * 1024 * 1024:
                    sock.sendall(junk)
                    sent += len(junk)
                sock.settimeout(5)
                closed = sock.recv(1) == b""
            except TimeoutError:  # still open
                closed = False
            except OSError:  # reset while still sending
                closed = True
        finally:
            sock.close()
        assert closed
        assert http("GET", f"{gw.url}/healthz")[0] == 200
        assert metric(gw, "agent_reach_http_malformed_total") >= 1
