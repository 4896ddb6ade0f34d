"""Fresh ids for messages and traces, made where a request starts (gateway, client, agent)."""

from __future__ import annotations

import os

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    """A fresh random id such as ``trace_5f1c...`` (128 random bits, as hex).

    Made by whoever starts a request, so that every answer, error or not, can name it.
    """
    return f"{prefix}_{os.urandom(16).hex()}"
