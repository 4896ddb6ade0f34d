"""OpenTelemetry spans of the gateway and the agent SDK: the only module that imports
``opentelemetry``, and only `observability.otel` imports it, once tracing is switched on.

The spans of one reach (names and attributes: docs/observing.md, "Tracing")::

    agent_reach.receive    SERVER    gateway, one per POST /v1/send
    ├── agent_reach.route      INTERNAL  the route decision
    ├── agent_reach.attempt    CLIENT    one per delivery attempt; the traceparent sent names it
    │   └── agent_reach.handle     SERVER    agent SDK, one per delivery
    │       └── agent_reach.reach      CLIENT    an onward ctx.reach
    │           └── agent_reach.receive    SERVER    gateway (the onward request) ...
    └── agent_reach.attempt    CLIENT    (a retry or failover)

Parents: the ``traceparent`` a request carries; without a valid one, a remote parent made from
the contract ``trace_id`` (`observability.tracecontext.otel_trace_id`, with a span id taken
from it) so that every hop carrying that ``trace_id`` joins one trace; a gateway request with
neither starts a trace of its own (its ``trace_id`` is then ``trace_`` + the new trace-id).
Contexts are passed explicitly; only the agent's handle span is made current, while the handler
runs, so that the handler's own spans are its children.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Mapping
from importlib import metadata

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from opentelemetry.util.types import AttributeValue

from agent_reach.observability.logs import log
from agent_reach.observability.tracecontext import SAMPLED, TraceParent, onward, otel_trace_id

__all__ = [
    "AgentTracer",
    "AttemptSpan",
    "GatewayTracer",
    "HandleSpan",
    "ReachSpan",
    "ReceiveSpan",
    "build_provider",
    "tracer",
]

Attributes = Mapping[str, AttributeValue | None]
_ROOT = Context()  # an empty context: a span started in it has no parent
_SCOPE = "agent_reach"


def tracer(service_name: str, environ: Mapping[str, str]) -> Tracer:
    """Agent-Reach's tracer on the global tracer provider, installing one first (from
    ``environ``, see :func:`build_provider`) when the application has not."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        trace.set_tracer_provider(build_provider(service_name, environ))
        provider = trace.get_tracer_provider()  # another thread's may have won: use that one
    try:
        version = metadata.version("agent-reach-gateway")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        version = "0"
    return provider.get_tracer(_SCOPE, version)


def build_provider(service_name: str, environ: Mapping[str, str]) -> TracerProvider:
    """A tracer provider with a batch span processor per exporter that
    ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), and ``service_name`` unless
    ``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) names one."""
    named = environ.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(environ):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    names = (environ.get("OTEL_TRACES_EXPORTER", "").strip() or "otlp").lower().split(",")
    out: list[SpanExporter] = []
    for name in dict.fromkeys(n.strip() for n in names):
        if name == "otlp":
            out.append(_otlp(environ))
        elif name == "console":
            out.append(ConsoleSpanExporter())
        elif name not in ("", "none"):
            log(logging.WARNING, "otel.unknown_exporter", exporter=name, known="otlp, console")
    return out


def _otlp(environ: Mapping[str, str]) -> SpanExporter:
    # the Python SDK's convention: gRPC unless a protocol is named
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "grpc"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    if protocol != "http/protobuf":
        log(logging.WARNING, "otel.unknown_protocol", protocol=protocol, used="http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


# --- contexts and headers ----------------------------------------------------------------------


def _remote(trace_hex: str, span_id: int, flags: int) -> Context:
    span_context = SpanContext(
        int(trace_hex, 16), span_id, is_remote=True, trace_flags=TraceFlags(flags)
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context), _ROOT)


def _parent(received: TraceParent | None, trace_id: str | None) -> Context:
    """The received traceparent; else one made from ``trace_id``; else no parent."""
    if received is not None:
        return _remote(received.trace_id, int(received.parent_id, 16), received.flags)
    if trace_id is not None:
        trace_hex = otel_trace_id(trace_id)
        return _remote(trace_hex, int(trace_hex[:16], 16) or 1, SAMPLED)
    return _ROOT


def _header(span: Span) -> str | None:
    """The traceparent naming ``span`` (None for an invalid span: a no-op tracer provider)."""
    sc = span.get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & SAMPLED:02x}"


def _attrs(attributes: Attributes) -> dict[str, AttributeValue]:
    return {k: v for k, v in attributes.items() if v is not None}


def _outcome(span: Span, outcome: str, detail: str | None = None) -> None:
    span.set_attribute("agent_reach.outcome", outcome)
    if outcome != "ok":
        span.set_attribute("error.type", outcome)
        span.set_status(Status(StatusCode.ERROR, detail or outcome))


# --- gateway -----------------------------------------------------------------------------------


class GatewayTracer:
    """Makes the gateway's spans: one :class:`ReceiveSpan` per ``/v1/send``."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def receive(
        self, received: TraceParent | None, trace_id: str | None, attributes: Attributes
    ) -> ReceiveSpan:
        """Start the request's server span (see the module docstring for its parent)."""
        span = self._tracer.start_span(
            "agent_reach.receive",
            _parent(received, trace_id),
            SpanKind.SERVER,
            _attrs(attributes),
        )
        return ReceiveSpan(self._tracer, span, received)


class ReceiveSpan:
    """The server span of one ``/v1/send``, and the route and attempt spans under it."""

    __slots__ = ("_context", "_received", "_route_start", "_span", "_tracer")

    def __init__(self, tracer: Tracer, span: Span, received: TraceParent | None) -> None:
        self._tracer = tracer
        self._span = span
        self._received = received
        self._context = trace.set_span_in_context(span, _ROOT)
        self._route_start: int | None = None

    @property
    def trace_hex(self) -> str | None:
        """The span's trace-id (32 hex), None for an invalid span."""
        sc = self._span.get_span_context()
        return f"{sc.trace_id:032x}" if sc.is_valid else None

    def planning(self) -> None:
        """The route decision starts now."""
        self._route_start = time.time_ns()

    def route(self, attributes: Attributes) -> None:
        """Record the route decision as a span from :meth:`planning` to now."""
        self._tracer.start_span(
            "agent_reach.route",
            self._context,
            SpanKind.INTERNAL,
            _attrs(attributes),
            start_time=self._route_start,
        ).end()

    def attempt(self, trace_id: str, attributes: Attributes) -> AttemptSpan:
        """Start one delivery attempt's client span; its traceparent goes to the agent."""
        span = self._tracer.start_span(
            "agent_reach.attempt", self._context, SpanKind.CLIENT, _attrs(attributes)
        )
        header = _header(span) or onward(trace_id, self._received)
        return AttemptSpan(span, header)

    def retry(self, kind: str, endpoint_id: str, wait_s: float) -> None:
        """Note a retry (``failover`` or ``same_endpoint``) as an event of the request."""
        self._span.add_event(
            "agent_reach.retry",
            {
                "agent_reach.retry_kind": kind,
                "agent_reach.endpoint_id": endpoint_id,
                "agent_reach.wait_ms": round(wait_s * 1000.0, 3),
            },
        )

    def answered(self, outcome: str, attributes: Attributes, detail: str | None = None) -> None:
        """The request's outcome (``ok`` or the error code) and what came of it."""
        self._span.set_attributes(_attrs(attributes))
        _outcome(self._span, outcome, detail)

    def end(self) -> None:
        """End the server span."""
        self._span.end()


class AttemptSpan:
    """The client span of one delivery attempt; :attr:`traceparent` is the header sent."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Span, traceparent: str) -> None:
        self._span = span
        self.traceparent = traceparent

    def end(
        self, outcome: str, latency_ms: float, status: int | None = None, detail: str = ""
    ) -> None:
        """Record the attempt's outcome, latency and HTTP status, and end it."""
        span = self._span
        span.set_attribute("agent_reach.latency_ms", round(latency_ms, 3))
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        _outcome(span, outcome, detail)
        span.end()


# --- agent SDK ---------------------------------------------------------------------------------


class AgentTracer:
    """Makes an SDK agent's spans: one :class:`HandleSpan` per delivery."""

    def __init__(self, tracer: Tracer, endpoint_id: str) -> None:
        self._tracer = tracer
        self.endpoint_id = endpoint_id

    def handle(
        self, received: TraceParent | None, trace_id: str, attributes: Attributes
    ) -> HandleSpan:
        """Start a delivery's server span: a child of the span current in the application
        (its own HTTP instrumentation) when there is one, else as the module docstring says."""
        current = trace.get_current_span().get_span_context().is_valid
        span = self._tracer.start_span(
            "agent_reach.handle",
            None if current else _parent(received, trace_id),
            SpanKind.SERVER,
            _attrs({"agent_reach.endpoint_id": self.endpoint_id, **attributes}),
        )
        fallback = received.header if received is not None else None
        return HandleSpan(self._tracer, span, _header(span) or fallback)


class HandleSpan:
    """The server span of one delivery; :attr:`traceparent` names it for onward reaches."""

    __slots__ = ("_ended", "_span", "_token", "_tracer", "traceparent")

    def __init__(self, tracer: Tracer, span: Span, traceparent: str | None) -> None:
        self._tracer = tracer
        self._span = span
        self._token: contextvars.Token[Context] | None = None
        self._ended = False
        self.traceparent = traceparent

    def __enter__(self) -> HandleSpan:
        """Make the span current (the handler's own spans become its children)."""
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        """Make it no longer current; end it if an exception (cancellation) cut it short."""
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        if kind is not None and not self._ended:
            self._ended = True
            _outcome(self._span, kind.__name__)
            self._span.end()

    def note(self, key: str, value: AttributeValue) -> None:
        """Set one attribute (``agent_reach.`` is prefixed)."""
        self._span.set_attribute(f"agent_reach.{key}", value)

    def answered(self, status: int, body: bytes) -> None:
        """Record the delivery's answer (the error code of an error answer) and end the span."""
        span = self._span
        span.set_attribute("http.response.status_code", status)
        outcome = "ok"
        detail = None
        if status >= 400:
            try:
                answer = msgspec.json.decode(body)
            except msgspec.DecodeError:
                answer = None
            if isinstance(answer, dict):
                outcome = str(answer.get("error") or status)
                detail = str(answer.get("detail") or "")
            else:
                outcome = str(status)
        _outcome(span, outcome, detail)
        self._ended = True
        span.end()

    def reach(self, intent: str, trace_id: str) -> ReachSpan:
        """Start the client span of an onward reach made by the handler."""
        span = self._tracer.start_span(
            "agent_reach.reach",
            trace.set_span_in_context(self._span, _ROOT),
            SpanKind.CLIENT,
            {"agent_reach.intent": intent, "agent_reach.trace_id": trace_id},
        )
        return ReachSpan(span, _header(span) or self.traceparent)


class ReachSpan:
    """The client span of an onward reach; :attr:`traceparent` is the header it sends."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Span, traceparent: str | None) -> None:
        self._span = span
        self.traceparent = traceparent

    def end(self, outcome: str, endpoint_id: str | None = None, detail: str | None = None) -> None:
        """Record the outcome (``ok`` or the error code) and the endpoint that answered."""
        if endpoint_id is not None:
            self._span.set_attribute("agent_reach.endpoint_id", endpoint_id)
        _outcome(self._span, outcome, detail)
        self._span.end()
