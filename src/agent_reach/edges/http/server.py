"""aiohttp's low-level server, with malformed HTTP answered in the contract's shape.

A request aiohttp's parser cannot read (a bad ``Content-Length``, chunked with a
``Content-Length``, the HTTP/2 preface, a NUL in a header, a header over its limit, a method
that is no method) never reaches :meth:`~agent_reach.edges.http.app.HttpEdge.handle`:
aiohttp answers it itself, by default with a text/plain ``HTTP/1.0 400`` that echoes part of
the input, and logs an ERROR line with a traceback and no trace id, a cheap way to flood the
log. Here (:class:`ReachServer`) such a request gets the contract's error body
(``invalid_request``, JSON, the status aiohttp chose, the connection closed), and one WARNING
line ``http.malformed`` (the peer, the status, the parser's reason, cut short): at most
:data:`LOG_PER_S` a second, the rest counted in the next line's ``suppressed``.

This overrides ``RequestHandler.handle_error`` and ``Server.__call__``, which aiohttp (3.9 to
3.14) uses to make each connection's protocol: check both when upgrading aiohttp
(tests/integration/test_malformed_http.py fails if they stop being used).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agent_reach.observability.logs import log
from agent_reach.wire.bodies import encode

__all__ = ["LOG_PER_S", "ReachServer"]

LOG_PER_S = 1.0  # http.malformed lines a second, at most
_REASON_MAX = 120  # characters of the parser's reason kept (it may quote the input)


class _Throttle:
    """At most ``per_s`` log lines a second; counts what it holds back."""

    def __init__(self, per_s: float) -> None:
        self.every = 1.0 / per_s
        self.next_at = 0.0
        self.suppressed = 0

    def take(self) -> int | None:
        """The count held back since the last line when a line may go now, else None."""
        now = time.monotonic()
        if now < self.next_at:
            self.suppressed += 1
            return None
        self.next_at = now + self.every
        held, self.suppressed = self.suppressed, 0
        return held


_THROTTLE = _Throttle(LOG_PER_S)


def _reason(exc: BaseException | None, message: str | None) -> str:
    text = message or (type(exc).__name__ if exc is not None else "unreadable request")
    text = " ".join(text.split())  # one line, whatever the input held
    printable = "".join(c if c.isprintable() else "?" for c in text)
    return printable[:_REASON_MAX]


class _ReachRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # a fault of ours (our handler catches its own): aiohttp's way
            return super().handle_error(request, status, exc, message)
        reason = _reason(exc, message)
        held = _THROTTLE.take()
        if held is not None:
            log(
                logging.WARNING,
                "http.malformed",
                remote=request.remote or "?",
                status=status,
                reason=reason,
                suppressed=held,
            )
        if request.writer.output_size > 0:  # part of an answer went out: nothing more can
            raise ConnectionError("malformed request after an answer had started")
        body = {
            "ok": False,
            "error": "invalid_request",
            "detail": f"malformed HTTP request: {reason}",
        }
        resp = web.Response(status=status, body=encode(body), content_type="application/json")
        resp.force_close()
        return resp


class ReachServer(web.Server):
    """``web.Server`` whose connections answer malformed HTTP as the module says."""

    def __call__(self) -> RequestHandler:
        kwargs: dict[str, Any] = self._kwargs
        return _ReachRequestHandler(self, loop=self._loop, **kwargs)
