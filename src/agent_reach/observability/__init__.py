"""Logs, trace context and OpenTelemetry: what every hop of a request says about it."""
