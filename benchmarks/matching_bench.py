"""What matching costs a request: exact, alias and fallback sends through one gateway, at one
caller, measured in interleaved rounds (issue 12).

    .venv/bin/python benchmarks/matching_bench.py --rounds 5 --calls 200

One gateway (the demo's dictionary, ``--matcher semantic``; pinned to CPU 0 with 2+ CPUs) and
the trivial agent (CPU 1), registered for ``weather.query``. Each round sends, one at a time
over one keep-alive connection, ``--calls`` requests of each kind, in rotating order:

- ``exact``: ``{"intent": "weather.query"}``;
- ``alias``: ``{"intent": "weather.lookup"}`` (the dictionary's alias);
- ``fallback cached``: ``{"intent_text": ...}``, one sentence asked again and again (the
  query's embedding and the lookup's answer come from the caches);
- ``fallback fresh``: ``{"intent_text": ...}``, a sentence never asked before (one query
  embedding: the model's work per new sentence).

Reported: p50 and p99 per kind (median over rounds, min-max), the added p50 over exact, the
gateway's CPU per request, and the gateway's RSS once loaded. The fresh sentences are one of
the dictionary's examples made unique by a number, so that they cost an embedding each and still
match (the point is the cost of a match, not the matcher's coverage: docs/matching.md).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

from harness import HERE, PY, Child, jiffies, machine, med, source_revision, start, wait_http

KINDS = ("exact", "alias", "fallback cached", "fallback fresh")
CACHED = "what is the weather in Chengdu tomorrow"
FRESH = "what is the weather in Chengdu tomorrow, asked {n} times"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
REFUSED: dict[str, int] = {}  # fallback sends refused below the threshold, by kind


def body(kind: str, n: int) -> bytes:
    if kind == "exact":
        payload: dict[str, object] = {"intent": "weather.query"}
    elif kind == "alias":
        payload = {"intent": "weather.lookup"}
    elif kind == "fallback cached":
        payload = {"intent_text": CACHED}
    else:
        payload = {"intent_text": FRESH.format(n=n)}
    payload["payload"] = {"city": "Chengdu"}
    return json.dumps(payload).encode()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_kind(conn: http.client.HTTPConnection, kind: str, calls: int, start_n: int) -> list[float]:
    out = []
    for i in range(calls):
        data = body(kind, start_n + i)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/send", data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        out.append((time.perf_counter() - t0) * 1000.0)
        if kind.startswith("fallback") and resp.status == 404:
            # refused below the threshold: the same lookup's cost, counted apart
            if answer.get("error") != "no_capable_agent":
                raise SystemExit(f"{kind}: {resp.status} {answer}")
            REFUSED[kind] = REFUSED.get(kind, 0) + 1
            continue
        if resp.status != 200:
            raise SystemExit(f"{kind}: {resp.status} {answer}")
        if kind.startswith("fallback") and answer["match"]["method"] != "semantic":
            raise SystemExit(f"{kind}: matched {answer['match']}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    two = (os.cpu_count() or 1) >= 2
    dictionary = HERE.parent / "src" / "agent_reach" / "demo" / "intents.toml"
    gw = start(
        "matching-gateway",
        [
            PY,
            "-m",
            "agent_reach",
            "serve",
            "--port",
            "0",
            "--log-level",
            "WARNING",
            "--heartbeat-interval",
            "3600",
            "--intents",
            str(dictionary),
            "--matcher",
            "semantic",
        ],
        0 if two else None,
    )
    children: list[Child] = [gw]
    try:
        gw.url = gw.wait_line(r"listening on (http://\S+)")
        wait_http(gw.url + "/healthz")
        agent = start(
            "matching-agent",
            [
                PY,
                str(HERE / "trivial_agent.py"),
                "--id",
                "agent://bench-weather",
                "--intent",
                "weather.query",
                "--register",
                gw.url,
            ],
            1 if two else None,
        )
        children.append(agent)
        agent.wait_line(r"listening on (http://\S+)")
        host, port = gw.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        for kind in KINDS:  # warm-up: pools, code paths, the cached sentence
            one_kind(conn, kind, 20, 10**6)
        rss = rss_mb(gw.pid)
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
        fresh_n = 0
        for r in range(args.rounds):
            order = KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]
            for kind in order:
                before = jiffies(gw.pid)
                ms = one_kind(conn, kind, args.calls, fresh_n)
                fresh_n += args.calls
                cpu_ms = (jiffies(gw.pid) - before) * TICK_S * 1000.0
                ms.sort()
                runs[kind].append(
                    {
                        "p50": statistics.median(ms),
                        "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
                        "cpu_us": cpu_ms * 1000.0 / args.calls,
                    }
                )
        conn.close()
    finally:
        for child in reversed(children):
            child.stop()

    def fmt(values: list[float], digits: int = 2) -> str:
        m = med(values)
        return f"{m['median']:.{digits}f} ({m['min']:.{digits}f}-{m['max']:.{digits}f})"

    exact_p50 = [x["p50"] for x in runs["exact"]]
    print(f"matching_bench: {source_revision()}, {machine()}, {args.rounds} rounds x {args.calls}")
    print(f"gateway RSS with the model loaded: {rss:.0f} MB")
    print(f"fallback sends refused below the threshold (their cost counted the same): {REFUSED}")
    print("| kind | p50 ms | p99 ms | added p50 over exact, ms | gateway CPU per request, µs |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        rows = runs[kind]
        added = [x["p50"] - e for x, e in zip(rows, exact_p50, strict=True)]
        print(
            f"| {kind} | {fmt([x['p50'] for x in rows])} | {fmt([x['p99'] for x in rows])} | "
            f"{fmt(added)} | {fmt([x['cpu_us'] for x in rows], 0)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
