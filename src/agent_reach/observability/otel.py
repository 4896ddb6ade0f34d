"""Optional OpenTelemetry trace export (the ``otel`` extra): the switch, and the tracers it gives.

Off by default. It is on when the standard environment asks for trace export
(:func:`requested`): ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``, or, without
that variable, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set;
``OTEL_SDK_DISABLED=true`` turns it off whatever else is set.

Off, :func:`gateway_tracer` and :func:`agent_tracer` return None, and nothing imports
``opentelemetry``: the gateway and the agent SDK hold None and test it once per request and per
attempt (that is the whole cost). On, the spans are made by `observability.spans` (the only
module that imports OpenTelemetry) on the process's global tracer provider: the application's
when it installed one (its own code, or ``opentelemetry-instrument``), else one installed here
with the exporters ``OTEL_TRACES_EXPORTER`` names (``otlp``, the default, and ``console``), a
batch span processor, and ``OTEL_SERVICE_NAME`` (default: ``agent-reach-gateway`` for a gateway,
the agent's name for an agent). Every other ``OTEL_*`` variable (endpoint, protocol, headers,
sampler, batch sizes, resource attributes) is read by the OpenTelemetry SDK itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agent_reach.observability.logs import log

if TYPE_CHECKING:
    from agent_reach.observability.spans import AgentTracer, GatewayTracer

__all__ = ["GATEWAY_SERVICE_NAME", "agent_tracer", "gateway_tracer", "requested"]

GATEWAY_SERVICE_NAME = "agent-reach-gateway"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def requested(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for trace export (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(name.strip() not in ("", "none") for name in exporters.split(","))
    return any(environ.get(name, "").strip() for name in _ENDPOINTS)


def gateway_tracer(environ: Mapping[str, str] | None = None) -> GatewayTracer | None:
    """The gateway's tracer when ``environ`` (default: the process's) asks for export, else
    None (also when the ``otel`` extra is not installed: a warning says so)."""
    environ = os.environ if environ is None else environ
    if not requested(environ) or not _importable():
        return None
    from agent_reach.observability.spans import GatewayTracer, tracer

    return GatewayTracer(tracer(GATEWAY_SERVICE_NAME, environ))


def agent_tracer(endpoint_id: str, environ: Mapping[str, str] | None = None) -> AgentTracer | None:
    """An SDK agent's tracer, on the same terms as :func:`gateway_tracer`; the service name
    defaults to the agent's name (``agent://weather-01`` -> ``weather-01``)."""
    environ = os.environ if environ is None else environ
    if not requested(environ) or not _importable():
        return None
    from agent_reach.observability.spans import AgentTracer, tracer

    return AgentTracer(tracer(endpoint_id.removeprefix("agent://"), environ), endpoint_id)


def _importable() -> bool:
    try:
        import agent_reach.observability.spans  # noqa: F401 - imports OpenTelemetry
    except ImportError as exc:
        log(
            logging.WARNING,
            "otel.unavailable",
            detail="OTEL_* variables ask for trace export, but the OpenTelemetry packages are "
            "missing: pip install 'agent-reach-gateway[otel]'",
            error=str(exc),
        )
        return False
    return True
