"""The A2A edge: the gateway as an A2A 1.0 agent (its card, ``POST /a2a``), :mod:`.edge`."""
