"""The edges of the gateway: each parses its protocol, calls the service, renders."""
