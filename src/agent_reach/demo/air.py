"""Demo agent: ``air.query`` (a made-up, deterministic air quality index for a city).

In the demo it serves over NATS (the stack starts it with ``AGENT_REACH_SERVE`` set): it opens
no inbound port, subscribes to its subject and registers ``nats:SUBJECT``; callers reach it
through the gateway exactly as they reach the HTTP agents. Without that variable it serves over
HTTP like the others.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agent_reach.demo._cli import main
from agent_reach.sdk import Agent, ReachContext, Reject

__all__ = ["build"]

_LEVELS = ((50, "good"), (100, "moderate"), (150, "unhealthy for sensitive groups"))


def _aqi(city: str, date: str) -> dict[str, Any]:
    h = int(hashlib.sha256(f"aqi/{city}/{date}".encode()).hexdigest(), 16)
    aqi = 20 + h % 160
    level = next((name for bound, name in _LEVELS if aqi <= bound), "unhealthy")
    return {"city": city, "date": date, "aqi": aqi, "level": level}


def build(gateway: str | None, endpoint_id: str = "agent://air-nats-01", port: int = 0) -> Agent:
    """The air quality agent, not yet started (its transport: ``$AGENT_REACH_SERVE``)."""
    agent = Agent(
        endpoint_id,
        gateway=gateway,
        port=port,
        description="Air quality for Chinese cities (AQI), reached over NATS in the demo",
    )

    @agent.handle("air.query")
    def query(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("city"), str):
            raise Reject("payload needs a city (text)", status=422)
        air = _aqi(payload["city"], str(payload.get("date", "today")))
        return {**air, "trace_id": ctx.trace_id}

    return agent


if __name__ == "__main__":
    main(build, "agent://air-nats-01")
