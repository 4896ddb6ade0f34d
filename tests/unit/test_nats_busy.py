"""The gateway's NATS API past its ``max_inflight``: 503 ``overloaded`` at once, and a send's
answer names ids and attempts as every send's error does (CONTRACT.md: "as over HTTP"). The
ids are new ones: the answer is made before the request's body is read (over HTTP, a refusal
at admission echoes the caller's)."""

from __future__ import annotations

import json

import pytest

from agent_reach.edges.nats.edge import OPERATIONS, _busy
from agent_reach.wire.status import STATUS_HEADER


def test_a_busy_send_names_new_ids_and_no_attempts() -> None:
    body, headers = _busy("send")
    answer = json.loads(body)
    assert headers[STATUS_HEADER] == "503"
    assert int(headers["Retry-After"]) >= 1
    assert answer["error"] == "overloaded"
    assert answer["msg_id"].startswith("msg") and answer["trace_id"].startswith("trace")
    assert answer["attempts"] == []
    assert json.loads(_busy("send")[0])["msg_id"] != answer["msg_id"]  # new each time


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op != "send"])
def test_other_operations_answer_busy_without_send_ids(op: str) -> None:
    body, headers = _busy(op)
    answer = json.loads(body)
    assert (headers[STATUS_HEADER], answer["error"]) == ("503", "overloaded")
    assert "msg_id" not in answer and "attempts" not in answer


async def test_a_busy_answer_is_counted_as_the_bound_hit() -> None:
    from agent_reach.edges.nats.edge import NatsEdge
    from agent_reach.gateway.node import Node
    from agent_reach.settings import GatewaySettings

    node = Node(GatewaySettings(nats="nats://127.0.0.1:4222"))  # not connected: not started
    edge = NatsEdge(node)
    line = 'agent_reach_bound_hits_total{bound="nats_api_in_hand"}'
    assert f"{line} 0.0" in node.metrics.render().decode()
    edge._counted_busy("send")()
    edge._counted_busy("heartbeat")()
    assert f"{line} 2.0" in node.metrics.render().decode()


async def test_sends_in_hand_go_past_max_inflight_so_that_admission_refuses_first() -> None:
    """Sends in delivery are bounded by --max-inflight, with its priority shares (``high``
    only at 100 %): the edge's own bound of requests in hand (4,096) refused a ``high`` send
    at 41 % of ``--max-inflight 10000`` (a review of 2026-12-07). It is now 4,096 on top."""
    import uuid

    from agent_reach.edges.nats.edge import MAX_INFLIGHT, NatsEdge
    from agent_reach.gateway.node import Node
    from agent_reach.settings import GatewaySettings

    settings = GatewaySettings(
        nats="nats://127.0.0.1:4222",
        nats_prefix=f"busy-{uuid.uuid4().hex[:8]}",  # alone on its subjects
        max_inflight=10_000,
        matcher="none",
    )
    node = Node(settings)
    await node.start()  # the real NATS server of the machine (.ci/run starts it)
    edge = NatsEdge(node)
    try:
        await edge.start()
        bounds = {r.subject.rsplit(".", 1)[1]: r.max_inflight for r in edge._responders}
    finally:
        await edge.close()
        await node.close()
    assert bounds["send"] == MAX_INFLIGHT + 10_000
    assert {op: n for op, n in bounds.items() if op != "send"} == dict.fromkeys(
        (op for op in OPERATIONS if op != "send"), MAX_INFLIGHT
    )
