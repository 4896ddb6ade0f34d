"""Error answers back into typed errors (the client side of the one error table)."""

from __future__ import annotations

import pytest

from agent_reach import errors
from agent_reach.errors import AgentReachError, error_from_answer
from agent_reach.settings import gateway_url
from agent_reach.wire.status import STATUS, headers_for, reach_status, status_for

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
    "registry_full": errors.RegistryFull,
    "config_error": errors.ConfigError,
    "backend_unavailable": errors.BackendUnavailable,
    "internal_error": errors.InternalError,
}

# the contract's HTTP statuses (CONTRACT.md v1 and v1.1), checked against the edge's one table
CONTRACT_STATUS = {
    "unauthorized": 401,
    "forbidden": 403,
    "no_capable_agent": 404,
    "recipient_not_found": 404,
    "rate_limited": 429,
    "recipient_incapable": 422,
    "agent_error": 502,
    "all_attempts_failed": 502,
    "no_available_agent": 503,
    "deadline_exceeded": 504,
    "payload_too_large": 413,
    "endpoint_not_registered": 404,
    "trace_not_found": 404,
}


def _classes() -> list[type[AgentReachError]]:
    found, todo = [], [AgentReachError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_a_row_in_the_http_table() -> None:
    missing = sorted({c.code for c in _classes()} - STATUS.keys())
    assert missing == []
    assert {code: STATUS[code] for code in CONTRACT_STATUS} == CONTRACT_STATUS


def test_errors_carry_no_protocol_status() -> None:
    for cls in _classes():
        assert "status" not in vars(cls), cls  # the HTTP status lives in the edge's table


def test_invalid_request_is_400_when_malformed_else_422() -> None:
    assert status_for(errors.InvalidRequest("not JSON", malformed=True)) == 400
    assert status_for(errors.InvalidRequest("bad field", field="intent")) == 422
    assert status_for(errors.RateLimited("slow", retry_after_s=2.2)) == 429
    assert headers_for(errors.RateLimited("slow", retry_after_s=2.2)) == {"Retry-After": "3"}
    assert headers_for(errors.RateLimited("slow")) == {"Retry-After": "1"}
    assert headers_for(errors.Forbidden("no")) == {}


def test_config_error_names_source_and_line() -> None:
    exc = errors.PolicyFileError("bad rule", source="policy.toml", line=4)
    assert isinstance(exc, errors.ConfigError)
    assert (exc.source, exc.line, exc.detail) == ("policy.toml", 4, "bad rule")
    assert str(exc) == "policy.toml line 4: bad rule"
    assert str(errors.PolicyFileError("empty", source="p.toml", line=None)) == "p.toml: empty"
    assert errors.KeyDirectoryError("no keys").to_body()["error"] == "config_error"


@pytest.mark.parametrize(("code", "kind"), sorted(CODES.items()))
def test_each_contract_code_comes_back_as_its_class(code: str, kind: type) -> None:
    exc = error_from_answer(418, {"ok": False, "error": code, "detail": "why", "extra": 1})
    assert type(exc) is kind
    assert (exc.code, exc.http_status, exc.detail, exc.fields) == (code, 418, "why", {"extra": 1})


def test_a_rendered_error_round_trips() -> None:
    sent = errors.AllAttemptsFailed("ran out", msg_id="m1", trace_id="t1", attempts=[{"x": 1}])
    assert sent.http_status is None  # raised here, not rebuilt from an answer
    back = error_from_answer(status_for(sent), sent.to_body())
    assert back.http_status == 502
    assert isinstance(back, errors.AllAttemptsFailed)
    assert (back.msg_id, back.trace_id, back.attempts) == ("m1", "t1", [{"x": 1}])
    assert back.to_body() == sent.to_body()


def test_unknown_code_keeps_code_and_status() -> None:
    exc = error_from_answer(409, {"ok": False, "error": "from_the_future"})
    assert type(exc) is AgentReachError
    assert (exc.code, exc.http_status) == ("from_the_future", 409)
    assert "from_the_future" in exc.detail


@pytest.mark.parametrize("body", [None, "text", [], {"ok": False}, {"error": 3}])
def test_a_body_not_of_the_contract_shape_is_gateway_unavailable(body: object) -> None:
    exc = error_from_answer(502, body)
    assert isinstance(exc, errors.GatewayUnavailable)
    assert exc.fields == {"http_status": 502}


@pytest.mark.parametrize("name", ["self", "cls", "fields", "code"])
def test_any_field_name_of_an_answer_is_kept(name: str) -> None:
    """An error body is the gateway's (or any server's claiming to be one): a field named
    ``self`` made rebuilding the error raise TypeError, which ended an agent's heartbeat line
    (a review found it). Every field is kept as given."""
    body = {"ok": False, "error": "backend_unavailable", "detail": "busy", name: 1, "x": 2}
    exc = error_from_answer(503, body)
    assert isinstance(exc, errors.BackendUnavailable)
    assert exc.detail == "busy" and exc.http_status == 503
    assert exc.fields == {k: v for k, v in body.items() if k not in ("ok", "error", "detail")}


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
    with pytest.raises(errors.ConfigError, match="http"):
        gateway_url("127.0.0.1:7700", {})


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (None, 200),
        ("200", 200),
        (" 503 ", 503),
        ("404", 404),
        ("099", None),
        ("600", None),
        ("20", None),
        ("2000", None),
        ("abc", None),
        ("", None),
        ("5e2", None),
    ],
)
def test_a_reach_status_header_reads_as_an_http_status_or_as_unusable(
    raw: str | None, status: int | None
) -> None:
    assert reach_status(raw) == status
