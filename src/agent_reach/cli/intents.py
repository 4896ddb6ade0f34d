"""``agent-reach intents``: the intent dictionary (docs/intents.md).

- ``agent-reach intents`` (or ``intents list``): what the gateway knows (``GET /v1/intents``):
  every dictionary entry and every registered tag, with the endpoints serving each.
- ``agent-reach intents check FILE``: offline, the file read as the gateway would read it: its
  entries, or the refusal with the line at fault (exit 2).
- ``agent-reach intents match "TEXT"``: the tags the gateway matches those words to now
  (``GET /v1/route?intent_text=...``, a dry run): the match with its confidence and the
  runners-up, or, when no tag reaches the threshold, the nearest ones (exit 1).

Thin, as the other client commands: one call, then printing; ``--json`` prints the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import click
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agent_reach.cli import render
from agent_reach.cli.common import ExitCode, client_options, json_option, reach, stdout
from agent_reach.errors import NoCapableAgent
from agent_reach.intents.dictionary import IntentDictionary, load_dictionary

__all__ = ["intents", "intents_table", "match_view"]


@click.group(invoke_without_command=True)
@client_options
@click.pass_context
def intents(ctx: click.Context, gateway: str, token: str | None, as_json: bool) -> None:
    """The intent dictionary: list what the gateway knows, check a file, match words.

    Without a subcommand: the list (as `intents list`): every tag of the gateway's dictionary
    and every tag an agent registered outside it, with how many endpoints serve each and how
    many of them are routable now.
    """
    if ctx.invoked_subcommand is None:
        _list(gateway, token, as_json)


@intents.command("list")
@client_options
def list_(gateway: str, token: str | None, as_json: bool) -> None:
    """Every tag the gateway knows (GET /v1/intents), with who serves it."""
    _list(gateway, token, as_json)


def _list(gateway: str, token: str | None, as_json: bool) -> None:
    answer = reach(gateway, token, lambda client: client.get("/v1/intents"))
    if as_json:
        click.echo(render.to_json(answer))
        return
    out = stdout()
    out.print(intents_table(answer), soft_wrap=True)


@intents.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@json_option("print the entries as JSON ({path, entries: [...]})")
def check(file: Path, as_json: bool) -> None:
    """Read a dictionary FILE as the gateway would: print its entries (exit 0) or what is
    wrong and on which line (exit 2). Offline: no gateway is asked."""
    dictionary = load_dictionary(str(file))  # DictionaryError: "Error: ... line N: ...", exit 2
    if as_json:
        click.echo(render.to_json(_dictionary_body(dictionary)))
        return
    out = stdout()
    out.print(_check_view(str(file), dictionary), soft_wrap=True)


@intents.command("match")
@click.argument("text")
@click.option(
    "--intent",
    metavar="TAG",
    help="the tag a caller would send with the words (matched exactly or by alias first)",
)
@click.option(
    "--no-fallback",
    is_flag=True,
    help="as a caller sending fallback: false (an exact match only)",
)
@client_options
def match(
    gateway: str,
    token: str | None,
    as_json: bool,
    text: str,
    intent: str | None,
    no_fallback: bool,
) -> None:
    """The tags the gateway matches TEXT to now, with their confidences (a dry run of
    GET /v1/route?intent_text=TEXT: nothing is delivered).

    Exit 0 with the match (and the runners-up); exit 1 when no tag reaches the gateway's
    confidence threshold, printing the nearest tags (the suggestions of no_capable_agent).
    """
    query = {"intent_text": text}
    if intent is not None:
        query["intent"] = intent
    if no_fallback:
        query["fallback"] = "false"
    path = f"/v1/route?{urlencode(query)}"
    try:
        answer = reach(gateway, token, lambda client: client.get(path))
    except NoCapableAgent as exc:  # an answer, not a failure of the command: shown as one
        if as_json:
            click.echo(render.to_json(exc.to_body()))
        else:
            stdout().print(refusal_view(text, exc.fields.get("suggestions")), soft_wrap=True)
        raise click.exceptions.Exit(ExitCode.ERROR) from None
    if as_json:
        click.echo(render.to_json(answer))
        return
    stdout().print(match_view(text, answer), soft_wrap=True)


# --- what is printed (pure) --------------------------------------------------------------------


def _confidence(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "?"


def intents_table(answer: Mapping[str, Any]) -> RenderableType:
    """``GET /v1/intents`` as a table: tag, in the dictionary or not, endpoints routable of
    those serving it, aliases, deprecation, description."""
    rows = [i for i in answer.get("intents", ()) if isinstance(i, Mapping)]
    mode = answer.get("mode", "?")
    if not rows:
        return Text(f"no intents (mode {mode}): no dictionary, and no agent registered")
    known = sum(1 for i in rows if i.get("known"))
    table = Table(
        title=f"{len(rows)} intent{'s' if len(rows) != 1 else ''}: {known} in the dictionary, "
        f"mode {mode}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )
    table.add_column("tag", no_wrap=True)
    table.add_column("dictionary", no_wrap=True)
    table.add_column("routable/served", justify="right", no_wrap=True)
    table.add_column("aliases", overflow="fold")
    table.add_column("description", overflow="fold")
    for item in rows:
        served, routable = item.get("served_by", 0), item.get("routable", 0)
        where = Text("yes") if item.get("known") else Text("no", style="yellow")
        if item.get("deprecated"):
            replaced = item.get("replaced_by")
            where = Text(f"deprecated{f' -> {replaced}' if replaced else ''}", style="yellow")
        count = Text(f"{routable}/{served}", style="" if routable or not served else "red")
        table.add_row(
            Text(str(item.get("tag", "?"))),
            where,
            count,
            Text(", ".join(item.get("aliases", ()))),
            Text(str(item.get("description", ""))),
        )
    return table


def _dictionary_body(dictionary: IntentDictionary) -> dict[str, Any]:
    return {
        "ok": True,
        "path": dictionary.path,
        "entries": [
            {
                "tag": e.tag,
                "description": e.description,
                "aliases": list(e.aliases),
                "examples": list(e.examples),
                "deprecated": e.deprecated,
                "replaced_by": e.replaced_by,
                "hedge_after_ms": e.hedge_after_ms,
            }
            for e in dictionary
        ],
    }


def _check_view(path: str, dictionary: IntentDictionary) -> RenderableType:
    entries = list(dictionary)
    deprecated = sum(1 for e in entries if e.deprecated)
    head = Text(
        f"{path}: ok, {len(entries)} entr{'ies' if len(entries) != 1 else 'y'}, "
        f"{len(dictionary.aliases)} alias{'es' if len(dictionary.aliases) != 1 else ''}"
        + (f", {deprecated} deprecated" if deprecated else "")
    )
    if not entries:
        return head
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    table.add_column("tag", no_wrap=True)
    table.add_column("aliases", overflow="fold")
    table.add_column("examples", justify="right", no_wrap=True)
    table.add_column("description", overflow="fold")
    for e in entries:
        note = f" (deprecated{f' -> {e.replaced_by}' if e.replaced_by else ''})"
        table.add_row(
            Text(e.tag + (note if e.deprecated else "")),
            Text(", ".join(e.aliases)),
            Text(str(len(e.examples))),
            Text(e.description),
        )
    return Group(head, table)


def _scored(items: Any) -> list[tuple[str, Any]]:
    """``[{"tag", "confidence"}, ...]`` as pairs (what is not of that shape left out)."""
    if not isinstance(items, list):
        return []
    return [
        (str(i["tag"]), i.get("confidence"))
        for i in items
        if isinstance(i, Mapping) and isinstance(i.get("tag"), str)
    ]


def _lines(pairs: Iterable[tuple[str, Any]]) -> list[Text]:
    return [Text(f"  {_confidence(c)}  {tag}") for tag, c in pairs]


def match_view(text: str, answer: Mapping[str, Any]) -> RenderableType:
    """A ``/v1/route`` answer for words: the match (method, tag, confidence), where it would
    go, and the runners-up (the answer's ``runners_up``, else its candidates' other tags)."""
    found = answer.get("match") if isinstance(answer.get("match"), Mapping) else None
    tag = str(found.get("tag")) if found else str(answer.get("intent", "?"))
    method = str(found.get("method", "?")) if found else "?"
    confidence = found.get("confidence") if found else None
    lines: list[RenderableType] = [
        Text(f"{text!r}"),
        Text(f"  {_confidence(confidence)}  {tag}  ({method} match)", style="bold"),
    ]
    chosen = answer.get("chosen")
    if chosen:
        lines.append(Text(f"  would go to {chosen}"))
    runners = _scored(answer.get("runners_up"))
    if not runners and found:
        runners = _scored(found.get("runners_up"))
    if not runners:
        seen = {tag}
        for candidate in answer.get("candidates", ()):
            m = candidate.get("match") if isinstance(candidate, Mapping) else None
            if isinstance(m, Mapping) and isinstance(m.get("tag"), str) and m["tag"] not in seen:
                seen.add(m["tag"])
                runners.append((m["tag"], m.get("confidence")))
    if runners:
        lines.append(Text("runners-up:"))
        lines += _lines(runners)
    return Group(*lines)


def refusal_view(text: str, suggestions: Sequence[Any] | None) -> RenderableType:
    """A ``no_capable_agent`` answer for words: no tag reached the threshold; the nearest."""
    near = _scored(list(suggestions or []))
    lines: list[RenderableType] = [
        Text(f"{text!r}"),
        Text("  no tag reaches the confidence threshold (no_capable_agent)", style="red"),
    ]
    if near:
        lines.append(Text("nearest:"))
        lines += _lines(near)
    return Group(*lines)
