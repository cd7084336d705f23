"""A real OTLP receiver for the tests: the official `opentelemetry-proto` gRPC
TraceService (what an OpenTelemetry Collector serves on 4317; none installs here), on
127.0.0.1 in a thread of its own, keeping every span it is sent.

`endpoint` is what `--otlp-traces-endpoint` (ours, vLLM's, SMG's) takes; `wait(what,
holds)` waits, with a deadline, until the spans received satisfy `holds`. The servers
the tests start export every 100 ms (`OTEL_BSP_SCHEDULE_DELAY`, set by tests/conftest.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Span:
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a trace's root
    name: str
    kind: int  # SpanKind as OTLP numbers it: 2 is SERVER
    service: str  # its resource's service.name
    attributes: dict[str, Any]
    events: dict[str, int]  # name -> time (ns since the epoch)
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    # The exporter's end of the connection it came on (gRPC's `peer()`): one per
    # exporter, so the spans one exporter sent share it.
    peer: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        peer = context.peer()
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Span(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            service=str(service),
                            attributes=_attributes(span.attributes),
                            events={e.name: e.time_unix_nano for e in span.events},
                            status_code=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            peer=peer,
                        )
                    )
        self._receiver._add(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._changed = threading.Condition()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # The generated module is untyped.
        add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
        add(_Service(self), self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _add(self, spans: list[Span]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._changed.notify_all()

    def spans(self, trace_id: str | None = None) -> list[Span]:
        with self._changed:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait(
        self, what: str, holds: Callable[[list[Span]], bool], timeout: float = 20.0
    ) -> list[Span]:
        """The spans received, once `holds(spans)`; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not holds(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self._spans})[:20]
                    raise AssertionError(f"waited {timeout:.0f} s for {what}; spans: {names}")
                self._changed.wait(left)
            return list(self._spans)

    def trace(
        self, trace_id: str, what: str, holds: Callable[[list[Span]], bool], timeout: float = 20.0
    ) -> list[Span]:
        """The spans of one trace, once `holds` of them."""
        spans = self.wait(
            what, lambda spans: holds([s for s in spans if s.trace_id == trace_id]), timeout
        )
        return [s for s in spans if s.trace_id == trace_id]

    def stop(self) -> None:
        self._server.stop(0)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.stop()


def traceparent(trace_id: str, span_id: str = "00f067aa0ba902b7", sampled: bool = True) -> str:
    """A W3C `traceparent` header naming a caller's span."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


_session: OtlpReceiver | None = None


def session_receiver() -> OtlpReceiver:
    """The suite's one receiver, started on first use (the live server and the fleet's
    replicas and routers export to it), stopped when the session ends (`stop_session`)."""
    global _session
    if _session is None:
        _session = OtlpReceiver()
    return _session


def stop_session() -> None:
    global _session
    if _session is not None:
        _session.stop()
        _session = None
