"""The MCP edge: the four tools of the contract for LLM hosts, at ``/mcp`` (streamable HTTP,
:mod:`.edge`) and over stdio (``agent-reach mcp``, :mod:`.stdio`), with the ``mcp`` SDK."""
