"""Gateway URLs over NATS: nats://[USER:PASSWORD@]HOST:PORT[/PREFIX] (and tls://), one NATS
system per list, one prefix; the refusals name the URL (password hidden); and the calls the
gateway does not serve over NATS are refused before anything is connected."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach.errors import ConfigError, GatewayUnavailable
from agent_reach.sdk._natsgateway import Headers, NatsGatewayPool
from agent_reach.sdk.client import ReachClient
from agent_reach.settings import NatsGateway, gateway_urls, nats_gateway

NO_ENV: dict[str, str] = {}
HTTP_ENV = {"AGENT_REACH_GATEWAY": "http://x:1"}


@pytest.mark.parametrize(
    ("given", "env", "urls", "target"),
    [
        ("nats://a:4222", NO_ENV, ("nats://a:4222",), (("nats://a:4222",), "agent-reach")),
        ("nats://a:4222/", NO_ENV, ("nats://a:4222",), (("nats://a:4222",), "agent-reach")),
        ("nats://a:1/t.r/", NO_ENV, ("nats://a:1/t.r",), (("nats://a:1",), "t.r")),
        ("tls://a:4443/p", NO_ENV, ("tls://a:4443/p",), (("tls://a:4443",), "p")),
        ("nats://u:pw@a:4222/p", NO_ENV, ("nats://u:pw@a:4222/p",), (("nats://u:pw@a:4222",), "p")),
        ("nats://a", NO_ENV, ("nats://a",), (("nats://a",), "agent-reach")),  # nats-py: 4222
        # several: the servers of one system; a prefix named once or on each, the same
        (
            "nats://a:1/p, nats://b:2/p,nats://a:1/p",
            NO_ENV,
            ("nats://a:1/p", "nats://b:2/p"),
            (("nats://a:1", "nats://b:2"), "p"),
        ),
        (
            ["nats://a:1", "nats://b:2/agent-reach"],
            NO_ENV,
            ("nats://a:1", "nats://b:2/agent-reach"),
            (("nats://a:1", "nats://b:2"), "agent-reach"),
        ),
        (
            None,
            {"AGENT_REACH_GATEWAY": "nats://x:1/p,tls://y:2/p"},
            ("nats://x:1/p", "tls://y:2/p"),
            (("nats://x:1", "tls://y:2"), "p"),
        ),
        ("nats://a:1/p", HTTP_ENV, ("nats://a:1/p",), (("nats://a:1",), "p")),  # given wins
    ],
)  # fmt: skip
def test_nats_gateway_urls(
    given: Any, env: dict[str, str], urls: tuple[str, ...], target: tuple[tuple[str, ...], str]
) -> None:
    assert gateway_urls(given, env) == urls
    assert nats_gateway(urls) == NatsGateway(*target)


def test_http_urls_are_no_nats_gateway() -> None:
    assert nats_gateway(gateway_urls("http://a:1,https://b", NO_ENV)) is None
    assert nats_gateway(gateway_urls(None, NO_ENV)) is None


def test_the_subjects_are_the_prefix_s() -> None:
    target = nats_gateway(("nats://a:1/team.reach",))
    assert target is not None
    assert [target.subject(op) for op in ("register", "send")] == [
        "team.reach.v1.register",
        "team.reach.v1.send",
    ]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("http://a:1,nats://b:2", "cannot mix http(s) and NATS: got 'nats://b:2' after 'http://a:1'"),
        ("nats://b:2,https://a", "cannot mix http(s) and NATS: got 'https://a' after 'nats://b:2'"),
        ("nats://a:1/p,nats://b:2/q", "different prefixes: 'p' (nats://a:1/p), 'q' (nats://b:2/q)"),
        ("nats://a:1,nats://b:2/q", "must share the gateways' --nats-prefix"),
        ("nats://a:1/$SYS", "prefix '$SYS'"),
        ("nats://a:1/p.*", "prefix 'p.*'"),
        ("nats://a:1/p.>", "prefix 'p.>'"),
        ("nats://a:1/p..q", "prefix 'p..q'"),
        ("nats://a:1/p q", "prefix 'p q'"),
        ("nats://a:1/p/q", "prefix 'p/q'"),
        ("nats://a:1/p%2Aq", "prefix 'p%2Aq'"),
        ("nats://a:0", "use nats://[USER:PASSWORD@]HOST:PORT[/PREFIX]"),
        ("nats://a:1?name=x", "use nats://"),
        ("nats://a:1#p", "use nats://"),
        ("nats://:4222", "has no host"),
        ("nats://a:99999", "not a valid URL"),
        ("nats:a.b", "must start with http:// or https:// (or nats:// or tls://"),  # a subject
        ("ws://a:1", "must start with http:// or https:// (or nats:// or tls://"),
    ],
)  # fmt: skip
def test_refusals_name_the_url(given: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        gateway_urls(given, NO_ENV)
    assert message in str(caught.value)


def test_a_refusal_hides_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        gateway_urls("nats://alice:s3cret@a:1/$x", NO_ENV)
    assert "s3cret" not in str(caught.value)
    assert "nats://alice:***@a:1/$x" in str(caught.value)
    with pytest.raises(ConfigError) as mixed:
        gateway_urls("http://a:1,nats://alice:s3cret@b:2", NO_ENV)
    assert "s3cret" not in str(mixed.value)


def test_a_mixed_environment_variable_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="cannot mix"):
        gateway_urls(None, {"AGENT_REACH_GATEWAY": "nats://a:1,http://b:2"})


# --- what is not served over NATS is refused before anything is connected ----------------------

# port 1: were anything connected, the call would fail with GatewayUnavailable instead
NOWHERE = "nats://127.0.0.1:1/p"


async def test_calls_not_served_over_nats_are_refused_naming_the_call() -> None:
    async with ReachClient(NOWHERE) as client:
        calls: list[tuple[str, Any]] = [
            ("GET /v1/agents", client.agents()),
            ("GET /v1/agents/a-01", client.agent("agent://a-01")),
            ("GET /v1/route", client.explain("a.b")),
            ("GET /v1/traces/t1", client.trace("t1")),
            ("POST /v1/tokens", client.issue_token("client", subject="agent://a-01")),
            ("GET /healthz", client.healthz()),
            ("GET /metrics", client.metrics()),
        ]
        for what, call in calls:
            with pytest.raises(ConfigError) as caught:
                await call
            text = str(caught.value)
            assert text.startswith(f"{what} is not served over NATS"), text
            assert "only register, heartbeat, deregister, send and its public keys" in text
            assert "use an http:// gateway" in text
            assert caught.value.http_status is None  # ours: the CLI's exit 2


async def test_the_pool_takes_only_nats_urls_and_its_unserved_calls_send_nothing() -> None:
    with pytest.raises(ConfigError, match="nats:// or tls://"):
        NatsGatewayPool(("http://a:1",))
    pool = NatsGatewayPool((NOWHERE,), connect_timeout_s=0.2)
    with pytest.raises(ConfigError, match="POST /v1/agents is not served"):
        await pool.call("POST", "/v1/agents", late=GatewayUnavailable, timeout_s=1.0)
    # a served path, but with another method: not a NATS operation
    with pytest.raises(ConfigError, match="GET /v1/send is not served"):
        await pool.call("GET", "/v1/send", late=GatewayUnavailable, timeout_s=1.0)
    await pool.close()


def test_the_client_over_nats_names_its_gateways() -> None:
    client = ReachClient("nats://alice:pw@a:4222/p,nats://b:4222/p")
    assert client.gateways == ("nats://alice:pw@a:4222/p", "nats://b:4222/p")
    assert client.gateway == "nats://alice:***@a:4222/p"  # before any connection: the first


def test_reply_headers_are_read_whatever_their_case() -> None:
    headers = Headers({"Reach-Status": "429", "retry-after": "2"})
    assert headers["reach-status"] == "429"
    assert headers.get("Retry-After") == "2"
    assert "RETRY-AFTER" in headers
    assert set(headers) == {"Reach-Status", "retry-after"}
    assert headers.get("Missing") is None
