"""Instructions per request of the gateway, counted by valgrind (callgrind): a CPU figure that
does not move with the machine's noise, for A/B comparisons of code changes.

req/s and CPU seconds per request move by 20-50 % between runs of the same build on a shared
2-core VM (benchmarks/RESULTS.md); the number of instructions the gateway executes for a fixed
number of requests does not (the same binary, inputs and environment give the same count, to
within a fraction of a per cent). It is not time: a cache miss or a system call counts as its
instructions only, and the kernel's share (the socket calls) is not counted at all. So it
measures what Python code changes move, beside (never instead of) the wall-clock ladder.

For each tree (``--src DIR``: a checkout's ``src``; default this one) and each baseline asked
for (``--lean``: benchmarks/lean_forwarder.py; ``--seed``: the seed-style gateway), for each
route: the server runs under ``valgrind --tool=callgrind --instr-atstart=no`` (its start
uninstrumented), with a trivial agent (not under valgrind) registered; ``--warmup`` requests
are sent, then instrumentation is switched on (``callgrind_control -i on``), ``--requests``
requests are sent over ``--conns`` keep-alive connections, each waiting for its answer, and
the counts are dumped. The figure is the dump's total instructions (Ir) over the requests.
Token mode (``--tokens``) adds the client token to every send and signs every delivery, as
the ladder's token rung.

    python benchmarks/icount.py --src /tmp/work/old/src --src src --routes send heartbeat
    python benchmarks/icount.py --lean --seed --routes send heartbeat   # beside the baselines

(needs valgrind; about a minute per tree and route at the defaults.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import (
    AGENT_ID,
    INTENT,
    PY,
    SEND_BODY,
    Child,
    free_port,
    register_with_token,
    start,
    token_mode,
    wait_http,
)

HERE = Path(__file__).resolve().parent
HEARTBEAT_BODY = json.dumps({"endpoint_id": AGENT_ID})
ROUTES = {"send": ("/v1/send", SEND_BODY), "heartbeat": ("/v1/heartbeat", HEARTBEAT_BODY)}


async def _load(port: int, path: str, body: str, n: int, conns: int, token: str | None) -> int:
    """``n`` POSTs over ``conns`` keep-alive connections, one in flight on each; the number
    answered 200 (anything else is counted out and reported by the caller)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    raw = body.encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(raw)}\r\n\r\n"
    ).encode() + raw
    ok = 0

    async def one(count: int) -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(count):
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                ok += head.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()

    shares = [n // conns + (i < n % conns) for i in range(conns)]
    await asyncio.wait_for(asyncio.gather(*(one(s) for s in shares if s)), timeout=600)
    return ok


def _callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def _total_ir(out: Path) -> int:
    """The summed ``Ir`` of every dump callgrind wrote for the process (``out`` and its parts)."""
    total = 0
    for part in out.parent.glob(out.name + "*"):
        for line in part.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
                break
    return total


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Until ``port`` accepts connections (bounded; fails at once if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)  # polling interval, not a settle delay
    raise RuntimeError(f"nothing listened on port {port} within {timeout} s")


BASELINES = {
    "lean": [PY, str(HERE / "lean_forwarder.py")],
    "seed": [PY, str(HERE / "seed_gateway.py")],
}


def measure(src: str, route: str, args: argparse.Namespace, tmp: Path) -> float:
    """Instructions per request of the gateway from ``src`` (or the baseline ``lean`` or
    ``seed``) on ``route``."""
    path, body = ROUTES[route]
    port = free_port()
    out = tmp / f"cg.{abs(hash((src, route)))}.{time.monotonic_ns()}"
    flags: list[str] = []
    token = None
    if args.tokens:
        tm = token_mode(tmp / f"tm{time.monotonic_ns()}")
        flags, token = tm.flags, tm.client
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if src in BASELINES:
        cmd += [*BASELINES[src], "--port", str(port), "--heartbeat-interval", "3600"]
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    else:
        cmd += [PY, "-m", "agent_reach", "serve", "--port", str(port), "--log-level", "WARNING"]
        cmd += ["--heartbeat-interval", "3600", *flags]
    children: list[Child] = []
    try:
        gateway = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp
        )
        url = f"http://127.0.0.1:{port}"
        if src in BASELINES:
            _wait_port(port, gateway)
        else:
            wait_http(url + "/healthz", timeout=300)
        agent_cmd = [PY, str(HERE / "trivial_agent.py"), "--id", AGENT_ID, "--intent", INTENT]
        if token is None:
            agent_cmd += ["--register", url]
        agent = start("icount-agent", agent_cmd, None)
        children.append(agent)
        agent.url = agent.wait_line(r"listening on (http://\S+)", timeout=60)
        if args.tokens:
            register_with_token(url, tm.enroll, AGENT_ID, [INTENT], agent.url)
        load = (port, path, body)
        asyncio.run(_load(*load, args.warmup, args.conns, token))
        _callgrind_control("-i", "on", str(gateway.pid))
        ok = asyncio.run(_load(*load, args.requests, args.conns, token))
        _callgrind_control("-d", str(gateway.pid))
        _callgrind_control("-i", "off", str(gateway.pid))
        if ok != args.requests:
            raise RuntimeError(f"{src} {route}: {args.requests - ok} answers were not 200")
        return _total_ir(out) / args.requests
    finally:
        for child in children:
            child.stop()
        if gateway.poll() is None:
            gateway.terminate()
            gateway.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", help="a tree's src directory (repeatable)")
    parser.add_argument("--routes", nargs="+", choices=sorted(ROUTES), default=["send"])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--tokens", action="store_true", help="token mode")
    parser.add_argument("--lean", action="store_true", help="also the lean forwarder")
    parser.add_argument("--seed", action="store_true", help="also the seed-style gateway")
    parser.add_argument(
        "--keep", metavar="DIR", help="keep callgrind's files here (for callgrind_annotate)"
    )
    args = parser.parse_args()
    srcs = args.src or [str(HERE.parent / "src")]
    srcs += [name for name in BASELINES if getattr(args, name)]
    if args.tokens and len(srcs) > len(args.src or [None]):
        parser.error("--tokens is Agent-Reach's token mode: not with --lean or --seed")
    results: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="icount-") as tmp:
        where = Path(args.keep) if args.keep else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        for route in args.routes:
            for src in srcs:
                results[src, route] = measure(src, route, args, where)
                print(
                    f"{route:9} {src}: {results[src, route] / 1000:8.1f} k instructions/request",
                    flush=True,
                )
    if len(srcs) > 1:
        for route in args.routes:
            base = results[srcs[0], route]
            for src in srcs[1:]:
                print(f"{route:9} {src} / {srcs[0]}: {results[src, route] / base:.3f}x")


if __name__ == "__main__":
    sys.exit(main())
