"""Settings: defaults derived from the heartbeat interval, and refusals that name the flag."""

from __future__ import annotations

from typing import Any

import pytest

from agent_reach.errors import ConfigError
from agent_reach.settings import GatewaySettings, gateway_url, gateway_urls


def test_thresholds_default_to_1_2_3_intervals() -> None:
    t = GatewaySettings(heartbeat_interval=4.0).thresholds
    assert (t.degraded_after, t.suspect_after, t.down_after) == (4.0, 8.0, 12.0)


def test_explicit_thresholds_win() -> None:
    t = GatewaySettings(heartbeat_interval=4.0, suspect_after=5.0).thresholds
    assert (t.degraded_after, t.suspect_after, t.down_after) == (4.0, 5.0, 12.0)


@pytest.mark.parametrize(
    ("settings", "purge"),
    [
        (GatewaySettings(), 3600.0),
        (GatewaySettings(heartbeat_interval=3600.0), 10_800.0),  # never before down
        (GatewaySettings(heartbeat_interval=1.0, purge_after=5.0), 5.0),
    ],
)
def test_purge_time(settings: GatewaySettings, purge: float) -> None:
    settings.check()
    assert settings.purge_after_s == purge


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (GatewaySettings(heartbeat_interval=10.0, purge_after=20.0), "purge-after"),
        (GatewaySettings(degraded_after=30.0, suspect_after=10.0), "degraded-after"),
        (GatewaySettings(confidence_threshold=0.0), "confidence-threshold"),
        (GatewaySettings(port=70_000), "port"),
        (GatewaySettings(max_body_bytes=10), "max-body-bytes"),
    ],
)
def test_refusals_name_the_setting(settings: GatewaySettings, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings.check()


# --- the gateway URLs of clients and agents ----------------------------------------------------

NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(
    ("given", "env", "urls"),
    [
        (None, NO_ENV, ("http://127.0.0.1:7700",)),
        ("", NO_ENV, ("http://127.0.0.1:7700",)),
        ([], NO_ENV, ("http://127.0.0.1:7700",)),
        ("http://a:1/", NO_ENV, ("http://a:1",)),
        ("http://a:1, https://b/ ,http://c:3", NO_ENV, ("http://a:1", "https://b", "http://c:3")),
        ("http://a:1,,http://b:2,", NO_ENV, ("http://a:1", "http://b:2")),  # empty items
        (["http://a:1", "http://b:2/"], NO_ENV, ("http://a:1", "http://b:2")),
        (
            ("http://a:1,http://b:2", "http://c:3"),
            NO_ENV,
            ("http://a:1", "http://b:2", "http://c:3"),
        ),
        ("http://a:1,http://b:2,http://a:1/", NO_ENV, ("http://a:1", "http://b:2")),  # repeats
        (None, {"AGENT_REACH_GATEWAY": "http://x:1,http://y:2"}, ("http://x:1", "http://y:2")),
        (" , ", {"AGENT_REACH_GATEWAY": "http://x:1"}, ("http://x:1",)),  # nothing given
        ("http://a:1", {"AGENT_REACH_GATEWAY": "http://x:1"}, ("http://a:1",)),  # given wins
        (None, {"AGENT_REACH_GATEWAY": ""}, ("http://127.0.0.1:7700",)),
    ],
)
def test_gateway_urls(given: Any, env: dict[str, str], urls: tuple[str, ...]) -> None:
    assert gateway_urls(given, env) == urls
    if given is None or isinstance(given, str):
        assert gateway_url(given, env) == urls[0]  # single-URL callers get the first


def test_gateway_url_is_the_first_of_a_list() -> None:
    env = {"AGENT_REACH_GATEWAY": "http://x:1/, http://y:2"}
    assert gateway_url(None, env) == "http://x:1"
    assert gateway_url("http://a:1,http://b:2", NO_ENV) == "http://a:1"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("ftp://a:1", "must start with http:// or https://"),
        ("a:1", "must start with http:// or https://"),
        ("http://a:1,b:2", "got 'b:2'"),  # each item is checked, and named
        (["http://a:1", "nats://b"], "got 'nats://b'"),
        ("http://", "has no host"),
        ("http://:7700", "has no host"),
        ("http://a:99999", "not a valid URL"),
        ("http://a:port", "not a valid URL"),
    ],
)
def test_gateway_urls_refuse_what_is_not_an_http_url(given: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gateway_urls(given, NO_ENV)


def test_an_unusable_environment_variable_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="no gateway URL"):
        gateway_urls(None, {"AGENT_REACH_GATEWAY": " , "})
    with pytest.raises(ConfigError, match="got 'localhost:7700'"):
        gateway_urls(None, {"AGENT_REACH_GATEWAY": "http://a:1,localhost:7700"})


@pytest.mark.parametrize(
    ("nats", "insecure", "refused"),
    [
        ("nats://127.0.0.1:4222", False, False),
        ("nats://localhost:4222,nats://[::1]:4222", False, False),
        ("nats://10.0.0.5:4222", False, True),  # any client of that system could register
        ("nats://127.0.0.1:4222,nats://nats.example:4222", False, True),
        ("nats://u:secret@10.0.0.5:4222", True, False),  # the risk accepted
    ],
)
def test_open_mode_over_nats_wants_a_loopback_server_or_the_insecure_flag(
    nats: str, insecure: bool, refused: bool
) -> None:
    settings = GatewaySettings(nats=nats, insecure_open_mode=insecure)
    if not refused:
        settings.check()
        return
    with pytest.raises(ConfigError, match="open mode over NATS") as caught:
        settings.check()
    assert "secret" not in caught.value.detail
