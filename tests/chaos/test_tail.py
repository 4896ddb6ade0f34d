"""Scenario 11: the tail. One call in 100 is 10x slow (every agent answers in 20 ms, and its
every 100th call of an intent in 200 ms); hedging on (``hedge_after_ms`` in the intent
dictionary, CONTRACT.md v1.1). The goal: the p99.9 at least 5x better than without hedging, for
at most 5 % extra load on the agents.

Both arms run in one load, interleaved: two tags that the same five agents declare, one with
``hedge_after_ms`` and one without, so that they share the machine's noise. The extra load is
what the agents received for the hedged tag over the hedged requests sent, less one.

The goal sits at a bound: a hedge sent after ``h`` answers after ``h + L`` at best (L the normal
latency), so a 10x tail improves at most ``10 L / (h + L)``, which is 5x only for ``h <= L``:
a hedge at or before the median latency, that is on about half the calls. With a hedge after
the normal calls' spread (``h`` past their p99), the extra load is the tail's 1 % and the
p99.9 improves about ``10 L / (h + L)``: what this scenario measures (docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.support import (
    FULL,
    Load,
    bounded,
    chaos_agent,
    errors,
    in_parallel,
    latencies,
    pct,
    pick,
    r3,
    report,
    stats,
    stopping,
)
from tests.support import gateway

PLAIN, HEDGED = "tail.plain", "tail.hedged"
NORMAL_MS, SLOW_MS = 20.0, 200.0
HEDGE_AFTER_MS = 30


@bounded(60, 180)
def test_11_hedging_cuts_the_tail(tmp_path: Path) -> None:
    # smoke: every 20th call slow, so that a few seconds hold enough of the tail to compare
    slow_every, rate, duration = pick((20, 100, 4.0), (100, 200, 60.0))
    intents = tmp_path / "intents.toml"
    intents.write_text(
        f'[[intent]]\ntag = "{PLAIN}"\n\n'
        f'[[intent]]\ntag = "{HEDGED}"\nhedge_after_ms = {HEDGE_AFTER_MS}\n'
    )
    flags = ("--delay-ms", str(NORMAL_MS), "--slow-every", str(slow_every))
    with (
        gateway("--intents", str(intents), "--matcher", "none") as gw,
        stopping([]) as agents,
    ):
        agents += in_parallel(
            lambda i: chaos_agent(
                gw.url,
                f"agent://tail-{i:02d}",
                *flags,
                "--slow-ms",
                str(SLOW_MS),
                intents=f"{PLAIN},{HEDGED}",
            ),
            5,
        )
        bodies = [
            {"intent": tag, "timeout_ms": 8000, "payload": {}, "_kind": tag}
            for tag in (PLAIN, HEDGED)
        ]
        with Load(gw.url, bodies, rate=rate, duration=duration) as load:
            pass
        received = sum(stats(agent).get(f"received:{HEDGED}", 0) for agent in agents)
    results = load.results
    plain = [s for s in results if s.kind == PLAIN]
    hedged = [s for s in results if s.kind == HEDGED]
    # the smoke's 200 calls a tag hold no p99.9, and ~10 slow ones: its p99 is the second
    # slowest call, so two hedges that met a slow agent too (whose every 20th call is slow,
    # and the agents' counts go in step) failed it once in CI (6 of ~10 hedges won). Its p97,
    # the 6th slowest, is still in the slow calls' 5 % without hedging
    q = 99.9 if FULL else 97.0
    tail_plain, tail_hedged = pct(latencies(plain), q), pct(latencies(hedged), q)
    better = tail_plain / tail_hedged
    extra = received / len(hedged) - 1
    failed = errors(results)
    late = sum(s.late for s in results)
    hedges_won = sum(1 for s in hedged if len(s.attempts) > 1 and s.attempts[-1][0] == s.endpoint)
    met = better >= 5 and extra <= 0.05 and not failed
    report(
        "11",
        f"tail: 1 in {slow_every} calls {SLOW_MS / NORMAL_MS:g}x slow, "
        f"hedge_after_ms {HEDGE_AFTER_MS}",
        {
            "requests_per_tag": len(hedged),
            "percentile": q,
            "tail_no_hedging_ms": r3(tail_plain),
            "tail_hedging_ms": r3(tail_hedged),
            "times_better": r3(better),
            "p50_no_hedging_ms": r3(pct(latencies(plain), 50)),
            "p50_hedging_ms": r3(pct(latencies(hedged), 50)),
            "extra_load": r3(extra),
            "hedged_requests_with_2_attempts": hedges_won,
            "client_errors": sum(failed.values()),
            "late_answers": late,
        },
        {"times_better": ">= 5", "extra_load": "<= 0.05"},
        met,
    )
    assert not failed, failed
    assert late == 0
    # what hedging must do whatever the scale: halve the slow calls' wait at least, for little
    # more than the slow calls' share of extra attempts
    assert better >= 2.0, (tail_plain, tail_hedged)
    assert extra <= 2.5 / slow_every + 0.02, extra
    if FULL:  # the goal (at its bound: the module docstring)
        assert met, (better, extra)
