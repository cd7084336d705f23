"""OpenTelemetry traces: on with vLLM's flag, `--otlp-traces-endpoint`, off and free
otherwise.

`Tracing.from_settings` builds the server's tracer when the flag is given: the
OpenTelemetry SDK's `TracerProvider` with a batching processor and the OTLP exporter
that vLLM's own tracing picks for the same endpoint (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`:
`grpc`, the default, or `http/protobuf`; plain gRPC unless the endpoint is `https://`),
so that one flag sends the server's spans and vLLM's to one receiver. The SDK's own
environment variables apply as everywhere (`OTEL_SERVICE_NAME`, default `switchboard`;
`OTEL_TRACES_SAMPLER`, default parent-based always-on; `OTEL_EXPORTER_OTLP_TRACES_HEADERS`;
`OTEL_BSP_*`). The provider is the server's own, not the process's global one: vLLM sets
that to its own, for its engine spans (`llm_request`), which are children of ours through
the W3C context each engine request carries (`EngineTrace`).

With the flag absent, `from_settings` is None and nothing of OpenTelemetry's runs: the
code that would trace checks `record.span is not None` and does nothing else.

Spans are ended with their attributes and events all at once, at the request's end
(`app.telemetry.record`): a stream's tokens cost the tracer nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app import __version__
from app.config import Settings
from app.errors import ConfigError

logger = logging.getLogger(__name__)

ENDPOINT_ARG = "otlp_traces_endpoint"  # vLLM's engine argument (--otlp-traces-endpoint)
_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
_HEADERS = ("traceparent", "tracestate")


class Tracing:
    """The server's tracer."""

    def __init__(self, processor: SpanProcessor) -> None:
        self._provider = TracerProvider(resource=_resource())
        self._provider.add_span_processor(processor)
        self.tracer: Tracer = self._provider.get_tracer("switchboard", __version__)
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracing | None:
        """The tracer `--otlp-traces-endpoint` asks for; None without it."""
        endpoint = settings.engine_args.get(ENDPOINT_ARG)
        if not endpoint:
            return None
        return cls(BatchSpanProcessor(exporter(str(endpoint))))

    def parent(self, carrier: Mapping[str, str]) -> Context | None:
        """The caller's context from its W3C headers (`traceparent`, `tracestate`); None
        when it sent none (the span is then a trace's root)."""
        if "traceparent" not in carrier:
            return None
        return self._propagator.extract(carrier)

    def start(
        self, name: str, parent: Context | None, start_ns: int, kind: SpanKind = SpanKind.SERVER
    ) -> Span:
        return self.tracer.start_span(name, context=parent, kind=kind, start_time=start_ns)

    def headers(self, span: Span) -> dict[str, str]:
        """The W3C headers that make a span (the engine's) a child of `span`."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return carrier

    def flush(self) -> None:
        self._provider.force_flush()

    def shutdown(self) -> None:
        """Export what is left, then stop."""
        self._provider.shutdown()


def exporter(endpoint: str) -> SpanExporter:
    """The OTLP exporter vLLM's tracing makes of `endpoint`."""
    protocol = os.environ.get(_PROTOCOL, "grpc")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as OTLPHttpSpanExporter,
        )

        return OTLPHttpSpanExporter(endpoint=endpoint)
    raise ConfigError(f"{_PROTOCOL}={protocol!r}: the traces go over grpc or http/protobuf")


def carrier_of(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The W3C trace headers among an ASGI request's raw headers."""
    found: dict[str, str] = {}
    for name, value in headers:
        if name == b"traceparent" or name == b"tracestate":
            found[name.decode()] = value.decode("latin-1")
    return found


def carrier_of_metadata(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """The W3C trace headers among a gRPC call's metadata."""
    return {key: value for key, value in metadata if key in _HEADERS and isinstance(value, str)}


def _resource() -> Resource:
    """The SDK's resource (its environment variables), named `switchboard` unless they
    name it."""
    detected = OTELResourceDetector().detect()
    if SERVICE_NAME in detected.attributes:
        return Resource.create({SERVICE_VERSION: __version__})
    return Resource.create({SERVICE_NAME: "switchboard", SERVICE_VERSION: __version__})
