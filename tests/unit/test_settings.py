"""Settings: defaults derived from the heartbeat interval, and refusals that name the flag."""

from __future__ import annotations

import pytest

from agent_reach.settings import GatewaySettings


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
    with pytest.raises(ValueError, match=message):
        settings.check()
