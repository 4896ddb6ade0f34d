"""What a caller can make the gateway hold is bounded: records (--max-endpoints), the rate of
registrations per address; and a refused send still names its ids, whatever refused it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support import Proc, gateway, http, http_full, metric


@pytest.fixture
def small() -> Iterator[Proc]:
    with gateway(
        "--max-endpoints", "5", "--register-rate-limit", "0.5", "--register-rate-burst", "12"
    ) as proc:
        yield proc


def register(gw: Proc, name: str) -> tuple[int, dict[str, object]]:
    body = {
        "endpoint_id": f"agent://{name}",
        "capabilities": ["bound.test"],
        "endpoint_url": "http://127.0.0.1:9/reach",
    }
    return http("POST", f"{gw.url}/v1/register", body)


def listed(gw: Proc) -> list[str]:
    return sorted(a["endpoint_id"] for a in http("GET", f"{gw.url}/v1/agents")[1]["agents"])


def test_past_max_endpoints_a_new_id_is_refused_and_nothing_changes(small: Proc) -> None:
    for n in range(5):
        assert register(small, f"bound-{n}")[0] == 200
    status, answer = register(small, "bound-5")
    assert (status, answer["error"]) == (503, "registry_full")
    assert "5" in str(answer["detail"])
    assert listed(small) == [f"agent://bound-{n}" for n in range(5)]
    # the bound hit is logged and counted
    denied = [line for line in small.log_lines() if line["event"] == "audit.denied"]
    assert [(d["target"], d["status"]) for d in denied] == [("agent://bound-5", 503)]
    assert metric(small, "agent_reach_denied_total", action="register", status="503") == 1
    assert register(small, "bound-2")[0] == 200  # a known id may always register again
    assert http("POST", f"{small.url}/v1/deregister", {"endpoint_id": "agent://bound-0"})[0] == 200
    assert register(small, "bound-5")[0] == 200  # a place freed


def test_a_flood_of_refusals_at_the_bound_is_counted_each_but_logged_a_line_a_second() -> None:
    # any client can send new ids to a full registry: one WARNING line each was a cheap way to
    # flood the log; each is still counted
    with gateway("--max-endpoints", "1", "--register-rate-burst", "100") as gw:
        assert register(gw, "kept")[0] == 200
        started = time.monotonic()
        codes = [register(gw, f"flood-{n}")[0] for n in range(30)]
        took = time.monotonic() - started
        assert codes == [503] * 30
        assert metric(gw, "agent_reach_denied_total", action="register", status="503") == 30
        denied = [line for line in gw.log_lines() if line["event"] == "audit.denied"]
    assert denied[0]["target"] == "agent://flood-0" and denied[0]["suppressed"] == 0
    # a line a second at most (the 30 took well under a second here: at most 2 lines then)
    assert len(denied) <= 1 + int(took), (len(denied), took)


def test_registrations_past_the_rate_are_refused_with_retry_after(small: Proc) -> None:
    codes = []
    for n in range(14):  # a burst of 12, refilling at 0.5 a second: the 13th is refused
        status, _ = register(small, f"rate-{n % 3}")
        codes.append(status)
    assert codes[:12] == [200] * 12
    assert 429 in codes[12:]
    status, answer, headers = http_full(
        "POST",
        f"{small.url}/v1/register",
        {
            "endpoint_id": "agent://rate-x",
            "capabilities": ["bound.test"],
            "endpoint_url": "http://127.0.0.1:9/reach",
        },
    )
    assert (status, answer["error"]) == (429, "rate_limited")
    assert int(headers["Retry-After"]) >= 1
    assert "agent://rate-x" not in listed(small)
    denied = [line for line in small.log_lines() if line["event"] == "audit.denied"]
    assert any(line["action"] == "register" and line["status"] == 429 for line in denied)


def test_a_send_refused_by_open_modes_browser_guard_names_its_ids() -> None:
    with gateway() as gw:
        body = {"intent": "bound.test", "msg_id": "msg_page", "trace_id": "trace_page"}
        status, answer = http(
            "POST", f"{gw.url}/v1/send", body, headers={"Origin": "https://evil.example"}
        )
        assert (status, answer["error"]) == (403, "forbidden")
        assert (answer["msg_id"], answer["trace_id"], answer["attempts"]) == (
            "msg_page",
            "trace_page",
            [],
        )
        # and the audit line of the refusal carries the request's trace id
        denied = [line for line in gw.log_lines() if line["event"] == "audit.denied"]
        assert [line.get("trace_id") for line in denied] == ["trace_page"]
