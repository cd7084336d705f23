"""`app.telemetry.otlp`: the wire encoding of a batch of spans is the request the SDK's own
OTLP encoder makes of it, field for field (spans as the server makes them and as vLLM
makes its `llm_request`; every value type, events, statuses, parents local and remote, a
trace state, links, two resources and scopes); vLLM's spans of the process go out through
the server's processor (`Tracing.lend_to_vllm`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.telemetry.otlp import GrpcSpanExporter, encode

ROOT = Path(__file__).resolve().parents[2]


class _Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        assert isinstance(spans, (list, tuple))
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _provider(kept: _Kept, **resource: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    return provider


def _spans() -> list[ReadableSpan]:
    kept = _Kept()
    ours = _provider(kept, **{"service.name": "switchboard"}).get_tracer("switchboard", "1.0")
    caller = TraceContextTextMapPropagator().extract(
        {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "vendor=value,other=1",
        }
    )
    server = ours.start_span("chat tiny", context=caller, kind=SpanKind.SERVER, start_time=10)
    server.set_attributes(
        {
            "switchboard.request_id": "r-1",
            "gen_ai.usage.input_tokens": 128,
            "gen_ai.server.time_to_first_token": 0.125,
            "gen_ai.response.finish_reasons": ["length", "stop"],
            "flag": True,
            "off": False,
            "negative": -3,
            "large": 2**62,
            "ratios": (0.5, 1.5),
            "unicode": "tokens \u00e9\u4e2d",
            "long": "a request id of more than 127 bytes " * 8,
            "port": 51234,
            "empty": "",
        }
    )
    for at, name in enumerate(("admitted", "prompt_built", "written")):
        server.add_event(name, timestamp=20 + at)
    server.add_event("with attributes", {"n": 1}, timestamp=30)
    server.end(40)
    failed = ours.start_span("POST /v1/chat/completions", start_time=50)
    failed.set_status(Status(StatusCode.ERROR, "the engine failed"))
    failed.end(60)
    ok = ours.start_span("GET /health", start_time=70)
    ok.set_status(Status(StatusCode.OK))
    ok.end(80)
    linked = ours.start_span(
        "linked", links=[Link(server.get_span_context(), {"why": "a"})], start_time=90
    )
    linked.end(100)
    # vLLM's: another provider (resource) and scope, a local parent, asked for its tracer
    # anew for each span (equal scopes, new objects), no scope version.
    engine = _provider(kept, **{"vllm.process_id": "1"})
    parent = set_span_in_context(server)
    for index in range(3):
        span = engine.get_tracer("vllm.tracing.otel").start_span(
            "llm_request", context=parent, kind=SpanKind.SERVER, start_time=12
        )
        span.set_attributes({"gen_ai.request.id": f"r-1-{index}", "gen_ai.request.n": 1})
        span.end(38)
    unscoped = _provider(kept).get_tracer("")
    unscoped.start_span("bare").end()
    return kept.spans


def test_a_batch_encodes_as_the_sdk_encodes_it() -> None:
    spans = _spans()
    assert len({id(span.resource) for span in spans}) == 3
    ours = ExportTraceServiceRequest.FromString(encode(spans))
    assert ours == encode_spans(spans), ours
    # Each span alone, and the batch again (the resources and scopes kept from before).
    for span in spans:
        assert ExportTraceServiceRequest.FromString(encode([span])) == encode_spans([span])


def test_the_exporter_sends_the_wire_encoding() -> None:
    spans = _spans()
    exporter = GrpcSpanExporter(endpoint="127.0.0.1:1", insecure=True)
    try:
        assert exporter._translate_data(spans) == encode_spans(spans)
        assert exporter._translate_data(spans[:2]) == encode_spans(spans[:2])
    finally:
        exporter.shutdown()


_LENT = """
import logging
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from app.telemetry.tracing import Tracing

warnings = []
logging.getLogger("opentelemetry.trace").addHandler(
    type("H", (logging.Handler,), {"emit": lambda self, r: warnings.append(r.getMessage())})()
)
kept = InMemorySpanExporter()
tracing = Tracing(SimpleSpanProcessor(kept))
from vllm.tracing import extract_trace_context, init_tracer, instrument_manual

def request():
    ours = tracing.start("chat tiny", None, 1)
    instrument_manual(
        "llm_request", 2, 3, {"gen_ai.request.id": "r-0"},
        extract_trace_context(tracing.headers(ours)), SpanKind.SERVER,
    )
    ours.end(4)
    for span in kept.get_finished_spans():
        resource = span.resource.attributes
        print(span.name, span.parent.span_id == ours.get_span_context().span_id
              if span.parent else "-", resource.get("service.name"),
              resource.get("vllm.instrumenting_module_name"))
    kept.clear()

request()  # not lent yet: vLLM's span goes to the process's default provider
print("lent")
tracing.lend_to_vllm()
# What vLLM's engine does as it starts (without it, its span would be exported, and
# retried, to nowhere at exit).
init_tracer("vllm.llm_engine", "127.0.0.1:1")
request()
print("warnings", warnings)
"""


def test_vllms_spans_go_out_through_the_servers_exporter_under_its_resource() -> None:
    """vLLM's `llm_request`, made with the process's global provider once its engine has
    set up its tracing, reaches the server's processor, under ours and under vLLM's
    resource (before the lending it does not); vLLM's refused attempt to set its own
    provider logs nothing. One process, which imports vLLM once: the lending is the
    process's, once."""
    assert _run(_LENT) == [
        "chat tiny - switchboard None",
        "lent",
        "llm_request True unknown_service:python vllm.llm_engine",
        "chat tiny - switchboard None",
        "warnings []",
    ]


def _run(script: str, *args: str) -> list[str]:
    """`script` in a process of its own: the global tracer provider is set once a process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OTEL_SERVICE_NAME", None)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
