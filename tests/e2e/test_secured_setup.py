"""docs/security.md's five-minute secured set-up, run as written, on real processes: two agents
enrolled, allowed traffic flowing, every forbidden move refused.

The shell blocks of the page (marked ``<!-- secured-setup: NAME -->``) and its policy are taken
from the page itself, so the page cannot drift from what works. Two things are added around them,
as a person would do them by eye: the gateway gets ``--port 0`` (tests never take 7700) and the
script waits, with a bound, until the gateway listens and the agent is registered. Each line of
the "forbidden" block must fail with the code its comment names, while the allowed send works.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, own_processes

DOC = ROOT / "docs" / "security.md"
_BLOCK = re.compile(r"<!-- secured-setup: (\w+) -->\n```(\w+)\n(.*?)```", re.S)
WAIT = """
for _ in $(seq 200); do grep -q listening serve.out 2>/dev/null && break; sleep 0.05; done
export AGENT_REACH_GATEWAY=$(grep -o 'http://[0-9.:]*' serve.out | head -1)
"""
WAIT_AGENT = """
for _ in $(seq 200); do
  agent-reach agents --token "$OPERATOR" 2>/dev/null | grep -q {name} && break; sleep 0.05
done
"""


def blocks() -> dict[str, str]:
    return {name: body for name, _, body in _BLOCK.findall(DOC.read_text())}


def script(parts: dict[str, str], python: str) -> str:
    out = ["set -u", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    out += parts["keys"].splitlines()
    out += ["cat > policy.toml <<'POLICY'", parts["policy"].rstrip("\n"), "POLICY"]
    for line in parts["serve"].splitlines():
        if line.startswith("agent-reach serve") and line.endswith("&"):
            line = line.removesuffix("&") + "--port 0 > serve.out 2> serve.log &"
            out += [line, WAIT]
        else:
            out.append(line)
    out.append('OPERATOR="$AGENT_REACH_TOKEN"')
    for n, line in enumerate(parts["enroll"].splitlines()):
        if line.endswith("&"):
            command = line.replace("python ", f"{python} ").removesuffix("&")
            out += [f"{command}2> agent{n}.log &"]
            name = "hello-01" if "hello_agent" in line else "weather-cn-01"
            out.append(WAIT_AGENT.format(name=name))
        else:
            out.append(line)
    for n, line in enumerate(parts["send"].splitlines()):
        if re.match(r"\w+=\$\(", line):  # CALLER=$(...): an assignment, run as it is
            out.append(line)
        else:
            out.append(f"{line} > allowed{n}.out 2>&1; echo $? > allowed{n}.code")
    for n, line in enumerate(parts["forbidden"].splitlines()):
        command = line.partition("  #")[0]
        if re.match(r"\w+=\$\(", command):
            out.append(command)
            continue
        command = command.replace("python ", f"timeout 20 {python} ")
        out.append(f"{command.strip()} > forbidden{n}.out 2>&1; echo $? > forbidden{n}.code")
    return "\n".join(out) + "\n"


@own_processes  # the page's commands, as written, in a clean shell (no AGENT_REACH_*)
def test_the_secured_setup_of_the_docs_works_as_written(tmp_path: Path) -> None:
    parts = blocks()
    assert {"keys", "policy", "serve", "enroll", "send", "forbidden"} <= parts.keys()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AGENT_REACH_")
    }  # a clean shell: nothing from the test's own environment
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    done = subprocess.run(
        ["bash", "-c", script(parts, sys.executable)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    logs = f"{done.stdout}\n{done.stderr}\n" + "\n".join(
        f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(tmp_path.glob("*.out"))
    )
    allowed = sorted(tmp_path.glob("allowed*.code"))
    assert len(allowed) == 2, logs
    for code in allowed:
        assert code.read_text().strip() == "0", logs
    assert "hello, ada" in (tmp_path / "allowed1.out").read_text(), logs
    assert "Chengdu" in (tmp_path / "allowed2.out").read_text(), logs
    expected = [
        line.partition("  #")[2].strip()
        for line in parts["forbidden"].splitlines()
        if not re.match(r"\w+=\$\(", line)
    ]
    codes = sorted(tmp_path.glob("forbidden*.code"), key=lambda p: int(p.stem[9:]))
    assert len(codes) == len(expected) == 5, logs
    for code_file, comment in zip(codes, expected, strict=True):
        word = comment.split()[1].rstrip(":")  # "401 unauthorized: ..." -> "unauthorized"
        output = code_file.with_suffix(".out").read_text()
        assert code_file.read_text().strip() != "0", (comment, output)
        assert word in output, (comment, output)
    serve_log = (tmp_path / "serve.log").read_text()
    assert serve_log.count('"audit.denied"') >= 5, serve_log[-3000:]
