"""The demo agents and the stack that `make run` and `agent-reach demo` start.

Shipped inside the package so that ``agent-reach demo`` works from an install, not only from a
checkout. Each agent is a module runnable as ``python -m agent_reach.demo.weather`` (``note``,
``scheduler``, ``air``) with ``--gateway``, ``--id`` and ``--port``; with ``AGENT_REACH_SERVE``
set to a ``nats://`` server it serves over NATS instead (the stack does so for ``air``).
"""
