"""Trace propagation and OpenTelemetry export.

A W3C traceparent goes in at the gateway; the same trace reaches the agent (real processes that
answer what they saw), its onward reaches, and the exporter: the OpenTelemetry SDK's in-memory
exporter for a gateway and an SDK agent run in this process, and the console exporter of real
gateway and agent processes. Needs the ``otel`` extra (part of ``test``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib import error, request

import aiohttp
import pytest
from aiohttp import web

from agent_reach.edges.http.app import HttpEdge
from agent_reach.gateway.node import Node
from agent_reach.observability.tracecontext import otel_trace_id, parse_traceparent
from agent_reach.sdk import Agent, ReachContext
from agent_reach.settings import GatewaySettings
from tests.agents.sdk_support import HERE
from tests.federation_support import directory, domain_flags
from tests.support import Proc, _start, gateway, start_agent

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from agent_reach.observability import spans as _otel

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{SPAN}-01"
TRACE_AGENT = HERE / "trace_agent.py"

_exporter: InMemorySpanExporter | None = None


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter of this process's tracer provider, with export switched on.

    The provider stands for an application's own OpenTelemetry set-up, which Agent-Reach uses
    as it is; OTEL_TRACES_EXPORTER is what an operator sets to switch export on.
    """
    global _exporter
    if _exporter is None:
        provider = TracerProvider()
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)  # once per process: OpenTelemetry's rule
        if trace.get_tracer_provider() is not provider:
            pytest.skip("another tracer provider is installed in this process")
        _exporter = memory
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    _exporter.clear()
    yield _exporter
    _exporter.clear()


# --- in process: a gateway and an SDK agent on 127.0.0.1 ----------------------------------------


@asynccontextmanager
async def serving(settings: GatewaySettings | None = None) -> AsyncIterator[str]:
    """A gateway on 127.0.0.1, a free port, in this event loop; yields its URL."""
    node = Node(settings or GatewaySettings(port=0))
    http = HttpEdge(node)
    await node.start()
    runner = web.ServerRunner(web.Server(http.handle, access_log=None), handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        if node.membership is not None:  # federation: it publishes once it listens (as serve)
            node.membership.serving(url)
        yield url
    finally:
        await runner.cleanup()
        await node.close()


def traced_agent(url: str, endpoint_id: str = "agent://otel-01") -> Agent:
    agent = Agent(endpoint_id, gateway=url, shutdown_timeout=0.5)
    work = trace.get_tracer("tests.handler")

    def seen(ctx: ReachContext) -> dict[str, Any]:
        return {"trace_id": ctx.trace_id, "traceparent": ctx.traceparent, "attempt": ctx.attempt}

    @agent.handle("otel.echo")
    async def echo(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        with work.start_as_current_span("handler.work"):  # the handler's own span
            return seen(ctx)

    @agent.handle("otel.relay")
    async def relay(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        reply = await ctx.reach("otel.echo", {})
        return {"mine": seen(ctx), "onward": reply.result}

    @agent.handle("otel.relay_sync")
    def relay_sync(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        reply = ctx.reach_sync("otel.echo", {})
        return {"mine": seen(ctx), "onward": reply.result}

    @agent.handle("otel.flaky")
    async def flaky(payload: Any, ctx: ReachContext) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return seen(ctx)

    return agent


async def post_send(
    url: str, body: dict[str, Any], traceparent: str | None = None
) -> tuple[int, Any]:
    headers = {"traceparent": traceparent} if traceparent else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/send", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def trace_of(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


@pytest.mark.parametrize("relay", ["otel.relay", "otel.relay_sync"])
async def test_one_trace_from_the_callers_traceparent_through_an_onward_reach(
    exporter: InMemorySpanExporter, relay: str
) -> None:
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            status, body = await post_send(url, {"intent": relay}, TRACEPARENT)
        finally:
            await agent.stop()
    assert status == 200, body
    # the contract's trace_id is the traceparent's trace-id, at every hop
    assert body["trace_id"] == TRACE
    mine, onward = body["result"]["mine"], body["result"]["onward"]
    assert mine["trace_id"] == onward["trace_id"] == TRACE

    spans = exporter.get_finished_spans()
    assert {trace_of(s) for s in spans} == {int(TRACE, 16)}  # one trace
    receive = by_name(spans, "agent_reach.receive")
    route = by_name(spans, "agent_reach.route")
    attempt = by_name(spans, "agent_reach.attempt")
    handle = by_name(spans, "agent_reach.handle")
    reach = by_name(spans, "agent_reach.reach")
    work = by_name(spans, "handler.work")
    assert (len(receive), len(route), len(attempt), len(handle), len(reach), len(work)) == (
        2,
        2,
        2,
        2,
        1,
        1,
    )
    first, second = receive
    # the gateway's server span is the caller's span's child
    assert first.kind is SpanKind.SERVER
    assert first.parent is not None and first.parent.is_remote
    assert parent_of(first) == int(SPAN, 16)
    assert parent_of(route[0]) == span_id(first)
    assert parent_of(attempt[0]) == span_id(first)
    # the agent's handle span is the child of the gateway's attempt span, named in its header
    relay_handle = next(s for s in handle if s.attributes["agent_reach.intent"] == relay)
    echo_handle = next(s for s in handle if s.attributes["agent_reach.intent"] == "otel.echo")
    assert relay_handle.kind is SpanKind.SERVER
    assert parent_of(relay_handle) == span_id(attempt[0])
    assert mine["traceparent"] == f"00-{TRACE}-{span_id(attempt[0]):016x}-01"
    # the onward reach: a client span under the handle span, then the gateway again, and so on
    assert reach[0].kind is SpanKind.CLIENT
    assert parent_of(reach[0]) == span_id(relay_handle)
    assert parent_of(second) == span_id(reach[0])
    assert parent_of(attempt[1]) == span_id(second)
    assert parent_of(echo_handle) == span_id(attempt[1])
    assert onward["traceparent"] == f"00-{TRACE}-{span_id(attempt[1]):016x}-01"
    # the handler's own spans are children of the handle span
    assert parent_of(work[0]) == span_id(echo_handle)

    # attributes: endpoint and outcome on the attempts, the decision on the route
    a = attempt[0]
    assert a.kind is SpanKind.CLIENT
    assert a.attributes["agent_reach.endpoint_id"] == "agent://otel-01"
    assert a.attributes["agent_reach.outcome"] == "ok"
    assert a.attributes["agent_reach.attempt"] == 1
    assert a.attributes["http.response.status_code"] == 200
    assert a.attributes["agent_reach.latency_ms"] > 0
    assert str(a.attributes["url.full"]).startswith("http://127.0.0.1:")
    r = route[0]
    assert r.attributes["agent_reach.endpoint_id"] == "agent://otel-01"
    assert r.attributes["agent_reach.candidates"] == 1
    assert r.attributes["agent_reach.per_try_timeout_ms"] == 2000
    assert r.attributes["agent_reach.max_retries"] == 2
    assert first.attributes["agent_reach.intent"] == relay
    assert first.attributes["agent_reach.outcome"] == "ok"
    assert first.attributes["agent_reach.trace_id"] == TRACE
    assert first.attributes["agent_reach.attempts"] == 1
    assert reach[0].attributes["agent_reach.outcome"] == "ok"
    assert reach[0].attributes["agent_reach.endpoint_id"] == "agent://otel-01"
    assert relay_handle.attributes["agent_reach.outcome"] == "ok"
    assert relay_handle.attributes["agent_reach.endpoint_id"] == "agent://otel-01"
    assert all(s.status.status_code is not StatusCode.ERROR for s in spans)


async def test_failed_attempts_and_the_retry_are_recorded(exporter: InMemorySpanExporter) -> None:
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            status, body = await post_send(url, {"intent": "otel.flaky"})
        finally:
            await agent.stop()
    assert status == 200, body
    assert [a["outcome"] for a in body["attempts"]] == ["server_error", "ok"]
    spans = exporter.get_finished_spans()
    (receive,) = by_name(spans, "agent_reach.receive")
    first, second = by_name(spans, "agent_reach.attempt")
    assert first.attributes["agent_reach.outcome"] == "server_error"
    assert first.attributes["error.type"] == "server_error"
    assert first.attributes["http.response.status_code"] == 500
    assert first.status.status_code is StatusCode.ERROR
    assert (second.attributes["agent_reach.attempt"], second.attributes["agent_reach.outcome"]) == (
        2,
        "ok",
    )
    (retry,) = [e for e in receive.events if e.name == "agent_reach.retry"]
    assert retry.attributes is not None
    assert retry.attributes["agent_reach.retry_kind"] == "same_endpoint"
    failed_handle, ok_handle = by_name(spans, "agent_reach.handle")
    assert failed_handle.attributes["agent_reach.outcome"] == "handler_failed"
    assert failed_handle.status.status_code is StatusCode.ERROR
    assert parent_of(failed_handle) == span_id(first)
    assert parent_of(ok_handle) == span_id(second)
    # no traceparent, no trace_id: the gateway's span starts the trace and names the trace_id
    assert receive.parent is None
    assert body["trace_id"] == f"trace_{trace_of(receive):032x}"


async def test_a_forward_to_another_domain_is_an_attempt_span_and_carries_its_traceparent(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # federation: the origin gateway (this process, exporting) forwards to another domain's
    # (a real process, whose agent answers the traceparent it saw); the processes do not
    # export (an OTLP exporter with nothing to take its spans holds their exit 5 s)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    with directory() as d, gateway(*domain_flags("otel-remote", d.url)) as remote:
        agent = start_agent(remote.url, "agent://otel-remote-01", intents="otel.far")
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        try:
            settings = GatewaySettings(
                port=0, domain="otel-origin", directory=d.url, summary_interval=0.5, matcher="none"
            )
            async with serving(settings) as url, aiohttp.ClientSession() as session:
                for _ in range(200):  # the remote's summary read: 10 s at most
                    async with session.get(f"{url}/v1/federation") as resp:
                        peers = (await resp.json())["peers"]
                    if any("otel.far" in p["intents"] and p["reachable"] for p in peers):
                        break
                    await asyncio.sleep(0.05)
                status, body = await post_send(url, {"intent": "otel.far"}, TRACEPARENT)
        finally:
            agent.stop()
    assert status == 200, body
    assert body["endpoint_id"] == "agent://otel-remote-01@otel-remote"
    spans = exporter.get_finished_spans()
    (receive,) = by_name(spans, "agent_reach.receive")
    (attempt,) = by_name(spans, "agent_reach.attempt")
    assert attempt.attributes["agent_reach.domain"] == "otel-remote"
    assert attempt.attributes["agent_reach.outcome"] == "ok"
    assert parent_of(attempt) == span_id(receive)
    assert trace_of(attempt) == int(TRACE, 16)
    seen = parse_traceparent(body["result"]["traceparent"])  # at the other domain's agent
    assert seen is not None and seen.trace_id == TRACE


async def test_an_error_answer_ends_the_request_span_with_its_code(
    exporter: InMemorySpanExporter,
) -> None:
    async with serving() as url:
        status, body = await post_send(url, {"intent": "nobody.serves"}, TRACEPARENT)
    assert (status, body["error"], body["trace_id"]) == (404, "no_capable_agent", TRACE)
    (receive,) = exporter.get_finished_spans()
    assert receive.name == "agent_reach.receive"
    assert receive.attributes["agent_reach.outcome"] == "no_capable_agent"
    assert receive.status.status_code is StatusCode.ERROR
    assert receive.attributes["agent_reach.attempts"] == 0


@pytest.mark.parametrize(
    "trace_id",
    ["trace_20250101_001", f"trace_{TRACE}"],  # not hex: hashed; the gateway's form: its hex
)
async def test_a_body_trace_id_without_traceparent_decides_the_trace(
    exporter: InMemorySpanExporter, trace_id: str
) -> None:
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            status, body = await post_send(url, {"intent": "otel.echo", "trace_id": trace_id})
        finally:
            await agent.stop()
    assert status == 200, body
    assert body["trace_id"] == body["result"]["trace_id"] == trace_id
    expected = otel_trace_id(trace_id)
    if trace_id == "trace_20250101_001":
        assert expected == hashlib.sha256(trace_id.encode()).hexdigest()[:32]
    spans = exporter.get_finished_spans()
    assert {f"{trace_of(s):032x}" for s in spans} == {expected}
    (receive,) = by_name(spans, "agent_reach.receive")
    # a remote parent made from the trace id, the same for every hop that carries it
    assert receive.parent is not None and receive.parent.is_remote
    assert parent_of(receive) == int(expected[:16], 16)


async def test_a_body_trace_id_wins_and_the_traceparent_still_parents(
    exporter: InMemorySpanExporter,
) -> None:
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            body_id = "trace_20250101_001"
            status, body = await post_send(
                url, {"intent": "otel.echo", "trace_id": body_id}, TRACEPARENT
            )
        finally:
            await agent.stop()
    assert status == 200, body
    assert body["trace_id"] == body["result"]["trace_id"] == "trace_20250101_001"
    (receive,) = by_name(exporter.get_finished_spans(), "agent_reach.receive")
    assert f"{trace_of(receive):032x}" == TRACE
    assert parent_of(receive) == int(SPAN, 16)
    assert receive.attributes["agent_reach.trace_id"] == "trace_20250101_001"


async def test_an_invalid_traceparent_is_ignored(exporter: InMemorySpanExporter) -> None:
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            bad = f"00-{TRACE.upper()}-{SPAN}-01"
            status, body = await post_send(url, {"intent": "otel.echo"}, bad)
        finally:
            await agent.stop()
    assert status == 200, body
    assert body["trace_id"].startswith("trace_") and TRACE not in body["trace_id"].lower()
    (receive,) = by_name(exporter.get_finished_spans(), "agent_reach.receive")
    assert receive.parent is None


async def test_off_by_default_no_span_and_the_traceparent_still_travels(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    async with serving() as url:
        agent = traced_agent(url)
        await agent.start()
        try:
            status, body = await post_send(url, {"intent": "otel.relay"}, TRACEPARENT)
        finally:
            await agent.stop()
    assert status == 200, body
    # the handler's own span only (the application's tracing is its own business)
    assert [s.name for s in exporter.get_finished_spans()] == ["handler.work"]
    # a hop that records nothing passes the traceparent on as it came
    assert body["result"]["mine"]["traceparent"] == TRACEPARENT
    assert body["result"]["onward"]["traceparent"] == TRACEPARENT
    assert body["result"]["onward"]["trace_id"] == TRACE


def test_exporters_follow_the_otel_environment() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    def kinds(environ: dict[str, str]) -> list[type[Any]]:
        made = _otel._exporters(environ)
        for exporter in made:
            exporter.shutdown()
        return [type(e) for e in made]

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    assert kinds(endpoint) == [GrpcExporter]  # the Python SDK's default protocol
    assert kinds({**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == [HttpExporter]
    assert kinds({"OTEL_TRACES_EXPORTER": "console"}) == [ConsoleSpanExporter]
    assert kinds({"OTEL_TRACES_EXPORTER": "otlp,console"}) == [GrpcExporter, ConsoleSpanExporter]
    assert kinds({"OTEL_TRACES_EXPORTER": "zipkin,console"}) == [ConsoleSpanExporter]


def test_the_service_name_defaults_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider = _otel.build_provider("agent-reach-gateway", {"OTEL_TRACES_EXPORTER": "none"})
    assert provider.resource.attributes["service.name"] == "agent-reach-gateway"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "edge-gw")
    provider = _otel.build_provider("agent-reach-gateway", dict(os.environ))
    assert provider.resource.attributes["service.name"] == "edge-gw"
    provider.shutdown()


def test_nothing_imports_opentelemetry_while_export_is_off() -> None:
    code = (
        "import sys\n"
        "from agent_reach.edges.http.app import HttpEdge\n"
        "from agent_reach.gateway.node import Node\n"
        "from agent_reach.sdk import Agent\n"
        "from agent_reach.settings import GatewaySettings\n"
        "HttpEdge(Node(GatewaySettings(port=0)))\n"
        "Agent('agent://a')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


# --- real processes: a gateway and an SDK agent, each with the console exporter -----------------


def send_with_traceparent(gw: str, body: dict[str, Any], traceparent: str) -> tuple[int, Any]:
    req = request.Request(
        f"{gw}/v1/send",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "traceparent": traceparent},
    )
    try:
        with request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def without_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def exported_spans(proc: Proc) -> list[dict[str, Any]]:
    """Stop ``proc`` (its tracer provider flushes at exit) and parse the spans it printed."""
    proc.popen.send_signal(signal.SIGTERM)
    proc.popen.wait(15)
    stdout = proc.popen.stdout
    assert stdout is not None
    out = b""
    while chunk := stdout.read():
        out += chunk
    proc.stop()
    text = out.decode()
    decoder = json.JSONDecoder()
    spans = []
    at = text.find("{")
    while at != -1:
        span, end = decoder.raw_decode(text, at)
        spans.append(span)
        at = text.find("{", end)
    return spans


def test_real_processes_propagate_and_export_one_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    without_otel_variables(monkeypatch)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    with gateway() as gw:
        agent = _start([sys.executable, str(TRACE_AGENT), "--gateway", gw.url])
        try:
            status, body = send_with_traceparent(gw.url, {"intent": "trace.relay"}, TRACEPARENT)
        finally:
            agent_spans = exported_spans(agent)
        gateway_spans = exported_spans(gw)
    assert status == 200, body
    mine, onward = body["result"]["mine"], body["result"]["onward"]
    assert body["trace_id"] == mine["trace_id"] == onward["trace_id"] == TRACE
    assert body["result"]["onward_trace_id"] == TRACE

    def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        return sorted((s for s in spans if s["name"] == name), key=lambda s: s["start_time"])

    every = [*gateway_spans, *agent_spans]
    assert {s["context"]["trace_id"] for s in every} == {f"0x{TRACE}"}
    assert {s["resource"]["attributes"]["service.name"] for s in gateway_spans} == {
        "agent-reach-gateway"
    }
    assert {s["resource"]["attributes"]["service.name"] for s in agent_spans} == {"trace-01"}
    first, second = named(gateway_spans, "agent_reach.receive")
    attempt_1, attempt_2 = named(gateway_spans, "agent_reach.attempt")
    relay_handle, echo_handle = named(agent_spans, "agent_reach.handle")
    (reach,) = named(agent_spans, "agent_reach.reach")
    assert first["parent_id"] == f"0x{SPAN}"
    assert attempt_1["parent_id"] == first["context"]["span_id"]
    assert relay_handle["parent_id"] == attempt_1["context"]["span_id"]
    assert reach["parent_id"] == relay_handle["context"]["span_id"]
    assert second["parent_id"] == reach["context"]["span_id"]
    assert attempt_2["parent_id"] == second["context"]["span_id"]
    assert echo_handle["parent_id"] == attempt_2["context"]["span_id"]
    # what the agent saw is the header that named the gateway's attempt span
    seen = parse_traceparent(mine["traceparent"])
    assert seen is not None
    assert f"0x{seen.parent_id}" == attempt_1["context"]["span_id"]


def test_real_processes_without_export_pass_the_traceparent_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without_otel_variables(monkeypatch)
    with gateway() as gw:
        agent = _start([sys.executable, str(TRACE_AGENT), "--gateway", gw.url])
        try:
            results = {
                intent: send_with_traceparent(gw.url, {"intent": intent}, TRACEPARENT)
                for intent in ("trace.relay", "trace.relay_sync")
            }
            # a body trace_id wins for the contract; the traceparent still travels
            status, wins = send_with_traceparent(
                gw.url, {"intent": "trace.echo", "trace_id": "trace_20250101_001"}, TRACEPARENT
            )
            # an invalid traceparent is ignored: the trace_id decides the trace-id sent on
            status_bad, ignored = send_with_traceparent(
                gw.url, {"intent": "trace.echo"}, f"00-{TRACE}-{'0' * 16}-01"
            )
        finally:
            agent.stop()
    for status_relay, body in results.values():
        assert status_relay == 200, body
        assert body["trace_id"] == TRACE
        assert body["result"]["mine"] == {
            "trace_id": TRACE,
            "traceparent": TRACEPARENT,
            "attempt": 1,
        }
        assert body["result"]["onward"]["trace_id"] == TRACE
        assert body["result"]["onward"]["traceparent"] == TRACEPARENT
    assert status == 200, wins
    assert wins["result"]["trace_id"] == "trace_20250101_001"
    assert wins["result"]["traceparent"] == TRACEPARENT
    assert status_bad == 200, ignored
    sent = parse_traceparent(ignored["result"]["traceparent"])
    assert sent is not None
    assert sent.trace_id == otel_trace_id(ignored["trace_id"]) != TRACE
