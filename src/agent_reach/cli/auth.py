"""``agent-reach auth``: the keys, tokens and policy check of token mode (docs/security.md).

Tokens are signed here, offline, when ``--keys DIR`` is given: holding the private keys is what
makes one an operator, so an operator token is only ever made that way. Enrollment and client
tokens can also be asked of a running gateway (``POST /v1/tokens``) with an operator token.
Every ``token`` command prints only the token on stdout (``TOKEN=$(agent-reach auth token ...)``
works), or with ``--json`` one object ``{"kind", "subject", "token", "expires_at"}``.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click

from agent_reach.cli import render
from agent_reach.cli.common import env_name, gateway_options, json_option, reach
from agent_reach.core.names import is_domain, is_endpoint_id
from agent_reach.core.policy import PatternKind, PolicyFileError, compile_pattern, parse_policy
from agent_reach.wire.bodies import (
    DEFAULT_CLIENT_TTL_S,
    DEFAULT_ENROLL_TTL_S,
    MAX_TOKEN_TTL_S,
)

if TYPE_CHECKING:
    from agent_reach.auth.keys import KeyRing

__all__ = ["auth"]

OPERATOR_TTL_S = 12 * 3600.0
PEER_TTL_S = 7 * 86400.0


def _keys_option(*, required: bool, help: str) -> Callable[[Any], Any]:
    return click.option(
        "--keys",
        type=click.Path(file_okay=False, path_type=Path),
        required=required,
        metavar="DIR",
        envvar=env_name("keys"),
        show_envvar=True,
        help=help,
    )


def _ttl_option(default: float, shown: str) -> Callable[[Any], Any]:
    return click.option(
        "--ttl",
        type=click.FloatRange(min=0, min_open=True, max=MAX_TOKEN_TTL_S),
        default=default,
        metavar="SECONDS",
        help=f"how long the token lives (at most 30 days)  [default: {shown}]",
    )


_JSON = json_option('print {"kind", "subject", "token", "expires_at"} instead of the token alone')


def _ring(directory: Path) -> KeyRing:
    """The keys of ``directory``, loaded; a usage error (exit 2) when they cannot be used."""
    from agent_reach.auth.keys import KeyDirectoryError, KeyRing

    ring = KeyRing(directory)
    try:
        ring.load()
    except KeyDirectoryError as exc:
        raise click.BadParameter(str(exc), param_hint="'--keys'") from None
    return ring


def _sign(
    directory: Path,
    kind: str,
    subject: str,
    ttl_s: float,
    *,
    endpoints: tuple[str, ...] = (),
    intents: tuple[str, ...] = (),
) -> tuple[str, float]:
    """A token signed offline with the active key of ``directory``, and its expiry."""
    from agent_reach.auth.tokens import Kind, TokenService

    service = TokenService(_ring(directory))
    return service.issue(Kind(kind), subject, ttl_s, endpoints=endpoints, intents=intents)


def _print_token(kind: str, subject: str, token: str, expires_at: float, as_json: bool) -> None:
    if as_json:
        body = {
            "kind": kind,
            "subject": subject,
            "token": token,
            "expires_at": round(expires_at, 3),
        }
        click.echo(render.to_json(body))
    else:
        click.echo(token)


def _patterns(kind: PatternKind) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback that splits repeated, comma-separated patterns and validates each."""

    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
        found: dict[str, None] = {}
        for value in values:
            for part in value.split(","):
                if not (pattern := part.strip()):
                    continue
                try:
                    compile_pattern(pattern, kind)
                except ValueError as exc:
                    raise click.BadParameter(str(exc), ctx, param) from None
                found[pattern] = None
        if values and not found:
            raise click.BadParameter("no pattern given", ctx, param)
        return tuple(found)

    return parse


def _endpoint_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not is_endpoint_id(value):
        raise click.BadParameter(f"an agent://NAME id is needed, not {value!r}", ctx, param)
    return value


@click.group()
def auth() -> None:
    """Token mode: make signing keys and tokens, check a policy file (docs/security.md)."""


@auth.command()
@_keys_option(required=True, help="the key directory (made, mode 0700, when missing)")
@click.option(
    "--activate-in",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="sign with the new key only from then on (it is published at once): rotation",
)
def keygen(keys: Path, activate_in: float) -> None:
    """Write a new Ed25519 signing key into --keys; print its path and key id (kid)."""
    from agent_reach.auth.keys import generate_key

    try:
        path = generate_key(keys, activate_in_s=activate_in)
    except OSError as exc:
        raise click.ClickException(f"{keys}: cannot write a key there: {exc}") from None
    ring = _ring(keys)
    kid = next(key.kid for key in ring.keys.values() if Path(key.path) == path)
    click.echo(f"key {path}")
    click.echo(f"kid {kid}")


@auth.group()
def token() -> None:
    """Make a reach token: operator and peer (offline), enroll or client (offline or by a
    gateway)."""


@token.command()
@_keys_option(required=True, help="the key directory: the token is signed here, offline")
@click.option(
    "--subject",
    metavar="NAME",
    help="who holds it, for the audit log  [default: operator:<your login name>]",
)
@_ttl_option(OPERATOR_TTL_S, "12 h")
@_JSON
def operator(keys: Path, subject: str | None, ttl: float, as_json: bool) -> None:
    """An operator token: issue tokens through the gateway, deregister any id, read any
    trace, reload. Signed with --keys: whoever holds the keys is an operator."""
    if subject is None:
        try:
            login = getpass.getuser()
        except (OSError, KeyError):  # no login name (a container without a passwd entry)
            login = "operator"
        subject = f"operator:{login}"
    elif not subject.strip():
        raise click.BadParameter("must not be empty", param_hint="'--subject'")
    token, expires_at = _sign(keys, "operator", subject, ttl)
    _print_token("operator", subject, token, expires_at, as_json)


def _online_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = _keys_option(
        required=False,
        help="sign offline with this key directory  [default: ask the gateway]",
    )(command)
    return gateway_options(
        command, token_help="an operator token, to ask the gateway (without --keys)"
    )


def _issue(
    gateway: str,
    operator_token: str | None,
    as_json: bool,
    kind: Literal["enroll", "client"],
    subject: str | None,
    ttl: float,
    *,
    endpoints: tuple[str, ...] = (),
    intents: tuple[str, ...] = (),
) -> None:
    """``POST /v1/tokens`` through the gateway; its error answers print like any command's."""
    issued = reach(
        gateway,
        operator_token,
        lambda client: client.issue_token(
            kind,
            subject=subject,
            endpoints=endpoints,
            intents=intents,
            ttl_s=ttl,
        ),
    )
    _print_token(issued.kind, issued.subject, issued.token, issued.expires_at, as_json)


@token.command()
@click.option(
    "--endpoints",
    multiple=True,
    required=True,
    metavar="PATTERN",
    callback=_patterns("endpoint"),
    help="the endpoint ids it may register, e.g. agent://weather-*"
    " (repeatable, or comma-separated)",
)
@click.option(
    "--intents",
    multiple=True,
    required=True,
    metavar="PATTERN",
    callback=_patterns("intent"),
    help="the intents they may claim, e.g. weather.* (repeatable, or comma-separated)",
)
@click.option(
    "--subject", metavar="LABEL", default="enroll", show_default=True, help="a label for people"
)
@_ttl_option(DEFAULT_ENROLL_TTL_S, "24 h")
@_JSON
@_online_options
def enroll(
    gateway: str,
    token: str | None,
    keys: Path | None,
    endpoints: tuple[str, ...],
    intents: tuple[str, ...],
    subject: str,
    ttl: float,
    as_json: bool,
) -> None:
    """An enrollment token: lets agents register the ids of --endpoints with the intents of
    --intents (the policy's [[claim]] rules must allow them too)."""
    if not subject.strip():
        raise click.BadParameter("must not be empty", param_hint="'--subject'")
    if keys is None:
        _issue(
            gateway, token, as_json, "enroll", subject, ttl, endpoints=endpoints, intents=intents
        )
        return
    signed, expires_at = _sign(keys, "enroll", subject, ttl, endpoints=endpoints, intents=intents)
    _print_token("enroll", subject, signed, expires_at, as_json)


@token.command()
@click.option(
    "--subject",
    required=True,
    metavar="agent://NAME",
    callback=_endpoint_id,
    help="the sender id its holder sends as",
)
@_ttl_option(DEFAULT_CLIENT_TTL_S, "1 h")
@_JSON
@_online_options
def client(
    gateway: str, token: str | None, keys: Path | None, subject: str, ttl: float, as_json: bool
) -> None:
    """A client token: send as --subject (what it may reach is the policy's [[reach]] rules)."""
    if keys is None:
        _issue(gateway, token, as_json, "client", subject, ttl)
        return
    signed, expires_at = _sign(keys, "client", subject, ttl)
    _print_token("client", subject, signed, expires_at, as_json)


def _domain(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not is_domain(value):
        raise click.BadParameter(
            f"a domain name is needed (1-128 of a-z 0-9 . _ -), not {value!r}", ctx, param
        )
    return value


@token.command()
@_keys_option(required=True, help="the key directory: the token is signed here, offline")
@click.option(
    "--domain",
    required=True,
    metavar="NAME",
    callback=_domain,
    help="the domain its holder speaks for (that domain's gateways' --domain)",
)
@_ttl_option(PEER_TTL_S, "7 days")
@_JSON
def peer(keys: Path, domain: str, ttl: float, as_json: bool) -> None:
    """A peer token (federation): the gateways of --domain publish its summary to the
    directory with it, and forward requests to the other domains' gateways. Signed with
    --keys, offline only."""
    signed, expires_at = _sign(keys, "peer", domain, ttl)
    _print_token("peer", domain, signed, expires_at, as_json)


@auth.command("check-policy")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check_policy(file: Path) -> None:
    """Parse a policy file: print its summary (exit 0) or what is wrong, and on which line
    (exit 1). The gateway would refuse the same file, at start or on reload."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise click.ClickException(f"{file}: cannot read it: {exc}") from None
    try:
        policy = parse_policy(text, source=str(file))
    except PolicyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{file}: ok, {policy.summary()}")
