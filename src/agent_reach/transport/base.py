"""The transport protocol: how a request reaches an agent and its answer comes back.

A transport never raises for what an agent does: every result, good or bad, is a
:class:`Delivery`. It enforces the attempt timeout it is given and a cap on answer size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

import msgspec

from agent_reach.core.model import Outcome

__all__ = ["Delivery", "Transport", "agent_answer", "server_timing"]


class Delivery(NamedTuple):
    """The result of one attempt.

    ``reached`` is False when nothing reached the agent (connection refused): such a retry is
    not charged to the retry budget. ``eject`` asks for the passive check (refused or reset).
    ``blameless``: nothing went out, and not for the agent's sake (the gateway's NATS link
    down, a request over the NATS server's ``max_payload``): the endpoint's cost, latency and
    ejection are left as they were.
    """

    outcome: Outcome
    status: int | None = None
    body: bytes | None = None
    detail: str = ""
    reached: bool = True
    eject: bool = False
    # the agent's own account of the attempt (its Server-Timing header), when it gave one
    agent_ms: float | None = None
    agent_note: str = ""
    # the request was sent again on a fresh connection inside this attempt (the keep-alive race)
    resent: bool = False
    blameless: bool = False


class Transport(Protocol):
    """Delivers one request body to one endpoint URL."""

    async def start(self) -> None:
        """Open pools; idempotent."""
        ...

    async def close(self) -> None:
        """Close pools; idempotent."""
        ...

    async def deliver(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> Delivery:
        """POST ``body`` to ``url`` and wait at most ``timeout_s`` for the whole answer.

        Outcomes: ``ok`` (2xx with a JSON body); ``agent_error`` (4xx, or an answer the gateway
        cannot use: 1xx/3xx, a 2xx that is not JSON, compressed or too large; never retried);
        ``server_error`` (5xx); ``timeout``; ``connect_error``.
        """
        ...


def agent_answer(status: int, data: bytes, encoding: str, timing: str | None) -> Delivery:
    """What an agent's answer means, whatever carried it (HTTP, or NATS's ``Reach-Status``):
    ``data`` is the whole body (within the size cap), ``encoding`` its Content-Encoding,
    ``timing`` the agent's Server-Timing header."""
    agent_ms, agent_note = server_timing(timing)
    if status >= 500:
        return Delivery(
            Outcome.SERVER_ERROR, status, data, f"agent answered {status}", True, False,
            agent_ms, agent_note,
        )  # fmt: skip
    if status >= 400:
        return Delivery(
            Outcome.AGENT_ERROR, status, data, f"agent answered {status}", True, False,
            agent_ms, agent_note,
        )  # fmt: skip
    # Past here the agent took the request: an unusable answer is not retried, so that a
    # side effect is not repeated (only timeouts, connection errors and 5xx are retryable).
    if status < 200 or status >= 300:
        note = " (redirects are not followed)" if 300 <= status < 400 else ""
        return Delivery(Outcome.AGENT_ERROR, status, None, f"agent answered {status}{note}")
    encoding = encoding.lower()
    if encoding != "identity":
        return Delivery(
            Outcome.AGENT_ERROR, status, None, f"agent answered with Content-Encoding {encoding}"
        )
    try:
        msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return Delivery(
            Outcome.AGENT_ERROR,
            status,
            None,
            f"agent answered {status} with a body that is not JSON",
        )
    return Delivery(Outcome.OK, status, data, "", True, False, agent_ms, agent_note)


def server_timing(value: str | None) -> tuple[float | None, str]:
    """The ``handle`` metric of a ``Server-Timing`` header: (duration in ms, its description).

    ``handle;dur=12.3;desc="cached"`` -> (12.3, "cached"); anything else -> (None, "").
    Agents that do not send the header (or send other metrics) simply give nothing.
    """
    if not value:
        return None, ""
    for metric in value.split(","):
        name, _, params = metric.strip().partition(";")
        if name.strip() != "handle":
            continue
        dur: float | None = None
        desc = ""
        for param in params.split(";"):
            key, _, raw = param.strip().partition("=")
            raw = raw.strip().strip('"')
            if key == "dur":
                try:
                    dur = float(raw)
                except ValueError:
                    return None, ""
                if not 0 <= dur < 1e9:  # NaN and nonsense from an agent: ignored
                    return None, ""
            elif key == "desc":
                desc = raw[:32]
        return (dur, desc) if dur is not None else (None, "")
    return None, ""
