"""Example agent: note.create and note.query over an in-memory notebook."""

from __future__ import annotations

import argparse
import itertools

from agent_reach import logs
from agent_reach.sdk import Agent, ReachContext, Reject

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", default="http://127.0.0.1:7700")
parser.add_argument("--id", default="agent://note-01")
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()

agent = Agent(
    args.id,
    gateway=args.gateway,
    port=args.port,
    description="Notes: create a note, query notes by text",
)
notes: dict[int, dict[str, str]] = {}
by_msg: dict[str, int] = {}  # msg_id -> note id: a retried delivery creates nothing twice
ids = itertools.count(1)


@agent.handle("note.create")
def create(payload: dict[str, str], ctx: ReachContext) -> dict[str, object]:
    if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
        raise Reject("payload needs a text", status=422)
    if ctx.msg_id in by_msg:
        return {"id": by_msg[ctx.msg_id], "created": False}
    note_id = next(ids)
    notes[note_id] = {"text": payload["text"], "title": str(payload.get("title", ""))}
    by_msg[ctx.msg_id] = note_id
    return {"id": note_id, "created": True}


@agent.handle("note.query")
def query(payload: dict[str, str], ctx: ReachContext) -> dict[str, object]:
    text = str(payload.get("text", "")) if isinstance(payload, dict) else ""
    return {"notes": [{"id": k, **v} for k, v in notes.items() if text in v["text"]]}


if __name__ == "__main__":
    logs.configure("INFO")  # JSON lines on stderr, with each request's trace id
    agent.run()
