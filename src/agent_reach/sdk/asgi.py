"""The agent's delivery endpoint as a raw ASGI app, for teams that already serve one.

``agent.asgi()`` returns an :class:`AsgiDelivery`; mount it in Starlette or FastAPI and let the
app's lifespan run the heartbeat line (``agent.lifespan(endpoint_url=...)``)::

    app = Starlette(
        routes=[Mount("/reach", app=agent.asgi())],
        lifespan=agent.lifespan(endpoint_url="http://127.0.0.1:8000/reach/"),
    )

Starlette's ``Mount("/reach")`` answers ``/reach`` with a redirect to ``/reach/`` (which the
gateway does not follow), so register the URL with the trailing slash; or use
``Route("/reach", agent.asgi(), methods=["POST"])`` for the exact path. This adapter only reads
the body (capped) and writes the answer: the delivery logic is the same
:class:`~agent_reach.sdk._delivery.Dispatcher` the agent's own aiohttp server uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agent_reach.sdk._delivery import Answer, Dispatcher, not_allowed, too_large

__all__ = ["AsgiDelivery"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class AsgiDelivery:
    """An ASGI app answering ``POST`` deliveries (any path under where it is mounted).

    Bodies over ``max_body_bytes`` get 413 ``payload_too_large``, other methods 405, both in
    the contract's error shape; a client that goes away before its body is read gets nothing.
    """

    def __init__(self, dispatcher: Dispatcher, max_body_bytes: int) -> None:
        self.dispatcher = dispatcher
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise RuntimeError(f"the delivery endpoint serves HTTP, not {scope['type']!r}")
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        if scope.get("method") != "POST":
            await _answer(send, not_allowed(str(scope.get("method"))), allow=True)
            return
        try:
            body = await _read(receive, headers, self.max_body_bytes)
        except _ClientGone:
            return
        if body is None:
            await _answer(send, too_large(self.max_body_bytes))
            return
        await _answer(send, await self.dispatcher.deliver(body, headers))


class _ClientGone(Exception):
    """The client disconnected before its body was read (internal to this adapter)."""


async def _read(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The body, or None when it is over ``limit``; _ClientGone when the client went away."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, answer: Answer, *, allow: bool = False) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(answer.body)).encode()),
    ]
    if allow:
        headers.append((b"allow", b"POST"))
    timing = answer.server_timing()
    if timing is not None:
        headers.append((b"server-timing", timing.encode()))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
