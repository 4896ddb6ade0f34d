"""Which bearer token each call of a client presents, in token mode (docs/security.md).

A client has its own token: a string (held here), or a function giving the current one (read
at each request; then nothing is held or adopted here: the function decides). A client given a
string also holds the endpoint token of each registration it makes, replaced by the renewals its
heartbeats bring; the calls made as that endpoint present it. An endpoint token found refused is
dropped, so that the next registration presents the client's own token again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agent_reach.settings import gateway_token

__all__ = ["Credentials"]


class Credentials:
    """The tokens of one client: its own (``token``, default ``$AGENT_REACH_TOKEN``) and the
    endpoint tokens it adopted, by endpoint id."""

    def __init__(self, token: str | Callable[[], str | None] | None) -> None:
        self._adopts = token is None or isinstance(token, str)
        self._held = gateway_token(token) if token is None or isinstance(token, str) else None
        self._own: Callable[[], str | None] = (
            (lambda: self._held) if token is None or isinstance(token, str) else token
        )
        self._endpoints: dict[str, str] = {}  # endpoint id -> its endpoint token

    def own(self) -> str | None:
        """The client's own token now (None: open mode)."""
        return self._own()

    def endpoint_token(self, endpoint_id: str) -> str | None:
        """The endpoint token held for ``endpoint_id``, if any."""
        return self._endpoints.get(endpoint_id)

    def adopt(self, endpoint_id: str, token: str | None) -> None:
        """Hold ``token`` (a registration's or a renewal's) for ``endpoint_id``."""
        if token and self._adopts:
            self._endpoints[endpoint_id] = token

    def forget(self, endpoint_id: str) -> None:
        """``endpoint_id`` is deregistered: its endpoint token is of no more use."""
        self._endpoints.pop(endpoint_id, None)

    def refused(self, endpoint_id: str, presented: Mapping[str, str]) -> None:
        """A call made as ``endpoint_id`` with the headers :meth:`as_endpoint` gave was refused
        (401/403): drop that endpoint token, unless a newer one replaced it meanwhile."""
        token = self._endpoints.get(endpoint_id)
        if token is not None and presented.get("Authorization") == f"Bearer {token}":
            del self._endpoints[endpoint_id]

    def as_endpoint(self, endpoint_id: str | None) -> dict[str, str] | None:
        """The Authorization of a call made as ``endpoint_id``, when its endpoint token is held
        (None: the call presents the client's own token)."""
        token = self._endpoints.get(endpoint_id) if endpoint_id else None
        return {"Authorization": f"Bearer {token}"} if token else None
