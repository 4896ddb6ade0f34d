"""Error answers back into typed errors (the client side of the one error table)."""

from __future__ import annotations

import pytest

from agent_reach import errors
from agent_reach.errors import AgentReachError, error_from_answer
from agent_reach.settings import gateway_url

CODES = {
    "invalid_request": errors.InvalidRequest,
    "payload_too_large": errors.PayloadTooLarge,
    "endpoint_not_registered": errors.EndpointNotRegistered,
    "trace_not_found": errors.TraceNotFound,
    "unauthorized": errors.Unauthorized,
    "forbidden": errors.Forbidden,
    "rate_limited": errors.RateLimited,
    "no_capable_agent": errors.NoCapableAgent,
    "recipient_not_found": errors.RecipientNotFound,
    "recipient_incapable": errors.RecipientIncapable,
    "no_available_agent": errors.NoAvailableAgent,
    "agent_error": errors.AgentError,
    "all_attempts_failed": errors.AllAttemptsFailed,
    "deadline_exceeded": errors.DeadlineExceeded,
}


@pytest.mark.parametrize(("code", "kind"), sorted(CODES.items()))
def test_each_contract_code_comes_back_as_its_class(code: str, kind: type) -> None:
    exc = error_from_answer(418, {"ok": False, "error": code, "detail": "why", "extra": 1})
    assert type(exc) is kind
    assert (exc.code, exc.status, exc.detail, exc.fields) == (code, 418, "why", {"extra": 1})


def test_a_rendered_error_round_trips() -> None:
    sent = errors.AllAttemptsFailed("ran out", msg_id="m1", trace_id="t1", attempts=[{"x": 1}])
    back = error_from_answer(sent.status, sent.to_body())
    assert isinstance(back, errors.AllAttemptsFailed)
    assert (back.msg_id, back.trace_id, back.attempts) == ("m1", "t1", [{"x": 1}])
    assert back.to_body() == sent.to_body()


def test_unknown_code_keeps_code_and_status() -> None:
    exc = error_from_answer(409, {"ok": False, "error": "from_the_future"})
    assert type(exc) is AgentReachError
    assert (exc.code, exc.status) == ("from_the_future", 409)
    assert "from_the_future" in exc.detail


@pytest.mark.parametrize("body", [None, "text", [], {"ok": False}, {"error": 3}])
def test_a_body_not_of_the_contract_shape_is_gateway_unavailable(body: object) -> None:
    exc = error_from_answer(502, body)
    assert isinstance(exc, errors.GatewayUnavailable)
    assert exc.fields == {"http_status": 502}


def test_reach_error_fields_are_typed_even_when_absent() -> None:
    exc = errors.NoCapableAgent("none")
    assert (exc.msg_id, exc.trace_id, exc.attempts) == (None, None, [])
    assert errors.RateLimited("slow down", retry_after_s=2).retry_after_s == 2.0
    assert errors.RateLimited("slow down").retry_after_s is None


def test_gateway_url_explicit_then_env_then_default() -> None:
    env = {"AGENT_REACH_GATEWAY": "http://gw.example:7700/"}
    assert gateway_url("http://a:1/", env) == "http://a:1"
    assert gateway_url(None, env) == "http://gw.example:7700"
    assert gateway_url(None, {}) == "http://127.0.0.1:7700"
    assert gateway_url(None, {"AGENT_REACH_GATEWAY": ""}) == "http://127.0.0.1:7700"
    with pytest.raises(ValueError, match="http"):
        gateway_url("127.0.0.1:7700", {})
