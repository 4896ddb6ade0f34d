"""GET /openapi.json: generated from the wire structs, it documents every route the HTTP edge
serves, and a real gateway answers what it says (schemathesis, bounded examples)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from agent_reach.edges.http.app import HttpEdge
from agent_reach.edges.http.openapi import openapi_document
from agent_reach.gateway.node import Node
from agent_reach.settings import GatewaySettings
from tests.support import Proc, gateway, http


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway("--heartbeat-interval", "30") as proc:
        yield proc


def _served_routes() -> set[tuple[str, str]]:
    edge = HttpEdge(Node(GatewaySettings(port=0)))
    out = set()
    for method, path in edge._routes:  # the edge's own dispatch table
        if path.endswith("/") and path != "/":
            path += "{name}" if path == "/static/" or path == "/v1/agents/" else "{trace_id}"
        out.add((method.lower(), path))
    return out


def test_the_document_names_every_route_the_edge_serves() -> None:
    document = openapi_document()
    documented = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert documented == _served_routes()
    assert document["openapi"] == "3.1.0"


def test_the_schemas_are_the_wire_structs(gw: Proc) -> None:
    code, document = http("GET", f"{gw.url}/openapi.json")
    assert code == 200
    schemas = document["components"]["schemas"]
    send = schemas["SendBody"]
    # intent or intent_text: neither alone is required (the decoder checks that one is given)
    assert send.get("required", []) == []
    assert send["properties"]["intent_text"]["anyOf"][0]["maxLength"] == 2000
    assert send["properties"]["fallback"]["default"] is True
    assert sorted(send["properties"]["priority"]["enum"]) == ["high", "low", "normal"]
    assert send["properties"]["timeout_ms"]["anyOf"][0]["maximum"] == 600_000
    assert set(schemas["RegisterBody"]["required"]) == {
        "endpoint_id",
        "capabilities",
        "endpoint_url",
    }
    responses = document["paths"]["/v1/send"]["post"]["responses"]
    assert {"200", "400", "403", "404", "422", "429", "502", "503", "504"} <= responses.keys()
    assert "no_capable_agent" in responses["404"]["description"]


# A schema cannot say every rule of a body (an endpoint_url needs a host and a valid port, a
# recipient must be registered): a schema-valid request may be refused, with a documented error.
EXCLUDED = [schemathesis.checks.positive_data_acceptance]


def _operations(url: str) -> list[Any]:
    loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in loaded.get_all_operations()]


def test_every_answer_is_of_a_documented_shape_and_none_is_a_5xx(gw: Proc) -> None:
    """Schemathesis drives each documented operation with generated requests (valid and not:
    bounded examples a route) against the real gateway and checks every answer: no 5xx, a
    documented status, its content type and its body's schema."""
    operations = _operations(gw.url)
    documented = sum(len(ops) for ops in openapi_document()["paths"].values())
    assert len(operations) >= documented - 1, [op.label for op in operations]
    checked: list[str] = []
    for operation in operations:

        @settings(
            max_examples=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            case.call_and_validate(excluded_checks=EXCLUDED)

        call()
        checked.append(operation.label)
    assert len(checked) == len(operations)
