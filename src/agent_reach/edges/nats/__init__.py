"""The NATS edge: the gateway's API on ``PREFIX.v1.register|heartbeat|deregister|send``."""
