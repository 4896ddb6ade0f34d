"""Demo agent: ``weather.query`` and ``weather.forecast`` (made-up, deterministic weather)."""

from __future__ import annotations

import hashlib
from typing import Any

from agent_reach.demo._cli import main
from agent_reach.sdk import Agent, ReachContext, Reject

__all__ = ["build"]


def _fake(city: str, date: str) -> dict[str, Any]:
    h = int(hashlib.sha256(f"{city}/{date}".encode()).hexdigest(), 16)
    return {
        "city": city,
        "date": date,
        "condition": ["sunny", "cloudy", "rain"][h % 3],
        "temp_c": 5 + h % 20,
    }


def _city(payload: Any) -> str:
    if not isinstance(payload, dict) or not isinstance(payload.get("city"), str):
        raise Reject("payload needs a city (text)", status=422)
    return str(payload["city"])


def build(gateway: str | None, endpoint_id: str = "agent://weather-cn-01", port: int = 0) -> Agent:
    """The weather agent, not yet started."""
    agent = Agent(
        endpoint_id,
        gateway=gateway,
        port=port,
        description="Weather for Chinese cities: current conditions and forecasts",
    )

    @agent.handle("weather.query")
    def query(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        weather = _fake(_city(payload), str(payload.get("date", "today")))
        return {**weather, "trace_id": ctx.trace_id}

    @agent.handle("weather.forecast")
    def forecast(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        city = _city(payload)
        days = payload.get("days", 3)
        if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= 14:
            raise Reject("days must be a whole number from 1 to 14", status=422)
        return {"city": city, "days": [_fake(city, f"+{d}") for d in range(days)]}

    return agent


if __name__ == "__main__":
    main(build, "agent://weather-cn-01")
