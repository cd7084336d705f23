"""OTLP's protobuf encoding of a batch of finished spans, written straight to the wire
format: what the OTLP gRPC exporter sends, at a fraction of the SDK encoder's CPU.

The SDK's encoder (`encode_spans`) builds one protobuf message object from Python for
every span, attribute, value and event, and the constructors copy each list of them
again: measured under the benchmark's load (bench/traces.py, docs/benchmarks.md
"Traces"), that was most of what tracing cost the serving process, about 250 us for our
span of a request and 120 for vLLM's `llm_request`. Here each field is a few bytes joined
(the keys, the resource and the scope encoded once and kept), and the exporter hands the
bytes to protobuf's C parser, which yields the same `ExportTraceServiceRequest`
(tests/unit/test_otlp.py checks it against the SDK's encoder, field for field).

`encode(spans)` groups spans by resource, then instrumentation scope, as the SDK does;
an attribute of a type OTLP has no value for is left out, as the SDK's encoder leaves it
out (it logs it).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common._internal import (
    _encode_instrumentation_scope,
    _encode_resource,
    _encode_value,
)
from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import _encode_span
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")

# Field tags (field number << 3 | wire type), as opentelemetry-proto's .proto files
# number them: 2 is length-delimited, 0 a varint, 1 64 bits, 5 32 bits.
_RESOURCE_SPANS = b"\x0a"  # ExportTraceServiceRequest.resource_spans = 1
_RESOURCE = b"\x0a"  # ResourceSpans.resource = 1
_SCOPE_SPANS = b"\x12"  # ResourceSpans.scope_spans = 2
_SCOPE = b"\x0a"  # ScopeSpans.scope = 1
_SPANS = b"\x12"  # ScopeSpans.spans = 2
_SCHEMA_URL = b"\x1a"  # ResourceSpans.schema_url = 3, ScopeSpans.schema_url = 3
# Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6 (varint),
# start 7, end 8 (fixed64), attributes 9, events 11, status 15, flags 16 (fixed32).
_TRACE_ID, _SPAN_ID, _TRACE_STATE, _PARENT = b"\x0a", b"\x12", b"\x1a", b"\x22"
_NAME, _KIND, _START, _END = b"\x2a", b"\x30", b"\x39", b"\x41"
_ATTRIBUTE, _EVENT, _STATUS, _FLAGS = b"\x4a", b"\x5a", b"\x7a", b"\x85\x01"
# Span.Event: time_unix_nano 1 (fixed64), name 2, attributes 3.
_EVENT_TIME, _EVENT_NAME, _EVENT_ATTRIBUTE = b"\x09", b"\x12", b"\x1a"
# Status: message 2, code 3 (varint).
_STATUS_MESSAGE, _STATUS_CODE = b"\x12", b"\x18"
# KeyValue: key 1, value 2. AnyValue: string 1, bool 2, int 3, double 4, array 5,
# bytes 7. ArrayValue: values 1.
_KEY, _VALUE = b"\x0a", b"\x12"
_STRING, _TRUE, _FALSE, _INT, _DOUBLE_VALUE = b"\x0a", b"\x10\x01", b"\x10\x00", b"\x18", b"\x21"
_ARRAY, _BYTES, _ARRAY_VALUE = b"\x2a", b"\x3a", b"\x0a"

# SpanFlags: the context's is-remote bit is known (0x100); the parent is remote (0x200).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200

_KINDS = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SHORT = tuple(bytes((n,)) for n in range(0x80))  # the one-byte varints


def _delimited(tag: bytes, payload: bytes) -> bytes:
    size = len(payload)
    return tag + (_SHORT[size] if size < 0x80 else _varint(size)) + payload


def _string(tag: bytes, text: str) -> bytes:
    return _delimited(tag, text.encode())


def _int64(value: int) -> bytes:
    # int64 as a varint: a negative one is its two's complement in 64 bits.
    return _varint(value if value >= 0 else value + (1 << 64))


def _value(value: Any) -> bytes | None:
    """An AnyValue's encoding; None for a type OTLP has no value for. The types spans
    hold are written here; any other the SDK's encoder writes."""
    kind = type(value)
    if kind is str:
        return _string(_STRING, value)
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is int:
        return _INT + _int64(value)
    if kind is float:
        return _DOUBLE_VALUE + _DOUBLE.pack(value)
    if kind is list or kind is tuple:
        items = [_value(item) for item in value]
        array = b"".join(_delimited(_ARRAY_VALUE, item) for item in items if item is not None)
        return _delimited(_ARRAY, array)
    if value is None:  # the SDK's span drops such an attribute as it is set
        return None
    try:
        encoded: bytes = _encode_value(value).SerializeToString()
    except Exception:  # the SDK's encoder leaves such an attribute out too (and logs it)
        return None
    return encoded


class _Names(dict[str, bytes]):
    """Each attribute key's encoding (`KeyValue.key`), or each event name's
    (`Event.name`), made once: a server's spans use a small fixed set of them."""

    def __init__(self, tag: bytes) -> None:
        super().__init__()
        self._tag = tag

    def __missing__(self, name: str) -> bytes:
        encoded = _string(self._tag, name)
        if len(self) < 1024:  # a fixed set, unless a caller names its own
            self[name] = encoded
        return encoded


_keys = _Names(_KEY)
_event_names = _Names(_EVENT_NAME)


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute a `KeyValue` field: the commonest types (str, int, float) written
    here in one pass, as the ones `_value` writes (most of what a span's encoding cost
    was these nested calls: a server's span has some twenty attributes)."""
    if not attributes:
        return b""
    out: list[bytes] = []
    append = out.append
    short, keys = _SHORT, _keys
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            raw = value.encode()
            size = len(raw)
            encoded = _STRING + (short[size] if size < 0x80 else _varint(size)) + raw
        elif kind is int and value >= 0:
            encoded = _INT + (short[value] if value < 0x80 else _varint(value))
        elif kind is float:
            encoded = _DOUBLE_VALUE + _DOUBLE.pack(value)
        else:
            found = _value(value)
            if found is None:
                continue
            encoded = found
        size = len(encoded)
        body = keys[key] + _VALUE + (short[size] if size < 0x80 else _varint(size)) + encoded
        size = len(body)
        append(tag + (short[size] if size < 0x80 else _varint(size)) + body)
    return b"".join(out)


class _Events(dict[str, tuple[bytes, bytes]]):
    """An event without attributes is its name's encoding and its time: what goes before
    the time (the `Span.events` tag, the event's size, the time's tag) and after it (the
    name), made once a name (a server's events have a few fixed names)."""

    def __missing__(self, name: str) -> tuple[bytes, bytes]:
        encoded = _event_names[name]
        parts = (_EVENT + _varint(1 + 8 + len(encoded)) + _EVENT_TIME, encoded)
        if len(self) < 1024:
            self[name] = parts
        return parts


_events = _Events()


def _span(span: ReadableSpan) -> bytes:
    if span.links or span.dropped_attributes or span.dropped_events:
        # Not what a server's spans carry: the SDK's encoder writes them.
        encoded: bytes = _encode_span(span).SerializeToString()
        return encoded
    context = span.get_span_context()
    assert context is not None  # a finished span of the SDK's has its context
    out = [
        _TRACE_ID,
        b"\x10",
        context.trace_id.to_bytes(16, "big"),
        _SPAN_ID,
        b"\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        state = ",".join(f"{key}={value}" for key, value in context.trace_state.items())
        out.append(_string(_TRACE_STATE, state))
    parent = span.parent
    flags = _HAS_IS_REMOTE
    if parent is not None:
        out += (_PARENT, b"\x08", parent.span_id.to_bytes(8, "big"))
        if parent.is_remote:
            flags |= _IS_REMOTE
    out.append(_string(_NAME, span.name))
    out += (_KIND, _varint(_KINDS[span.kind]))
    out += (_START, _FIXED64.pack(span.start_time or 0), _END, _FIXED64.pack(span.end_time or 0))
    out.append(_attributes(_ATTRIBUTE, span.attributes))
    pack = _FIXED64.pack
    for event in span.events:
        if event.attributes:
            body = _EVENT_TIME + pack(event.timestamp) + _event_names[event.name]
            out.append(_delimited(_EVENT, body + _attributes(_EVENT_ATTRIBUTE, event.attributes)))
        else:
            before, name = _events[event.name]
            out += (before, pack(event.timestamp), name)
    status = span.status
    if status.status_code.value or status.description:
        body = _string(_STATUS_MESSAGE, status.description) if status.description else b""
        if status.status_code.value:
            body += _STATUS_CODE + _varint(status.status_code.value)
        out.append(_delimited(_STATUS, body))
    else:
        out.append(_delimited(_STATUS, b""))
    out += (_FLAGS, _FIXED32.pack(flags))
    return b"".join(out)


_KEPT = 64  # resources, and scopes, whose encodings are kept (a server has a few)


class _Encoded:
    """The resources' and scopes' encodings, made once each: a server's spans come from
    one or two resources (a provider's, the same object span after span) and a few
    scopes (vLLM asks for its tracer anew for each span: equal scopes, new objects)."""

    def __init__(self) -> None:
        # By identity: a Resource's hash serialises its attributes to JSON.
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[InstrumentationScope | None, bytes] = {}

    def resource(self, resource: Resource) -> bytes:
        kept = self._resources.get(id(resource))
        if kept is None or kept[0] is not resource:
            if len(self._resources) >= _KEPT:
                self._resources.clear()
            kept = (resource, _encode_resource(resource).SerializeToString())
            self._resources[id(resource)] = kept
        return kept[1]

    def scope(self, scope: InstrumentationScope | None) -> bytes:
        kept = self._scopes.get(scope)
        if kept is None:
            if len(self._scopes) >= _KEPT:
                self._scopes.clear()
            # No scope: an empty one, as the SDK's encoder writes it.
            kept = b""
            if scope is not None:
                kept = _encode_instrumentation_scope(scope).SerializeToString()
            self._scopes[scope] = kept
        return kept


def encode(spans: Sequence[ReadableSpan], encoded: _Encoded | None = None) -> bytes:
    """The serialised `ExportTraceServiceRequest` of `spans`."""
    encoded = encoded or _Encoded()
    groups: dict[int, tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]] = {}
    for span in spans:
        resource = span.resource
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        group[1].setdefault(span.instrumentation_scope or None, []).append(_span(span))
    out = []
    for resource, scopes in groups.values():
        body = [_delimited(_RESOURCE, encoded.resource(resource))]
        for scope, encoded_spans in scopes.items():
            scope_body = _delimited(_SCOPE, encoded.scope(scope)) + b"".join(
                _delimited(_SPANS, span) for span in encoded_spans
            )
            if scope is not None and scope.schema_url:
                scope_body += _string(_SCHEMA_URL, scope.schema_url)
            body.append(_delimited(_SCOPE_SPANS, scope_body))
        if resource.schema_url:
            body.append(_string(_SCHEMA_URL, resource.schema_url))
        out.append(_delimited(_RESOURCE_SPANS, b"".join(body)))
    return b"".join(out)


class GrpcSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP gRPC span exporter (its channel, retries, headers, compression and
    environment variables), its batches encoded by `encode`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoded = _Encoded()

    def _translate_data(self, data: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
        return ExportTraceServiceRequest.FromString(encode(data, self._encoded))
