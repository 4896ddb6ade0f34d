"""Serving over NATS, decided when the Agent is made (no sockets): the subject derived from the
endpoint id, the subjects refused, and ``serve`` from the argument or $AGENT_REACH_SERVE."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_reach.core.names import is_endpoint_id
from agent_reach.errors import ConfigError
from agent_reach.sdk import Agent
from agent_reach.sdk._natslistener import agent_subject
from agent_reach.sdk.agent import nats_servers
from agent_reach.transport.nats import subject_refusal

NATS = "nats://127.0.0.1:4222"
names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,127}", fullmatch=True)


@pytest.mark.parametrize(
    ("endpoint_id", "subject"),
    [
        ("agent://weather-cn-01", "agents.weather-cn-01"),
        ("agent://weather.cn.01", "agents.weather~cn~01"),
        ("agent://a_b", "agents.a_b"),
        ("agent://a.", "agents.a~"),  # a trailing dot would be an empty token
        ("agent://a..b", "agents.a~~b"),
        ("agent://0", "agents.0"),
    ],
)
def test_the_default_subject_is_agents_dot_the_name_with_dots_mapped(
    endpoint_id: str, subject: str
) -> None:
    assert agent_subject(endpoint_id) == subject
    assert subject_refusal(f"nats:{subject}", ["agent-reach"]) is None


@given(names)
def test_every_endpoint_id_has_a_valid_subject_of_two_tokens(name: str) -> None:
    assert is_endpoint_id(f"agent://{name}")
    subject = agent_subject(f"agent://{name}")
    assert subject_refusal(f"nats:{subject}", ["agent-reach"]) is None
    assert len(subject.split(".")) == 2  # agents.* is every agent


@given(names, names)
def test_two_endpoint_ids_never_share_a_subject(a: str, b: str) -> None:
    # with "." mapped to "_", agent://a.b and agent://a_b would get each other's deliveries
    if a != b:
        assert agent_subject(f"agent://{a}") != agent_subject(f"agent://{b}")


def test_the_agent_takes_the_derived_subject_or_a_valid_explicit_one() -> None:
    agent = Agent("agent://weather.cn-01", serve=NATS)
    assert (agent.subject, agent.nats_servers) == ("agents.weather~cn-01", (NATS,))
    assert Agent("agent://w-01", serve=NATS, subject="fleet.weather.cn").subject == (
        "fleet.weather.cn"
    )
    assert Agent("agent://w-01", serve="http").subject is None


@pytest.mark.parametrize(
    ("subject", "why"),
    [
        ("fleet.*", "wildcard"),
        ("fleet.>", "wildcard"),
        ("fleet..x", "empty token"),
        ("fleet x", "space"),
        ("$JS.API.STREAM.DELETE.x", "under \\$"),
        ("_INBOX.abc", "_INBOX"),
        ("agent-reach.v1.send", "reserved"),  # the gateway's own API, default prefix
        ("", "no subject"),
    ],
)
def test_a_bad_explicit_subject_is_refused_when_the_agent_is_made(subject: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Agent("agent://w-01", serve=NATS, subject=subject)


def test_a_subject_without_nats_is_refused() -> None:
    with pytest.raises(ValueError, match="serves over NATS"):
        Agent("agent://w-01", serve="http", subject="fleet.w")


@pytest.mark.parametrize(
    ("serve", "env", "servers"),
    [
        (None, {}, ()),
        (None, {"AGENT_REACH_SERVE": ""}, ()),
        (None, {"AGENT_REACH_SERVE": "http"}, ()),
        (None, {"AGENT_REACH_SERVE": NATS}, (NATS,)),
        (
            None,
            {"AGENT_REACH_SERVE": " nats://a:4222, nats://b:4222 ,"},
            ("nats://a:4222", "nats://b:4222"),
        ),
        ("http", {"AGENT_REACH_SERVE": NATS}, ()),  # the argument wins
        ("tls://n.internal:4222", {}, ("tls://n.internal:4222",)),
    ],
)
def test_serve_comes_from_the_argument_then_the_environment_then_http(
    serve: str | None, env: dict[str, str], servers: tuple[str, ...]
) -> None:
    assert nats_servers(serve, env) == servers


@pytest.mark.parametrize("serve", ["http://127.0.0.1:7700", "nats:agents.x", "grpc://x:1"])
def test_a_serve_that_is_neither_http_nor_nats_servers_is_a_config_error(serve: str) -> None:
    with pytest.raises(ConfigError, match="nats://HOST:PORT"):
        nats_servers(serve, {})
    with pytest.raises(ConfigError, match="AGENT_REACH_SERVE"):
        nats_servers(None, {"AGENT_REACH_SERVE": serve})


def test_an_unusable_nats_server_is_refused_when_the_agent_is_made() -> None:
    with pytest.raises(ConfigError, match="unusable NATS server"):
        Agent("agent://w-01", serve="nats://127.0.0.1:0")


def test_the_environment_switches_an_agent_to_nats_when_it_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_REACH_SERVE", NATS)
    agent = Agent("agent://w-01")
    assert (agent.nats_servers, agent.subject) == ((NATS,), "agents.w-01")
    # a mount is served by its app over HTTP: the variable does not concern it
    agent.lifespan("http://127.0.0.1:8000/reach/")
    monkeypatch.delenv("AGENT_REACH_SERVE")
    assert Agent("agent://w-01").nats_servers == ()


def test_the_asgi_mount_is_refused_for_an_agent_made_to_serve_over_nats() -> None:
    agent = Agent("agent://w-01", serve=NATS)
    with pytest.raises(ValueError, match="ASGI mount"):
        agent.lifespan("http://127.0.0.1:8000/reach/")


def test_without_nats_py_serving_over_nats_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "nats", None)  # what an absent package looks like
    with pytest.raises(ConfigError, match=r"pip install 'agent-reach-gateway\[nats\]'"):
        Agent("agent://w-01", serve=NATS)
    assert Agent("agent://w-01", serve="http").nats_servers == ()  # HTTP never needs it


def test_max_inflight_defaults_to_a_few_times_the_workers_and_must_be_positive() -> None:
    assert Agent("agent://w-01", serve=NATS, workers=3).max_inflight == 64  # the floor
    assert Agent("agent://w-01", serve=NATS, workers=20).max_inflight == 80
    assert Agent("agent://w-01", workers=20).max_inflight == 80  # over HTTP the same
    assert Agent("agent://w-01", serve=NATS, max_inflight=1).max_inflight == 1
    with pytest.raises(ValueError, match="max_inflight"):
        Agent("agent://w-01", serve=NATS, max_inflight=0)


def test_an_http_agent_never_imports_nats_py() -> None:
    script = (
        "import sys\n"
        "from agent_reach.sdk import Agent\n"
        "Agent('agent://w-01', serve='http').handle('w.q')(lambda p, c: p)\n"
        "assert 'nats' not in sys.modules, 'nats-py imported for HTTP'\n"
        "Agent('agent://w-01', serve='nats://127.0.0.1:4222')\n"
        "assert 'nats' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
