"""Demo agent: ``schedule.plan`` reaches two other agents through the gateway.

It asks ``weather.query`` for the day, then files a ``note.create`` (with an umbrella when rain is
forecast). Both onward reaches go through the gateway with this request's trace id and this agent
as sender, and within what is left of this request's deadline, so one trace shows all three hops.
"""

from __future__ import annotations

from typing import Any

from agent_reach.demo._cli import main
from agent_reach.errors import AgentReachError
from agent_reach.sdk import Agent, ReachContext, Reject

__all__ = ["build"]


def build(gateway: str | None, endpoint_id: str = "agent://scheduler-01", port: int = 0) -> Agent:
    """The scheduler agent, not yet started."""
    agent = Agent(
        endpoint_id,
        gateway=gateway,
        port=port,
        description="Plans a task for a day: checks the weather, files a note",
    )

    @agent.handle("schedule.plan")
    async def plan(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise Reject("payload needs a task (text), and a city", status=422)
        city, date = payload.get("city", "成都"), payload.get("date", "today")
        try:
            weather = await ctx.reach("weather.query", {"city": city, "date": date})
            text = payload["task"]
            if weather.result.get("condition") == "rain":
                text += " (take an umbrella)"
            note = await ctx.reach("note.create", {"title": f"{date} {city}", "text": text})
        except AgentReachError as exc:  # a ReachError, or a refusal of the gateway (token mode)
            # 424 (not retried): running this plan again would fail on the same hop, and the
            # onward reach already had its own retries within the shared deadline
            raise Reject(f"onward reach failed: {exc.detail}", status=424, code=exc.code) from exc
        return {
            "weather": weather.result,
            "note": note.result,
            "hops": [weather.endpoint_id, note.endpoint_id],
            "trace_id": ctx.trace_id,
        }

    return agent


if __name__ == "__main__":
    main(build, "agent://scheduler-01")
