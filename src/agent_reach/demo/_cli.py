"""The command line every demo agent shares: ``--gateway``, ``--id``, ``--port``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from agent_reach.observability import logs
from agent_reach.sdk import Agent

__all__ = ["main"]

Build = Callable[[str | None, str, int], Agent]


def main(build: Build, default_id: str) -> None:
    """Parse the flags, build the agent with ``build(gateway, endpoint_id, port)``, run it."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", default=None, help="gateway URL [$AGENT_REACH_GATEWAY]")
    parser.add_argument("--id", default=default_id, help="endpoint id")
    parser.add_argument("--port", type=int, default=0, help="port to serve on (0: any free)")
    args = parser.parse_args()
    logs.configure("INFO")  # JSON lines on stderr, each with its request's trace id
    build(args.gateway, args.id, args.port).run()
