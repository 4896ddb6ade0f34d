"""The CLI's one mapping of errors: to exit codes, and to what a person or a script reads."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from agent_reach.cli.common import ExitCode, Group, exit_code, json_option, one_line
from agent_reach.errors import (
    AgentReachError,
    BackendUnavailable,
    ConfigError,
    GatewayUnavailable,
    InternalError,
    KeyDirectoryError,
    NoCapableAgent,
    PolicyFileError,
    RegistryFull,
    error_from_answer,
)


def answer(status: int, code: str) -> AgentReachError:
    """The error the client SDK rebuilds from a gateway's error answer."""
    return error_from_answer(status, {"ok": False, "error": code, "detail": f"{code}!"})


EXIT_CODES = {
    "a setting": (ConfigError("confidence-threshold must be in (0, 1]"), ExitCode.USAGE),
    "a policy file": (PolicyFileError("bad", source="p.toml", line=3), ExitCode.USAGE),
    "a key directory": (KeyDirectoryError("key directory k does not exist"), ExitCode.USAGE),
    "the shared registry away": (BackendUnavailable("cannot reach redis://h"), ExitCode.ERROR),
    "a fault of ours": (InternalError("boom"), ExitCode.ERROR),
    "a full registry": (RegistryFull("256 endpoints"), ExitCode.ERROR),
    "no gateway": (GatewayUnavailable("cannot reach the gateway"), ExitCode.UNAVAILABLE),
    "an unusable answer": (error_from_answer(502, "<html>"), ExitCode.UNAVAILABLE),
    "a send refused": (NoCapableAgent("no agent declares 'x.y'"), ExitCode.ERROR),
    "an answer": (answer(404, "trace_not_found"), ExitCode.ERROR),
    # the gateway's own configuration refused (a reload): an answer, not a usage error here
    "a gateway's config_error": (answer(400, "config_error"), ExitCode.ERROR),
    "a gateway's backend": (answer(503, "backend_unavailable"), ExitCode.ERROR),
    "a code from a newer gateway": (answer(409, "something_new"), ExitCode.ERROR),
}


@pytest.mark.parametrize(("exc", "code"), EXIT_CODES.values(), ids=EXIT_CODES.keys())
def test_exit_codes(exc: AgentReachError, code: ExitCode) -> None:
    assert exit_code(exc) is code


ONE_LINE = {
    "names file and line": (PolicyFileError("bad", source="p.toml", line=3), "p.toml line 3: bad"),
    "names the file": (
        PolicyFileError("cannot read it", source="p.toml", line=None),
        "p.toml: cannot read it",
    ),
    "names the setting": (
        ConfigError("must be > 0", source="reload-interval"),
        "reload-interval: must be > 0",
    ),
    "names it once": (
        ConfigError("endpoint-networks: bad", source="endpoint-networks"),
        "endpoint-networks: bad",
    ),
    "a line of a file": (ConfigError("oops", source="dict.toml", line=7), "dict.toml line 7: oops"),
    "one line": (
        BackendUnavailable("cannot reach\n  redis://h:\tgone"),
        "cannot reach redis://h: gone",
    ),
}


@pytest.mark.parametrize(("exc", "line"), ONE_LINE.values(), ids=ONE_LINE.keys())
def test_one_line(exc: AgentReachError, line: str) -> None:
    assert one_line(exc) == line


RAISED = {
    "config": PolicyFileError("[[reach]] #1: bad pattern", source="p.toml", line=3),
    "backend": BackendUnavailable("cannot reach the registry at redis://h:1/0"),
    "answer": NoCapableAgent("no agent declares intent 'x.y'", msg_id="m1", trace_id="t1"),
    "gateway": GatewayUnavailable("cannot reach the gateway at http://h:1"),
}


@click.group(cls=Group)
def cli() -> None:
    """A root group like agent-reach's, with one command that fails as asked."""


@cli.command()
@click.argument("which")
@json_option("JSON on stdout")
def fails(which: str, as_json: bool) -> None:
    if which == "interrupted":
        raise KeyboardInterrupt
    raise RAISED[which]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_an_error_of_this_process_is_one_line_on_stderr(as_json: bool) -> None:
    flags = ["--json"] if as_json else []
    assert invoke("fails", "config", *flags) == (
        2,
        "",
        "Error: p.toml line 3: [[reach]] #1: bad pattern\n",
    )
    assert invoke("fails", "backend", *flags) == (
        1,
        "",
        "Error: cannot reach the registry at redis://h:1/0\n",
    )


def test_an_error_of_a_call_is_its_code_and_fields_or_its_json() -> None:
    code, out, err = invoke("fails", "answer")
    assert (code, out) == (1, "")
    assert err.splitlines()[:2] == [
        "error no_capable_agent: no agent declares intent 'x.y'",
        "trace    t1  (agent-reach trace t1)",
    ]
    code, out, err = invoke("fails", "answer", "--json")
    assert (code, err) == (1, "")
    assert json.loads(out) == RAISED["answer"].to_body()
    code, out, err = invoke("fails", "gateway", "--json")
    assert (code, err) == (3, "")
    assert json.loads(out)["error"] == "gateway_unavailable"


def test_ctrl_c_is_130() -> None:
    assert invoke("fails", "interrupted")[0] == 130
