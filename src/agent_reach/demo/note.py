"""Demo agent: ``note.create`` and ``note.query`` over an in-memory notebook.

``note.create`` has a side effect; the SDK's msg_id deduplication makes a retried delivery return
the first answer instead of creating the note twice.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from agent_reach.demo._cli import main
from agent_reach.sdk import Agent, ReachContext, Reject

__all__ = ["build"]


def build(gateway: str | None, endpoint_id: str = "agent://note-01", port: int = 0) -> Agent:
    """The note agent, not yet started (its notebook lives as long as the process)."""
    agent = Agent(
        endpoint_id,
        gateway=gateway,
        port=port,
        description="Notes: create a note, query notes by text",
    )
    notes: dict[int, dict[str, str]] = {}
    ids = itertools.count(1)
    lock = threading.Lock()  # sync handlers run on several worker threads

    @agent.handle("note.create")
    def create(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise Reject("payload needs a text", status=422)
        with lock:
            note_id = next(ids)
            notes[note_id] = {"text": payload["text"], "title": str(payload.get("title", ""))}
        return {"id": note_id, "created": True}

    @agent.handle("note.query")
    def query(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        text = str(payload.get("text", "")) if isinstance(payload, dict) else ""
        with lock:
            found = [{"id": k, **v} for k, v in notes.items() if text in v["text"]]
        return {"notes": found}

    return agent


if __name__ == "__main__":
    main(build, "agent://note-01")
