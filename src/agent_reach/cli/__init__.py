"""The agent-reach command: ``main`` (serve, client commands, auth, doctor, demo) and the
terminal rendering of the API's answers."""
