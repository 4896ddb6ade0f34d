#!/bin/bash
# A/B of POST /v1/send through the gateway between an older tree and this one, interleaved
# (old new new old old new), one run.py e2e run each: good answers/s and gateway CPU per
# request at 32 and 128 connections. First: git worktree add --detach /tmp/work/old COMMIT
set -e
cd "$(dirname "$0")/.."
for who in old new new old old new; do
  src=$([ $who = old ] && echo /tmp/work/old/src || echo "$PWD/src")
  PYTHONPATH=$src timeout 300 .venv/bin/python benchmarks/run.py e2e --runs 1 --duration 3 --profile never > /dev/null 2>&1
  python3 - "$who" <<'PY'
import json,sys
d=json.load(open('benchmarks/out/latest.json'))
e=d["data"]["e2e"]
for conns in ("32","128"):
    r=e[conns]["agent_reach"][0]; s=e[conns]["seed"][0]
    print(sys.argv[1], conns, round(r["rps"]), round(r["gw_cpu_us_per_req"]), "seed", round(s["rps"]), flush=True)
PY
done
