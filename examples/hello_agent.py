"""An agent in 15 lines: `python examples/hello_agent.py` next to a running gateway."""

from agent_reach.observability import logs
from agent_reach.sdk import Agent, ReachContext

agent = Agent("agent://hello-01", description="Says hello")  # gateway: $AGENT_REACH_GATEWAY


@agent.handle("greeting.say")
def say(payload: dict[str, str], ctx: ReachContext) -> dict[str, str]:
    return {"text": f"hello, {payload.get('name', 'world')}", "trace_id": ctx.trace_id}


logs.configure("INFO")  # JSON log lines on stderr, each with its request's trace id
agent.run()  # serves, registers, heartbeats on its own thread; deregisters on Ctrl-C
