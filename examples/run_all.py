"""`make run`: the gateway and the two example agents, until Ctrl-C.

Starts `agent-reach serve` on the in-memory registry, then the weather and note agents, waits
until both are registered, and prints the addresses and the seed's three scenarios as curl
commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST = os.environ.get("AGENT_REACH_HOST", "127.0.0.1")
PORT = int(os.environ.get("AGENT_REACH_PORT", "7700"))
GATEWAY = f"http://{HOST}:{PORT}"
AGENTS = ("agent://weather-cn-01", "agent://note-01")


def _wait_gateway(deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{GATEWAY}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the gateway did not answer on {GATEWAY} within 15 s")


def _wait_registered(deadline: float) -> list[dict[str, object]]:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{GATEWAY}/v1/agents", timeout=1) as resp:
                agents = json.load(resp)["agents"]
            if {a["endpoint_id"] for a in agents} >= set(AGENTS):
                return list(agents)
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the example agents did not register with {GATEWAY} within 15 s")


def main() -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "agent_reach", "serve"]))
        _wait_gateway(time.monotonic() + 15)
        for script in ("weather_agent.py", "note_agent.py"):
            procs.append(
                subprocess.Popen([sys.executable, str(HERE / script), "--gateway", GATEWAY])
            )
        agents = _wait_registered(time.monotonic() + 15)
        if procs[0].poll() is not None:
            raise SystemExit(f"the gateway exited (is port {PORT} taken? set AGENT_REACH_PORT)")
        send = f"curl -s {GATEWAY}/v1/send -H 'Content-Type: application/json' -d"
        print(
            f"""
Agent-Reach is running.
  gateway       {GATEWAY}
  agents        {GATEWAY}/v1/agents
  dashboard     {GATEWAY}/v1/agents  (JSON today; the web dashboard is on the roadmap)
  metrics       {GATEWAY}/metrics
"""
            + "".join(f"  {a['endpoint_id']:<24}{a['endpoint_url']}\n" for a in agents)
            + f"""
Try the three scenarios:
  {send} '{{"intent": "weather.query", "trace_id": "trace_demo_001",
          "payload": {{"city": "成都", "date": "2025-01-02"}}}}'
  {send} '{{"intent": "note.create", "payload": {{"title": "todo", "text": "buy tea"}}}}'
  {send} '{{"intent": "unknown.action", "payload": {{}}}}'    # refused: no_capable_agent
  curl -s {GATEWAY}/v1/traces/trace_demo_001                 # the first one's path
  curl -s '{GATEWAY}/v1/route?intent=weather.query'          # why that agent

Ctrl-C stops everything.""",
            flush=True,
        )
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("a process exited; stopping the others", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
