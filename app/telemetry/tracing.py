"""OpenTelemetry traces: on with vLLM's flag, `--otlp-traces-endpoint`, off and free
otherwise.

`Tracing.from_settings` builds the server's tracer when the flag is given: the
OpenTelemetry SDK's `TracerProvider` with a batching processor and the OTLP exporter
that vLLM's own tracing picks for the same endpoint (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`:
`grpc`, the default, or `http/protobuf`; plain gRPC unless the endpoint is `https://`),
so that one flag sends the server's spans and vLLM's to one receiver. The SDK's own
environment variables apply as everywhere (`OTEL_SERVICE_NAME`, default `switchboard`;
`OTEL_TRACES_SAMPLER`, default parent-based always-on; `OTEL_EXPORTER_OTLP_TRACES_HEADERS`;
`OTEL_BSP_*`). The provider is the server's own. vLLM's engine spans (`llm_request`, children of
ours through the W3C context each engine request carries: `EngineTrace`) are made in
this process too, with the process's global provider: `lend_to_vllm` makes that one
whose spans go out through this tracer's processor and exporter, under vLLM's resource.
Over gRPC the batches are encoded by `app.telemetry.otlp` (what tracing cost the serving
process was mostly the SDK's encoder: docs/benchmarks.md "Traces").

With the flag absent, `from_settings` is None and nothing of OpenTelemetry's runs: the
code that would trace checks `record.span is not None` and does nothing else.

Spans are ended with their attributes and events all at once, at the request's end
(`app.telemetry.record`, `Tracing.finish`): a stream's tokens cost the tracer nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
    set_tracer_provider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from app import __version__
from app.config import Settings
from app.errors import ConfigError

logger = logging.getLogger(__name__)

ENDPOINT_ARG = "otlp_traces_endpoint"  # vLLM's engine argument (--otlp-traces-endpoint)
_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
_HEADERS = ("traceparent", "tracestate")
_UNSET = Status(StatusCode.UNSET)


class Tracing:
    """The server's tracer."""

    def __init__(self, processor: SpanProcessor) -> None:
        self._processor = processor
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

    def finish(
        self,
        span: Span,
        name: str,
        attributes: dict[str, Any],
        events: Iterable[tuple[str, int]],
        status: Status | None,
        end_ns: int,
    ) -> None:
        """End `span` (from `start`) with everything it records, at once: its name, its
        attributes, its events (name, time) and its status, handed to the processor as
        the SDK's record of a finished span. Not through the SDK span's setters: they
        take its lock and check each value, and each event gets a table of attributes of
        its own, which made ending the span cost more than starting it (measured under
        the benchmark's load: docs/benchmarks.md "Traces"). The span the SDK started
        only carries the context and what the sampler decided; one it does not record
        (a caller's unsampled trace) is not exported."""
        if not isinstance(span, ReadableSpan):  # a NonRecordingSpan: not sampled
            return
        finished = ReadableSpan(
            name=name,
            context=span.get_span_context(),
            parent=span.parent,
            resource=span.resource,
            attributes=attributes,
            events=[Event(event, None, at) for event, at in events],
            kind=span.kind,
            status=status or _UNSET,
            start_time=span.start_time,
            end_time=end_ns,
            instrumentation_scope=span.instrumentation_scope,
        )
        self._processor.on_end(finished)

    def lend_to_vllm(self) -> None:
        """Make vLLM's spans of this process (`llm_request`, made in its output processor,
        which runs in ours) go out through this tracer's processor and exporter, under
        the resource vLLM gives them: one batching thread, one encoding (`otlp.encode`,
        far cheaper than the SDK's) and one channel for both. vLLM makes its spans with
        the process's global tracer provider, which it sets to its own when its engine
        starts unless one is set already: this sets it first (`start_engine` calls it before
        it builds the engine). vLLM's own provider is still made, and stays idle."""
        provider = _KeptTracers(resource=_vllm_resource())
        provider.add_span_processor(self._processor)
        set_tracer_provider(provider)
        # vLLM's attempt to set its own then logs a warning that would only mislead.
        logging.getLogger("opentelemetry.trace").addFilter(_NOT_OVERRIDDEN)

    def flush(self) -> None:
        self._provider.force_flush()

    def shutdown(self) -> None:
        """Export what is left, then stop."""
        self._provider.shutdown()


def exporter(endpoint: str) -> SpanExporter:
    """The OTLP exporter vLLM's tracing makes of `endpoint`."""
    protocol = os.environ.get(_PROTOCOL, "grpc")
    if protocol == "grpc":
        from app.telemetry.otlp import GrpcSpanExporter

        return GrpcSpanExporter(endpoint=endpoint, insecure=True)
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


class _KeptTracers(TracerProvider):
    """A provider whose tracers are made once a name: vLLM asks for its tracer anew for
    each span it makes, and the SDK's `get_tracer`, though it keeps its tracers too,
    first changes the process's warning filters and makes two scope objects each time."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource=resource)
        self._kept: dict[tuple[str, str | None, str | None], Tracer] = {}

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> Tracer:
        if attributes:
            return super().get_tracer(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        tracer = self._kept.get(key)
        if tracer is None:
            tracer = super().get_tracer(*key)
            if len(self._kept) < 256:
                self._kept[key] = tracer
        return tracer


class _NotOverridden(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Overriding of current TracerProvider")


_NOT_OVERRIDDEN = _NotOverridden()


def _vllm_resource() -> Resource:
    """The resource vLLM's `init_tracer` gives its spans (vllm/tracing/otel.py)."""
    return Resource.create(
        {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": str(os.getpid())}
    )


def _resource() -> Resource:
    """The SDK's resource (its environment variables), named `switchboard` unless they
    name it."""
    detected = OTELResourceDetector().detect()
    if SERVICE_NAME in detected.attributes:
        return Resource.create({SERVICE_VERSION: __version__})
    return Resource.create({SERVICE_NAME: "switchboard", SERVICE_VERSION: __version__})
