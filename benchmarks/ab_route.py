"""A/B of the exact path's route decision between two trees, run alternately: each tree's own
benchmarks/route_bench.py against its own src (PYTHONPATH), on CPU 0.

    git worktree add /tmp/work/old 64019cf
    .venv/bin/python benchmarks/ab_route.py 3 --before /tmp/work/old

Prints each run, then the medians (min-max) and the after/before ratio taken run by run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARGS = [
    "--runs", "1", "--endpoints", "100000", "--calls", "100000", "--cold-calls", "200",
    "--seed-calls", "5", "--profile", "never",
]  # fmt: skip


def one(tree: Path) -> tuple[float, float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = ["taskset", "-c", "0", sys.executable, str(tree / "benchmarks/route_bench.py"), *ARGS]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=tree / "benchmarks", timeout=600,
        check=True,
    )  # fmt: skip
    run = json.loads(done.stdout)["runs"][0]
    return run["warm_p50_ns"], run["warm_p99_ns"], run["warm_mean_ns"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    parser.add_argument("--before", type=Path, required=True, help="the other tree")
    parser.add_argument("--after", type=Path, default=HERE.parent, help="default: this tree")
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    out: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            out[name].append(one(trees[name]))
            print(name, *out[name][-1], flush=True)
    for name, rows in out.items():
        p50, p99, mean = ([x[i] / 1000 for x in rows] for i in range(3))
        print(
            f"{name} ({trees[name]}): warm p50 {statistics.median(p50):.2f} µs "
            f"({min(p50):.2f}-{max(p50):.2f}), p99 {statistics.median(p99):.2f} µs, "
            f"mean {statistics.median(mean):.2f} µs"
        )
    ratios = [a[0] / b[0] for a, b in zip(out["after"], out["before"], strict=True)]
    print(
        f"after/before p50, run by run: median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
