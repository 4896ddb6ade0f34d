"""Token mode from the command line: `serve --auth ...` refusals, `auth keygen`, `auth token`,
`auth check-policy`, and client commands with `--token`, all as real subprocesses."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_reach.auth import Claims, KeyRing, Kind, TokenService
from tests.support import Proc, cli, gateway

SENDER = "agent://cli-auth-sender"
POLICY = f"""\
version = 1

[[reach]]
senders = ["{SENDER}"]
intents = ["cli.*"]

[[claim]]
endpoints = ["agent://cli-auth-*"]
intents = ["cli.*"]
"""
# line 5 holds the bad intent pattern
BAD_PATTERN_POLICY = """\
version = 1

[[reach]]
senders = ["agent://*"]
intents = ["Weather.Query"]
"""
# line 3 is not TOML
SYNTAX_ERROR_POLICY = """\
version = 1

[[reach]
senders = ["agent://*"]
"""


def verify(keys: Path, token: str, kind: Kind) -> Claims:
    """The claims of ``token`` as a gateway over the same key directory reads them."""
    ring = KeyRing(keys)
    ring.load()
    return TokenService(ring).verify(token, {kind})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cli-auth") / "keys"
    assert cli("auth", "keygen", "--keys", str(directory)).code == 0
    return directory


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("cli-auth-policy") / "policy.toml", POLICY)


@pytest.fixture(scope="module")
def operator_token(keys: Path) -> str:
    run = cli("auth", "token", "operator", "--keys", str(keys))
    assert run.code == 0, run.err
    return run.out.strip()


@pytest.fixture(scope="module")
def gw(keys: Path, policy: Path) -> Iterator[Proc]:
    with gateway("--auth", "tokens", "--keys", str(keys), "--policy", str(policy)) as proc:
        yield proc


# --- serve refuses what cannot work ----------------------------------------------------------


def test_open_mode_off_loopback_is_refused_and_nothing_listens() -> None:
    port = free_port()
    run = cli("serve", "--host", "0.0.0.0", "--port", str(port))
    assert run.code == 2
    assert "--insecure-open-mode" in run.err
    assert "anyone who can reach this address" in run.err
    assert run.out == ""
    with socket.socket() as sock:
        sock.settimeout(5)
        with pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.1", port))


def test_token_mode_needs_keys_and_policy(keys: Path) -> None:
    no_keys = cli("serve", "--port", "0", env={"AGENT_REACH_AUTH": "tokens"})
    assert no_keys.code == 2
    assert "--keys DIR" in no_keys.err
    no_policy = cli("serve", "--port", "0", "--auth", "tokens", "--keys", str(keys))
    assert no_policy.code == 2
    assert "--policy FILE" in no_policy.err


def test_a_policy_with_a_syntax_error_stops_serve_with_its_line(keys: Path, tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", SYNTAX_ERROR_POLICY)
    run = cli("serve", "--port", "0", "--auth", "tokens", "--keys", str(keys), "--policy", str(bad))
    assert run.code == 2  # a configuration refused at start
    assert run.out == ""  # never said it listens
    [message] = [line for line in run.err.splitlines() if line.startswith("Error: ")]
    assert f"{bad} line 3" in message
    assert "Traceback" not in run.err


def test_a_missing_key_directory_stops_serve(policy: Path, tmp_path: Path) -> None:
    run = cli(
        "serve", "--port", "0", "--auth", "tokens",
        "--keys", str(tmp_path / "nowhere"), "--policy", str(policy),
    )  # fmt: skip
    assert run.code == 2
    [message] = [line for line in run.err.splitlines() if line.startswith("Error: ")]
    assert "does not exist" in message
    assert "Traceback" not in run.err


def test_workers_check_the_policy_once_before_starting_any(keys: Path, tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", BAD_PATTERN_POLICY)
    run = cli(
        "serve", "--port", "0", "--workers", "2", "--registry", "redis://127.0.0.1:1/0",
        "--auth", "tokens", "--keys", str(keys), "--policy", str(bad),
    )  # fmt: skip
    assert run.code == 2
    [message] = run.err.splitlines()  # the supervisor's refusal, from no worker
    assert message.startswith(f"Error: {bad} line 5: ")


# --- auth keygen and auth token ----------------------------------------------------------------


def test_keygen_writes_a_loadable_key_and_prints_its_kid(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    run = cli("auth", "keygen", "--keys", str(directory))
    assert (run.code, run.err) == (0, "")
    path_line, kid_line = run.out.splitlines()
    path = Path(path_line.removeprefix("key "))
    kid = kid_line.removeprefix("kid ")
    ring = KeyRing(directory)
    ring.load()
    assert list(ring.keys) == [kid]
    assert Path(ring.keys[kid].path) == path
    later = cli("auth", "keygen", "--keys", str(directory), "--activate-in", "3600")
    assert later.code == 0
    ring.load()
    assert len(ring.keys) == 2
    assert ring.signing_key().kid == kid  # the new one is published, not yet signing


def test_operator_token_is_printed_alone_and_verifies(keys: Path) -> None:
    run = cli("auth", "token", "operator", "--keys", str(keys))
    assert (run.code, run.err) == (0, "")
    assert run.out.count("\n") == 1
    token = run.out.strip()
    assert token.count(".") == 2  # a JWT
    claims = verify(keys, token, Kind.OPERATOR)
    assert claims.subject.startswith("operator:")
    assert claims.remaining_s(time.time()) == pytest.approx(12 * 3600, abs=60)


def test_operator_token_json_names_subject_and_expiry(keys: Path) -> None:
    run = cli(
        "auth", "token", "operator", "--keys", str(keys), "--subject", "ops-ci", "--ttl", "60",
        "--json",
    )  # fmt: skip
    assert (run.code, run.err) == (0, "")
    body = run.json()
    assert set(body) == {"kind", "subject", "token", "expires_at"}
    assert (body["kind"], body["subject"]) == ("operator", "ops-ci")
    claims = verify(keys, body["token"], Kind.OPERATOR)
    assert claims.subject == "ops-ci"
    assert claims.expires_at == pytest.approx(body["expires_at"], abs=0.01)
    assert claims.remaining_s(time.time()) == pytest.approx(60, abs=30)


def test_enroll_token_offline_carries_its_patterns(keys: Path) -> None:
    run = cli(
        "auth", "token", "enroll", "--keys", str(keys),
        "--endpoints", "agent://weather-*,agent://note-01", "--endpoints", "agent://x",
        "--intents", "weather.*", "--subject", "weather fleet",
    )  # fmt: skip
    assert (run.code, run.err) == (0, "")
    claims = verify(keys, run.out.strip(), Kind.ENROLL)
    assert claims.subject == "weather fleet"
    assert claims.endpoints == ("agent://weather-*", "agent://note-01", "agent://x")
    assert claims.intents == ("weather.*",)
    assert claims.remaining_s(time.time()) == pytest.approx(24 * 3600, abs=60)


def test_bad_patterns_and_ids_are_usage_errors_and_nothing_is_signed(keys: Path) -> None:
    bad_pattern = cli(
        "auth", "token", "enroll", "--keys", str(keys),
        "--endpoints", "agent://Weather", "--intents", "weather.*",
    )  # fmt: skip
    assert (bad_pattern.code, bad_pattern.out) == (2, "")
    assert "invalid endpoint pattern 'agent://Weather'" in bad_pattern.err
    bad_id = cli("auth", "token", "client", "--keys", str(keys), "--subject", "weather")
    assert (bad_id.code, bad_id.out) == (2, "")
    assert "agent://NAME" in bad_id.err


def test_tokens_are_issued_online_with_an_operator_token(
    gw: Proc, keys: Path, operator_token: str
) -> None:
    run = cli(
        "auth", "token", "client", "--subject", "agent://cli-auth-app", "--json",
        "--gateway", gw.url, "--token", operator_token,
    )  # fmt: skip
    assert (run.code, run.err) == (0, "")
    body = run.json()
    assert (body["kind"], body["subject"]) == ("client", "agent://cli-auth-app")
    claims = verify(keys, body["token"], Kind.CLIENT)
    assert claims.subject == "agent://cli-auth-app"
    assert claims.remaining_s(time.time()) == pytest.approx(3600, abs=60)

    enroll = cli(
        "auth", "token", "enroll", "--endpoints", "agent://cli-auth-*", "--intents", "cli.*",
        "--ttl", "600", "--gateway", gw.url, env={"AGENT_REACH_TOKEN": operator_token},
    )  # fmt: skip
    assert (enroll.code, enroll.err) == (0, "")
    claims = verify(keys, enroll.out.strip(), Kind.ENROLL)
    assert (claims.endpoints, claims.intents) == (("agent://cli-auth-*",), ("cli.*",))


def test_issuing_online_without_an_operator_token_is_unauthorized(gw: Proc) -> None:
    run = cli("auth", "token", "client", "--subject", "agent://cli-auth-app", "--gateway", gw.url)
    assert (run.code, run.out) == (1, "")
    assert run.err.startswith("error unauthorized: ")


# --- auth check-policy -------------------------------------------------------------------------


def test_check_policy_prints_the_summary_of_a_good_file(policy: Path) -> None:
    run = cli("auth", "check-policy", str(policy))
    assert (run.code, run.err) == (0, "")
    assert run.out.startswith(f"{policy}: ok, 1 reach rule, 1 claim rule, sha256 ")


@pytest.mark.parametrize(
    ("text", "line"), [(BAD_PATTERN_POLICY, 5), (SYNTAX_ERROR_POLICY, 3)], ids=["pattern", "toml"]
)
def test_check_policy_names_the_line_at_fault(tmp_path: Path, text: str, line: int) -> None:
    bad = write(tmp_path / "policy.toml", text)
    run = cli("auth", "check-policy", str(bad))
    assert (run.code, run.out) == (1, "")
    assert f"{bad} line {line}: " in run.err


# --- client commands with --token --------------------------------------------------------------


def test_a_wrong_token_is_an_unauthorized_error(gw: Proc) -> None:
    run = cli("agents", "--gateway", gw.url, "--token", "not-a-token")
    assert (run.code, run.out) == (1, "")
    assert run.err.startswith("error unauthorized: ")
    from_env = cli("route", "cli.echo", "--gateway", gw.url, "--json",
                   env={"AGENT_REACH_TOKEN": "not-a-token"})  # fmt: skip
    assert (from_env.code, from_env.json()["error"]) == (1, "unauthorized")


def test_a_good_token_is_passed_on(gw: Proc, operator_token: str) -> None:
    run = cli("agents", "--gateway", gw.url, "--token", operator_token, "--json")
    assert (run.code, run.err) == (0, "")
    assert run.json() == {"agents": []}


def test_forbidden_prints_like_other_errors(gw: Proc, keys: Path) -> None:
    stranger = cli("auth", "token", "client", "--keys", str(keys), "--subject", "agent://cli-x")
    run = cli("send", "cli.echo", "--gateway", gw.url, "--token", stranger.out.strip())
    assert (run.code, run.out) == (1, "")
    assert run.err.startswith("error forbidden: ")
    sender = cli("auth", "token", "client", "--keys", str(keys), "--subject", SENDER)
    allowed = cli("send", "cli.echo", "--gateway", gw.url, "--token", sender.out.strip(), "--json")
    assert (allowed.code, allowed.json()["error"]) == (1, "no_capable_agent")  # nobody there


def test_rate_limited_prints_like_other_errors() -> None:
    # open mode: the bucket is the caller's address; one send, then none for ~100 s
    with gateway("--rate-limit", "0.01", "--rate-burst", "1") as proc:
        first = cli("send", "cli.echo", "--gateway", proc.url, "--json")
        assert (first.code, first.json()["error"]) == (1, "no_capable_agent")
        second = cli("send", "cli.echo", "--gateway", proc.url)
    assert (second.code, second.out) == (1, "")
    assert second.err.startswith("error rate_limited: ")
