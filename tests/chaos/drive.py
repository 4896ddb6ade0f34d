"""The load driver's process (started by :class:`tests.chaos.support.Load`): a process of its own,
so that nothing the test does meanwhile (fuzzing, opening sockets, polling) holds up its event
loop and shows in the latencies it measures.

``drive.py SPEC RESULTS``: SPEC is a JSON file ``{"url", "bodies", "duration", "rate" | "callers",
"max_outstanding"}``; request i sends ``bodies[i % len(bodies)]`` with ``{i}`` in its string
values replaced by i (``_kind`` labels it and is not sent). It prints ``started T`` (T: the
monotonic clock, which every process of the machine shares) once it sends, after one unrecorded
``GET /healthz`` (:meth:`Driver.warm`), and writes a JSON object ``{"skipped", "rows"}`` to
RESULTS when it ends, one row a request: ``[start, end, status, error, endpoint, attempts,
timeout_ms, priority, kind, gateway_ms]`` (gateway_ms: the answer's ``latency_ms``, or null).
SIGTERM ends it early (the requests in flight are still waited for).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

import aiohttp


def fill(value: Any, i: int) -> Any:
    if isinstance(value, str):
        return value.replace("{i}", str(i))
    if isinstance(value, dict):
        return {k: fill(v, i) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, i) for v in value]
    return value


class Driver:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.url = spec["url"]
        self.bodies = spec["bodies"]
        self.duration = float(spec["duration"])
        self.rate: float | None = spec.get("rate")
        self.callers = int(spec.get("callers") or 0)
        self.max_outstanding = int(spec.get("max_outstanding", 2000))
        self.rows: list[list[Any]] = []
        self.skipped = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.stop.set)
        connector = aiohttp.TCPConnector(limit=self.max_outstanding)
        async with aiohttp.ClientSession(connector=connector) as session:
            await self.warm(session)
            started = time.monotonic()
            print(f"started {started!r}", flush=True)
            end = started + self.duration
            if self.rate is not None:
                await self.open_loop(session, started, end)
            else:
                await asyncio.gather(*(self.caller(session, end) for _ in range(self.callers)))

    async def warm(self, session: aiohttp.ClientSession) -> None:
        """One ``GET /healthz`` before the first recorded request, unrecorded: it opens a
        keep-alive connection and runs the client's first-call paths, so that the first
        request measured is not the driver's own cold start (a connect and aiohttp's first
        request: 2-4 ms on the 2-core machine, the worst sample of a quiet run). A gateway
        that does not answer (down, or frozen at the start of a fault scenario) delays the
        start by 1 s at most, and the load goes on without the warm-up."""
        base = self.url.rsplit("/v1/", 1)[0]
        try:
            async with session.get(
                f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            pass

    async def open_loop(self, session: aiohttp.ClientSession, started: float, end: float) -> None:
        rate = self.rate
        assert rate is not None
        pending: set[asyncio.Task[None]] = set()
        i = 0
        while not self.stop.is_set():
            due = started + i / rate
            if due >= end:
                break
            now = time.monotonic()
            if due > now:
                try:  # wakes at once on SIGTERM
                    await asyncio.wait_for(self.stop.wait(), due - now)
                    break
                except TimeoutError:
                    pass
            if len(pending) >= self.max_outstanding:
                self.skipped += 1
            else:
                task = asyncio.create_task(self.one(session, i))
                pending.add(task)
                task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.gather(*pending)

    async def caller(self, session: aiohttp.ClientSession, end: float) -> None:
        i = 0
        while not self.stop.is_set() and time.monotonic() < end:
            await self.one(session, i)
            i += 1

    async def one(self, session: aiohttp.ClientSession, i: int) -> None:
        body = fill(self.bodies[i % len(self.bodies)], i)
        kind = str(body.pop("_kind", ""))
        timeout_ms = float(body.get("timeout_ms", 8000))
        start = time.monotonic()
        status, answer = 0, {}
        try:
            async with session.post(
                self.url,
                data=json.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_ms / 1000 + 10),
            ) as resp:
                raw = await resp.read()
                status = resp.status
            answer = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            answer = {"error": f"client: {exc!r}"}
        end = time.monotonic()
        if not isinstance(answer, dict):
            answer = {"error": f"client: not an object: {str(answer)[:100]}"}
        # the gateway's own time, from the request's last byte read to its answer
        gateway_ms = answer.get("latency_ms")
        if isinstance(gateway_ms, bool) or not isinstance(gateway_ms, int | float):
            gateway_ms = None
        attempts = [
            [str(a.get("endpoint_id", "")), str(a.get("outcome", ""))]
            for a in (answer.get("attempts") or [])
            if isinstance(a, dict)
        ]
        self.rows.append(
            [
                start,
                end,
                status,
                "" if status == 200 else str(answer.get("error", "")),
                str(answer.get("endpoint_id") or ""),
                attempts,
                timeout_ms,
                str(body.get("priority", "normal")),
                kind,
                gateway_ms,
            ]
        )


def main() -> None:
    with open(sys.argv[1]) as f:
        driver = Driver(json.load(f))
    try:
        import uvloop
    except ImportError:
        asyncio.run(driver.run())
    else:
        uvloop.run(driver.run())
    with open(sys.argv[2], "w") as f:
        json.dump({"skipped": driver.skipped, "rows": driver.rows}, f)


if __name__ == "__main__":
    main()
