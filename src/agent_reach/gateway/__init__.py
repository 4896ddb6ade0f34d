"""The gateway: service (core + registry + transport), delivery loop and HTTP edge."""
