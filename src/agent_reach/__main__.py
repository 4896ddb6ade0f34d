"""``python -m agent_reach``: the same as the ``agent-reach`` command."""

from agent_reach.cli.main import main

if __name__ == "__main__":
    main(prog_name="agent-reach")
