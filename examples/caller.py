"""A caller: reach the demo agents of `make run` with the client SDK, async and sync.

python examples/caller.py [--gateway URL]
"""

from __future__ import annotations

import argparse
import asyncio

from agent_reach import NoCapableAgent, ReachClient, SyncReachClient


async def main(gateway: str | None) -> None:
    async with ReachClient(gateway, sender="agent://caller-example") as client:
        # three at once over one pooled session, each with its own 3 s deadline
        replies = await asyncio.gather(
            *(
                client.send("weather.query", {"city": city}, timeout_ms=3000)
                for city in ("成都", "北京", "上海")
            )
        )
        for reply in replies:
            print(reply.result["city"], reply.result["condition"], "via", reply.endpoint_id)

        try:
            await client.send("unknown.action")
        except NoCapableAgent as exc:  # refused rather than misdelivered
            print("refused:", exc.code, "trace", exc.trace_id)

        route = await client.explain("schedule.plan")
        print("schedule.plan would go to", route.chosen, "per-try", route.per_try_timeout_ms, "ms")


def sync_main(gateway: str | None) -> None:
    with SyncReachClient(gateway) as client:
        reply = client.send("schedule.plan", {"task": "tea with friends", "city": "成都"})
        print("scheduler:", reply.result["hops"], "trace", reply.trace_id)
        for event in client.trace(reply.trace_id).events:
            what = event.get("intent") or event.get("endpoint_id") or event.get("chosen") or ""
            print("  ", event["kind"], what, event.get("outcome", ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", default=None, help="[$AGENT_REACH_GATEWAY or :7700]")
    args = parser.parse_args()
    asyncio.run(main(args.gateway))
    sync_main(args.gateway)
