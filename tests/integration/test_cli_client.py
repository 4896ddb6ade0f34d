"""The client commands (`agents`, `send`, `route`, `trace`) as scripts run them: subprocesses
against a real gateway and real agents, checked on stdout, stderr and the exit code."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import ROOT, Proc, gateway, http, start_agent

ECHO = "agent://cli-echo-01"
REJECT = "agent://cli-reject-01"
DEAD = "agent://cli-dead-01"
AGENT_KEYS = {
    "endpoint_id",
    "capabilities",
    "endpoint_url",
    "description",
    "status",
    "last_seen_at",
    "avg_latency_ms",
    "p95_latency_ms",
}
# variables that would change what the commands print or where they go
_SCRUBBED = ("AGENT_REACH_GATEWAY", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout parsed: one JSON document and nothing else."""
        return json.loads(self.out)


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Run:
    """Run ``agent-reach ARGS`` (as ``python -m agent_reach``) to completion."""
    [run] = cli_many([*args], stdin=stdin, envs=[env or {}])
    return run


def cli_many(
    *argvs: list[str], stdin: str | None = None, envs: list[dict[str, str]] | None = None
) -> list[Run]:
    """Run several ``agent-reach`` commands side by side (each start costs ~0.4 s of CPU).

    stdout and stderr are pipes, so rich prints no colour codes.
    """
    popens = []
    try:
        for i, argv in enumerate(argvs):
            env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
            env["COLUMNS"] = "300"  # wide enough that no table cell wraps
            env.update(envs[i] if envs else {})
            popens.append(
                subprocess.Popen(
                    [sys.executable, "-m", "agent_reach", *argv],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=ROOT,
                )
            )
        runs = []
        for popen in popens:
            out, err = popen.communicate(stdin, timeout=30)
            runs.append(Run(popen.returncode, out, err))
    finally:
        for popen in popens:
            if popen.poll() is None:
                popen.kill()
                popen.communicate()
    for run in runs:
        assert "\x1b[" not in run.out + run.err  # no colour codes when not on a terminal
    return runs


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def gw() -> Iterator[Proc]:
    with gateway() as proc:
        agents: list[Proc] = []
        try:
            agents.append(start_agent(proc.url, ECHO, intents="cli.echo,cli.route"))
            agents.append(start_agent(proc.url, REJECT, mode="reject", intents="cli.reject"))
            yield proc
        finally:
            for agent in agents:
                agent.stop()


def row(output: str, endpoint_id: str) -> str:
    """The table row of ``endpoint_id``."""
    return next(line for line in output.splitlines() if line.startswith(f"{endpoint_id} "))


# a row of the route table: chosen, candidate, status, confidence, avg, p95, eligible, why
ROUTE_ROW = re.compile(
    r"^(?P<chosen>chosen)?\s+(?P<id>agent://\S+)\s+(?P<status>\S+)\s+[\d.]+"
    r"\s+(?:-|[\d.]+ ms)\s+(?:-|[\d.]+ ms)\s+(?P<eligible>yes|no)\s+(?P<why>.*?)\s*$"
)


def test_agents_table_lists_ids_intents_and_status(gw: Proc) -> None:
    run = cli("agents", "--gateway", gw.url)
    assert (run.code, run.err) == (0, "")
    echo = row(run.out, ECHO)
    assert "cli.echo, cli.route" in echo
    assert "healthy" in echo
    assert " s ago" in echo
    assert "cli.reject" in row(run.out, REJECT)


def test_agents_json_is_the_contract_listing_filtered(gw: Proc) -> None:
    run, unwell = cli_many(
        ["agents", "--gateway", gw.url, "--json", "--intent", "cli.reject"],
        ["agents", "--gateway", gw.url, "--json", "--status", "suspect", "--status", "down"],
    )
    assert (unwell.code, unwell.err) == (0, "")
    assert {agent["status"] for agent in unwell.json()["agents"]} <= {"suspect", "down"}
    assert (run.code, run.err) == (0, "")
    listing = run.json()
    assert list(listing) == ["agents"]
    [agent] = listing["agents"]
    assert set(agent) == AGENT_KEYS
    assert (agent["endpoint_id"], agent["capabilities"]) == (REJECT, ["cli.reject"])
    assert agent["status"] == "healthy"


def test_send_prints_the_result_endpoint_attempts_and_trace_id(gw: Proc) -> None:
    run = cli(
        "send", "cli.echo", '{"city": "成都"}', "--trace-id", "trace_cli_send", "--gateway", gw.url
    )
    assert (run.code, run.err) == (0, "")
    *result, summary = run.out.splitlines()
    answer = json.loads("\n".join(result))  # the result as (indented) JSON
    assert (answer["agent"], answer["payload"]) == (ECHO, {"city": "成都"})
    assert answer["trace_id"] == "trace_cli_send"
    assert summary.startswith(f"endpoint {ECHO}  attempts ok ")
    assert summary.endswith("  trace trace_cli_send")
    assert " ms  total " in summary


def test_send_reads_the_payload_from_stdin_and_prints_the_contract_json(gw: Proc) -> None:
    run = cli(
        "send", "cli.echo", "-", "--json", "--priority", "high", "--gateway", gw.url,
        stdin='{"n": [1, 2], "s": "é"}',
    )  # fmt: skip
    assert (run.code, run.err) == (0, "")
    body = run.json()
    assert list(body) == [
        "ok",
        "msg_id",
        "trace_id",
        "intent",
        "endpoint_id",
        "result",
        "attempts",
        "latency_ms",
        "match",
    ]
    assert (body["ok"], body["intent"], body["endpoint_id"]) == (True, "cli.echo", ECHO)
    assert body["match"] == {"method": "exact", "tag": "cli.echo", "confidence": 1.0}
    assert body["result"]["payload"] == {"n": [1, 2], "s": "é"}
    [attempt] = body["attempts"]
    assert set(attempt) == {"endpoint_id", "outcome", "latency_ms"}
    assert attempt["outcome"] == "ok"


def test_send_of_an_unknown_intent_exits_1(gw: Proc) -> None:
    run, machine = cli_many(
        ["send", "cli.nobody", "--trace-id", "trace_cli_nobody", "--gateway", gw.url],
        ["send", "cli.nobody", "--json", "--gateway", gw.url],
    )
    assert (run.code, run.out) == (1, "")
    lines = run.err.splitlines()
    assert lines[0].startswith("error no_capable_agent: ")
    assert "cli.nobody" in lines[0]
    assert "trace    trace_cli_nobody  (agent-reach trace trace_cli_nobody)" in lines
    assert "attempts none" in lines
    assert (machine.code, machine.err) == (1, "")
    body = machine.json()
    assert (body["ok"], body["error"], body["attempts"]) == (False, "no_capable_agent", [])
    assert str(body["trace_id"]).startswith("trace_")
    assert "cli.nobody" in str(body["detail"])


def test_an_agent_refusal_exits_1_with_its_attempts(gw: Proc) -> None:
    run = cli("send", "cli.reject", '{"x": 1}', "--gateway", gw.url)
    assert (run.code, run.out) == (1, "")
    assert run.err.startswith("error agent_error: ")
    assert "attempts agent_error " in run.err
    assert f"({REJECT})" in run.err
    assert "agent_status: 422" in run.err.splitlines()


def test_an_invalid_json_payload_is_a_usage_error_and_nothing_is_sent(gw: Proc) -> None:
    run = cli(
        "send", "cli.echo", "{city: 1}", "--json", "--trace-id", "trace_cli_bad", "--gateway",
        gw.url,
    )  # fmt: skip
    assert (run.code, run.out) == (2, "")
    assert "Invalid value for '[JSON]': the payload (the argument) is not valid JSON" in run.err
    assert http("GET", f"{gw.url}/v1/traces/trace_cli_bad")[0] == 404  # the gateway saw nothing


def test_values_the_client_refuses_are_usage_errors_with_no_traceback(gw: Proc) -> None:
    """A review: refused by the client before anything was sent, these exited 1 (as a
    gateway's answer) or ended in a traceback (blank words, a payload nested too deeply, an
    argument that is not UTF-8, a token with a newline inside)."""
    cases = [
        ("register", "agent://cli-bad-01", "http://a..b/", "--intent", "cli.bad", "--json"),
        ("send", "--text", "   ", "--json"),
        ("send", "cli.echo", "[" * 100_000, "--json"),
        ("send", "cli.echo", "\udcff", "--json"),
        ("--token", "a\nb", "agents", "--json"),
    ]
    for case in cases:
        run = cli(*(a.replace("\\n", "\n") for a in case), "--gateway", gw.url)
        assert run.code == 2, (case, run)
        assert "Traceback" not in run.err, (case, run.err)


def test_route_explains_the_choice_the_timeout_the_retries_and_why_not(gw: Proc) -> None:
    code, _ = http(
        "POST",
        f"{gw.url}/v1/register",
        {"endpoint_id": DEAD, "capabilities": ["cli.route"], "endpoint_url": "http://127.0.0.1:9/"},
    )
    assert code == 200
    # a refused connection takes the endpoint out of intent routing until its next heartbeat
    run = cli("send", "cli.route", "--to", DEAD, "--timeout-ms", "1500", "--gateway", gw.url)
    assert run.code == 1
    assert "connect_error" in run.err

    run, machine = cli_many(
        ["route", "cli.route", "--timeout-ms", "5000", "--gateway", gw.url],
        ["route", "cli.route", "--json", "--gateway", gw.url],
    )
    assert (run.code, run.err) == (0, "")
    # per try max(1.5 x p95, 2000 ms); retries min(floor((5000 - 1000) / (2000 x 1.2)), 3)
    assert run.out.splitlines()[0] == (
        f"intent cli.route  chosen {ECHO}  per-try timeout 2000.0 ms  max retries 1"
    )
    rows = {}
    for line in run.out.splitlines():
        match = ROUTE_ROW.match(line)
        if match:
            rows[match["id"]] = match
    assert set(rows) == {ECHO, DEAD}
    echo, dead = rows[ECHO], rows[DEAD]
    assert (echo["chosen"], echo["status"], echo["eligible"]) == ("chosen", "healthy", "yes")
    assert echo["why"] == "healthy"
    assert (dead["chosen"], dead["status"], dead["eligible"]) == (None, "suspect", "no")
    assert dead["why"].startswith("suspect: connection refused")
    assert (machine.code, machine.err) == (0, "")
    body = machine.json()
    assert (body["ok"], body["chosen"], body["max_retries"]) == (True, ECHO, 2)
    candidates = {c["endpoint_id"]: c for c in body["candidates"]}
    assert set(candidates) == {ECHO, DEAD}
    assert {"status", "confidence", "eligible", "reason"} <= set(candidates[DEAD])
    assert (candidates[DEAD]["eligible"], candidates[ECHO]["eligible"]) == (False, True)


def test_agents_at_80_columns_keep_every_tag_whole(gw: Proc) -> None:
    tags = [f"cli.wide.{name}" for name in ("forecast.hourly", "forecast.daily", "alerts.severe",
                                             "radar.precipitation", "query")]  # fmt: skip
    code, _ = http(
        "POST",
        f"{gw.url}/v1/register",
        {"endpoint_id": "agent://cli-wide-01", "capabilities": tags,
         "endpoint_url": "http://127.0.0.1:9/"},
    )  # fmt: skip
    assert code == 200
    narrow, wide = cli_many(
        ["agents", "--gateway", gw.url], ["agents", "--gateway", gw.url],
        envs=[{"COLUMNS": "80"}, {"COLUMNS": "120"}],
    )  # fmt: skip
    for run, width in ((narrow, 80), (wide, 120)):
        assert (run.code, run.err) == (0, "")
        lines = run.out.splitlines()
        assert max(len(line.rstrip()) for line in lines) <= width
        # each tag whole on one line (its comma aside): none cut, none folded
        assert set(tags) <= {word.rstrip(",") for word in run.out.split()}, run.out
        assert "…" not in run.out
        wide_row = row(run.out, "agent://cli-wide-01").split()
        assert {"healthy", "degraded"} & set(wide_row)  # its status is still shown


def test_trace_prints_the_waterfall_of_a_send(gw: Proc) -> None:
    code, _ = http(
        "POST",
        f"{gw.url}/v1/send",
        {"intent": "cli.echo", "trace_id": "trace_cli_timeline", "payload": {"k": 1}},
    )
    assert code == 200
    run, machine, unknown = cli_many(
        ["trace", "trace_cli_timeline", "--gateway", gw.url],
        ["trace", "trace_cli_timeline", "--json", "--gateway", gw.url],
        ["trace", "trace_cli_unknown", "--gateway", gw.url],
    )
    assert (run.code, run.err) == (0, "")
    header, columns, request, route, attempt = run.out.splitlines()
    assert header.startswith("trace trace_cli_timeline  1 request, 5 events over ")
    assert columns.split()[:2] == ["at", "took"] and columns.split()[-1] == "hop"
    assert request.startswith("+0.0 ms ")
    assert request.endswith(" cli.echo  ok")
    assert route.endswith("├ route  1 healthy")
    assert f"└ {ECHO}  ok  handler " in attempt
    offsets = [float(line.split()[0].lstrip("+")) for line in (request, route, attempt)]
    assert offsets == sorted(offsets)
    assert (machine.code, machine.err) == (0, "")
    body = machine.json()  # --json: the gateway's answer as it is
    assert body == http("GET", f"{gw.url}/v1/traces/trace_cli_timeline")[1]
    assert [e["kind"] for e in body["events"]] == [
        "received",
        "route",
        "attempt",
        "agent",
        "answer",
    ]
    assert (unknown.code, unknown.out) == (1, "")
    assert unknown.err.startswith("error trace_not_found: ")


def test_an_unreachable_gateway_exits_3_for_every_command() -> None:
    url = closed_port_url()
    machine = [["send", "cli.echo", '{"x": 1}', "--json"], ["route", "cli.echo", "--json"]]
    human = [["agents"], ["trace", "trace_x"]]
    runs = cli_many(*([*argv, "--gateway", url] for argv in human + machine))
    for argv, run in zip(human, runs[: len(human)], strict=True):
        assert (run.code, run.out) == (3, ""), argv
        assert run.err.startswith(f"error gateway_unavailable: cannot reach the gateway at {url}")
    for argv, run in zip(machine, runs[len(human) :], strict=True):
        assert (run.code, run.err) == (3, ""), argv
        assert run.json()["error"] == "gateway_unavailable"
        assert url in str(run.json()["detail"])


def test_the_environment_names_the_gateway_and_the_flag_wins(gw: Proc) -> None:
    from_env, flag_wins = cli_many(
        ["agents", "--json"],
        ["agents", "--json", "--gateway", gw.url],
        envs=[{"AGENT_REACH_GATEWAY": gw.url}, {"AGENT_REACH_GATEWAY": closed_port_url()}],
    )
    for run in (from_env, flag_wins):
        assert (run.code, run.err) == (0, "")
        assert ECHO in {agent["endpoint_id"] for agent in run.json()["agents"]}


def test_help_documents_the_exit_codes_and_the_gateway_variable() -> None:
    run, command = cli_many(["--help"], ["route", "--help"])
    assert run.code == 0
    for line in ("0  success", "1  the gateway answered with an error", "2  usage error",
                 "3  the gateway could not be reached", "4  doctor found problems"):  # fmt: skip
        assert line in run.out
    assert command.code == 0
    assert "--gateway URL" in command.out
    assert "AGENT_REACH_GATEWAY" in command.out
    assert "--json" in command.out
