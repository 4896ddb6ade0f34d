"""What the API fuzzes share (HTTP, token mode, NATS): the random JSON values, the only 5xx
answers a gateway may give on the in-memory registry, and the check of an error answer's shape."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)

# the only 5xx answers the contract allows from a gateway on the in-memory registry: routing
# outcomes (the fuzzed endpoints point at the discard port), never a fault of its own
ROUTING_5XX = {
    502: {"agent_error", "all_attempts_failed"},
    503: {"no_available_agent"},
    504: {"deadline_exceeded"},
}


def check_error_shape(status: int, body: Any) -> None:
    """A 5xx only of the routing outcomes; every 4xx/5xx the contract's error body."""
    if status >= 500:
        assert body["error"] in ROUTING_5XX.get(status, ()), body
    if status >= 400:
        assert isinstance(body, dict), body
        assert body["ok"] is False
        assert isinstance(body["error"], str) and isinstance(body["detail"], str)
