"""The trivial agent of the benchmarks over NATS: answers every request with the HTTP one's body.

The NATS twin of ``trivial_agent.py``: it subscribes to ``--subject`` on ``--nats`` (nats-py,
on uvloop when installed) and answers each request by publishing to its reply subject the same
small JSON body as the HTTP agent (``{"ok":true,"answer":"pong"}``), with no headers (a 200:
``Reach-Status`` only when not 200, CONTRACT.md "NATS transport"). Each request is handled in
its own task, as the SDK's and the gateway's responders (NatsLink) do, so its cost per request
is the one a real asyncio agent pays.

Before it says it is ready it proves its subscription live at the server (a request to itself
answered, bounded: ``flush()`` does not prove it), then registers ``nats:SUBJECT`` over HTTP
with every ``--register`` gateway URL and prints one line::

    trivial nats agent serving nats:SUBJECT

It serves until SIGINT/SIGTERM and sends no heartbeats: start the gateway with a heartbeat
interval longer than the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import nats
from nats.aio.msg import Msg

from trivial_agent import BODY, agent_args, register, run

READY_TIMEOUT_S = 10.0


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    nc = await nats.connect(args.nats, connect_timeout=2, allow_reconnect=False, name=args.id)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(msg: Msg) -> None:
        await nc.publish(msg.reply, BODY)

    async def take(msg: Msg) -> None:
        if msg.reply:  # a publish, not a request: nobody waits for an answer
            task = loop.create_task(answer(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    sub = await nc.subscribe(args.subject, cb=take)
    await nc.request(args.subject, b"{}", timeout=READY_TIMEOUT_S)  # live at the server
    url = f"nats:{args.subject}"
    for gateway in args.register:
        await loop.run_in_executor(None, register, gateway, args.id, args.intent, url)
    print(f"trivial nats agent serving {url}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await sub.unsubscribe()
        await nc.close()


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats", required=True, metavar="URL", help="nats://HOST:PORT")
    parser.add_argument("--subject", required=True, help="the subject to serve")
    agent_args(
        parser,
        "agent://bench-nats-agent",
        "gateway to register nats:SUBJECT with, over HTTP (repeatable)",
    )
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
