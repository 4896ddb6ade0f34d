"""The issue's walk-through, as a new user does it, on real processes.

Write a 15-line agent with the SDK (examples/hello_agent.py), start it, see it in
`agent-reach agents`, reach it from another script and from the CLI, kill it and watch its status
fall through the four levels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from agent_reach import SyncReachClient
from tests.support import ROOT, gateway, start_sdk_agent


def cli(gw: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_reach", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "AGENT_REACH_GATEWAY": gw, "COLUMNS": "200"},
        check=False,
    )


def test_write_start_see_reach_kill_watch_it_fall() -> None:
    source = (ROOT / "examples" / "hello_agent.py").read_text()
    code_lines = [
        line for line in source.splitlines() if line.strip() and not line.startswith('"""')
    ]
    assert len(code_lines) <= 15

    with gateway("--heartbeat-interval", "0.5") as gw:
        agent = start_sdk_agent(
            [sys.executable, str(ROOT / "examples" / "hello_agent.py")],
            env={"AGENT_REACH_GATEWAY": gw.url},
        )
        try:
            listed = cli(gw.url, "agents")
            assert listed.returncode == 0, listed.stderr
            assert "agent://hello-01" in listed.stdout and "greeting.say" in listed.stdout
            assert "healthy" in listed.stdout

            with SyncReachClient(gw.url) as client:
                reply = client.send("greeting.say", {"name": "ada"})
                assert reply.result["text"] == "hello, ada"
                assert reply.endpoint_id == "agent://hello-01"

                sent = cli(gw.url, "send", "greeting.say", '{"name": "bob"}')
                assert sent.returncode == 0, sent.stderr
                assert "hello, bob" in sent.stdout

                agent.popen.send_signal(signal.SIGKILL)  # no deregistration: it just dies
                agent.popen.wait(5)
                seen: list[str] = []
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (not seen or seen[-1] != "down"):
                    status = client.agent("hello-01").status
                    if not seen or seen[-1] != status:
                        seen.append(status)
                    time.sleep(0.02)
            assert seen == ["healthy", "degraded", "suspect", "down"]
            final = cli(gw.url, "agents", "--json")
            assert final.returncode == 0
            (hello,) = json.loads(final.stdout)["agents"]
            assert hello["status"] == "down"
        finally:
            agent.stop()
