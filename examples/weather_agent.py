"""Example agent: answers weather.query and weather.forecast (made-up weather)."""

from __future__ import annotations

import argparse
import hashlib

from agent_reach import logs
from agent_reach.sdk import Agent, ReachContext, Reject

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", default="http://127.0.0.1:7700")
parser.add_argument("--id", default="agent://weather-cn-01")
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()

agent = Agent(
    args.id,
    gateway=args.gateway,
    port=args.port,
    description="Weather for Chinese cities: current conditions and forecasts",
)


def _fake(city: str, date: str) -> dict[str, object]:
    h = int(hashlib.sha256(f"{city}/{date}".encode()).hexdigest(), 16)
    return {
        "city": city,
        "date": date,
        "condition": ["sunny", "cloudy", "rain"][h % 3],
        "temp_c": 5 + h % 20,
    }


@agent.handle("weather.query")
def query(payload: dict[str, str], ctx: ReachContext) -> dict[str, object]:
    if not isinstance(payload, dict) or "city" not in payload:
        raise Reject("payload needs a city", status=422)
    return {**_fake(payload["city"], payload.get("date", "today")), "trace_id": ctx.trace_id}


@agent.handle("weather.forecast")
def forecast(payload: dict[str, object], ctx: ReachContext) -> dict[str, object]:
    if not isinstance(payload, dict) or "city" not in payload:
        raise Reject("payload needs a city", status=422)
    days = payload.get("days", 3)
    if not isinstance(days, int) or not 1 <= days <= 14:
        raise Reject("days must be a whole number from 1 to 14", status=422)
    return {
        "city": payload["city"],
        "days": [_fake(str(payload["city"]), f"+{d}") for d in range(days)],
    }


if __name__ == "__main__":
    logs.configure("INFO")  # JSON lines on stderr, with each request's trace id
    agent.run()
