"""A plain nats-py agent process (no SDK of ours): a responder on one subject, for fault tests.

Run: ``python tests/agents/bus_echo.py --server nats://127.0.0.1:4222 --subject S [--queue Q]``.
It connects (reconnecting forever, 0.1 s apart), subscribes to SUBJECT in the queue group Q,
sends itself one request through the server (a subscription is live at the server only once a
request to it is answered: ``flush()`` does not prove it), and then prints one JSON line
``{"event": "serving", "subject": S, "pid": PID}``. With ``--register-nats PREFIX`` or
``--register-http URL`` and ``--id``/``--intents`` it registers ``nats:SUBJECT`` with a gateway
(over NATS: ``PREFIX.v1.register``; over HTTP: ``URL/v1/register``) before printing that line,
and heartbeats every ``--heartbeat-s`` seconds the same way.

Each request is answered, by a publish to its reply subject with the agent's own headers (never
the request's: nats-py's ``Msg.respond`` would send them back), with
``{"echo": PAYLOAD, "pid": PID, "msg_id": MSG_ID}``. A request is handled in a task of its own
unless ``--serial`` (then one at a time, in the subscription's callback: a consumer that does not
read fast enough, whose backlog past ``--pending-msgs`` nats-py drops as a slow consumer).
``--delay-ms`` (or the payload's ``delay_ms``) delays the answer; the payload's ``pad_bytes``
adds ``"pad"``, that many bytes, to it (a big answer to a small request); past ``--max-inflight``
requests in hand the answer is ``Reach-Status: 503`` at once.

On SIGTERM (or SIGINT) it prints ``{"event": "stopped", "handled": N, "distinct": M, "busy": B,
"slow_consumer": D}`` and exits 0: the requests it answered (N, of M distinct msg_ids: a retry
of the same msg_id counts once in M), those it refused as busy, and the slow-consumer drops
nats-py reported.

Tests start it with :func:`tests.nats_support.start_bus_echo`, which waits for its ``serving``
line with a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any
from urllib import error, request

# --- the agent -------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--subject", required=True)
    parser.add_argument("--queue", default="")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--max-inflight", type=int, default=0, help="0: no bound")
    parser.add_argument("--serial", action="store_true")
    parser.add_argument("--pending-msgs", type=int, default=0, help="0: nats-py's default")
    parser.add_argument("--register-nats", default="", metavar="PREFIX")
    parser.add_argument("--register-http", default="", metavar="URL")
    parser.add_argument("--id", default="")
    parser.add_argument("--intents", default="")
    parser.add_argument("--heartbeat-s", type=float, default=0.0, help="0: none")
    return parser.parse_args(argv)


def _line(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def _agent(args: argparse.Namespace) -> None:
    import nats
    from nats import errors as nats_errors
    from nats.aio.msg import Msg

    pid = os.getpid()
    handled: list[str] = []
    counts = {"busy": 0, "slow_consumer": 0}
    inflight: set[asyncio.Task[None]] = set()

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, nats_errors.SlowConsumerError):
            counts["slow_consumer"] += 1

    nc = await nats.connect(
        args.server,
        name=f"bus-echo-{pid}",
        connect_timeout=2,
        reconnect_time_wait=0.1,  # seconds, used as a float
        max_reconnect_attempts=-1,
        allow_reconnect=True,
        error_cb=on_error,
    )

    async def answer(msg: Msg) -> None:
        try:
            body = json.loads(msg.data)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        payload = body.get("payload", {})
        delay_ms = 0.0 if body.get("probe") else args.delay_ms  # its own probe: at once
        if isinstance(payload, dict) and isinstance(payload.get("delay_ms"), int | float):
            delay_ms = float(payload["delay_ms"])
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)  # the agent's own slowness under test
        msg_id = str(body.get("msg_id", ""))
        reply = {"echo": payload, "pid": pid, "msg_id": msg_id}
        if isinstance(payload, dict) and isinstance(payload.get("pad_bytes"), int):
            reply["pad"] = "p" * payload["pad_bytes"]
        try:
            await nc.publish(
                msg.reply, json.dumps(reply).encode(), headers={"X-Agent-Pid": str(pid)}
            )
        except nats_errors.Error:
            return  # the link is gone: the gateway times out and retries
        if msg_id:
            handled.append(msg_id)

    async def busy(msg: Msg) -> None:
        counts["busy"] += 1
        body = {"ok": False, "error": "busy", "detail": f"over {args.max_inflight} in hand"}
        try:
            await nc.publish(msg.reply, json.dumps(body).encode(), headers={"Reach-Status": "503"})
        except nats_errors.Error:
            return

    async def on_message(msg: Msg) -> None:
        if not msg.reply:
            return
        if args.serial:
            await answer(msg)
            return
        full = args.max_inflight and len(inflight) >= args.max_inflight
        task = asyncio.create_task(busy(msg) if full else answer(msg))
        inflight.add(task)
        task.add_done_callback(inflight.discard)

    options: dict[str, Any] = {"queue": args.queue, "cb": on_message}
    if args.pending_msgs:
        options["pending_msgs_limit"] = args.pending_msgs
    await nc.subscribe(args.subject, **options)
    probe = json.dumps({"probe": True, "msg_id": "", "payload": {}}).encode()
    await nc.request(args.subject, probe, timeout=5)

    async def register(op: str, body: dict[str, Any]) -> None:
        """``op`` with the gateway; OSError or a nats-py error when it is not answered 200."""
        if args.register_nats:
            subject = f"{args.register_nats}.v1.{op}"
            got = await nc.request(subject, json.dumps(body).encode(), timeout=2)
            status = (got.headers or {}).get("Reach-Status")
            if status is not None:
                raise OSError(f"{subject}: {status} {got.data!r}")
        elif args.register_http:
            await asyncio.to_thread(_post, f"{args.register_http}/v1/{op}", body)

    if args.id:
        registration = {
            "endpoint_id": args.id,
            "capabilities": args.intents.split(","),
            "endpoint_url": f"nats:{args.subject}",
        }
        await register("register", registration)

    async def heartbeats() -> None:
        while True:
            await asyncio.sleep(args.heartbeat_s)
            try:
                await register("heartbeat", {"endpoint_id": args.id})
            except (OSError, nats_errors.Error):
                continue  # the next one may pass

    beating = asyncio.create_task(heartbeats()) if args.id and args.heartbeat_s > 0 else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _line(event="serving", subject=args.subject, pid=pid)
    await stop.wait()
    if beating is not None:
        beating.cancel()
    for task in list(inflight):
        task.cancel()
    await asyncio.gather(beating or asyncio.sleep(0), *inflight, return_exceptions=True)
    _line(event="stopped", handled=len(handled), distinct=len(set(handled)), **counts)
    await nc.close()


def _post(url: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    req = request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with request.urlopen(req, timeout=5) as resp:
            resp.read()
    except error.HTTPError as exc:
        raise OSError(f"{url}: {exc.code} {exc.read()!r}") from exc


if __name__ == "__main__":
    asyncio.run(_agent(_parse(sys.argv[1:])))
