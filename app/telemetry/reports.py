"""`Telemetry`: the app's one place that opens a `RequestRecord` for each request and
reports it once it ends: its span (traced), its access-log line, its metrics.

One per app (`app.state.telemetry`), built from the settings: the tracer
(`Tracing.from_settings`: None unless --otlp-traces-endpoint), the access log's form
(--access-log) and the per-API metrics (`RequestMetrics`, served on /metrics).

A span is one per request, a SERVER span under the caller's W3C context, named as the
GenAI conventions name an inference call (`chat tiny`; any other call by what was called,
`GET /v1/models`). It gets, at the end and all at once: the GenAI attributes
(`gen_ai.operation.name`, `gen_ai.request.model`, the sampling asked,
`gen_ai.usage.input_tokens`/`output_tokens`, `gen_ai.response.finish_reasons`,
`gen_ai.server.time_to_first_token`), the request id and tenant, the HTTP ones, an
`error.type` when it failed (and an ERROR status when the failure is the server's, 5xx,
as the HTTP conventions say of server spans), and one event per stage reached, at its
time: `admitted` (the wait for admission ends), `prompt_built`, `engine.queued`,
`engine.scheduled` (the engine's queue ends: prefill), `engine.first_token` (decode),
`engine.last_token`, `first_token` (handed on by the server), `last_token`, `written`
(the answer's last byte). vLLM's own span of each engine request (`llm_request`) is
its child.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Status, StatusCode

from app.config import Settings
from app.telemetry.access_log import AccessLog
from app.telemetry.callers import Caller
from app.telemetry.metrics import RequestMetrics
from app.telemetry.record import OPERATIONS, RequestRecord
from app.telemetry.tracing import Tracing

# Monotonic seconds -> the span's epoch nanoseconds (the clocks drift apart by far less
# than a span's resolution over a server's life).
_EPOCH_NS = time.time_ns() - time.monotonic_ns()


def epoch_ns(monotonic_s: float) -> int:
    return int(monotonic_s * 1e9) + _EPOCH_NS


class Telemetry:
    def __init__(self, settings: Settings, tracing: Tracing | None = None) -> None:
        """`tracing`: the tracer made for these settings before the app (the one lent to
        the engine `switchboard serve` starts first); else made here."""
        self.tracing = tracing if tracing is not None else Tracing.from_settings(settings)
        self.metrics = RequestMetrics()
        self._access = AccessLog(settings.access_log)
        self._model = settings.model_name

    def open(
        self,
        request_id: str,
        *,
        name: str,
        client: str = "",
        api: str | None = None,
        carrier: Mapping[str, str] | None = None,
    ) -> RequestRecord:
        """The record of a request that arrives now; traced, its span started under the
        caller's context (`carrier`: its W3C headers)."""
        started = time.monotonic()
        tracing = self.tracing
        if tracing is None:
            return RequestRecord(request_id, name=name, client=client, api=api, started=started)
        parent = tracing.parent(carrier) if carrier else None
        span = tracing.start(name, parent, epoch_ns(started))
        return RequestRecord(
            request_id,
            name=name,
            client=client,
            api=api,
            span=span,
            engine_headers=tracing.headers(span),
            started=started,
        )

    def open_call(self, caller: Caller, *, name: str, api: str | None) -> RequestRecord:
        """The record of a call `caller` makes now (a connection's call, a gRPC call)."""
        record = self.open(
            caller.call_id(), name=name, client=caller.client, api=api, carrier=caller.carrier
        )
        record.tenant = caller.tenant_of_calls()
        return record

    def hand_off(self, record: RequestRecord, *, name: str, api: str) -> RequestRecord:
        """A record for the work `record`'s request leaves running once it is answered (a
        background response's run): the same request id, tenant and model; traced, its
        span a child of `record`'s; its admission and prompt taken over."""
        child = self.open(
            record.request_id,
            name=name,
            client=record.client,
            api=api,
            carrier=record.engine_headers,
        )
        child.tenant, child.model = record.tenant, record.model
        child.admitted, child.built = record.admitted, record.built
        record.handed_off = True
        return child

    def close(self, record: RequestRecord) -> None:
        """Report `record`: it has ended (now, unless the transport said when)."""
        if record.ended is None:
            record.ended = time.monotonic()
        model = record.model or self._model
        self.metrics.observe(record)
        self._access.write(record, model)
        if record.span is not None:
            assert self.tracing is not None
            _end_span(self.tracing, record, model)

    def shutdown(self) -> None:
        if self.tracing is not None:
            self.tracing.shutdown()


def _end_span(tracing: Tracing, record: RequestRecord, model: str) -> None:
    span = record.span
    assert span is not None and record.ended is not None
    operation = OPERATIONS.get(record.api or "")
    if operation is not None:
        name = f"{operation} {model}"
    elif record.route:
        name = f"{record.method} {record.route}"
    else:
        name = record.name
    attributes = _attributes(record, operation, model)
    error = record.error
    if error is not None:
        attributes["error.type"] = type(error).__name__
    elif record.outcome == "cancelled":
        attributes["error.type"] = "cancelled"
    elif record.status >= 400:
        attributes["error.type"] = str(record.status)
    status = None
    if (error is not None and error.http_status >= 500) or record.status >= 500:
        status = Status(StatusCode.ERROR, error.message if error else None)
    events = [(stage, epoch_ns(at)) for stage, at in _stages(record)]
    tracing.finish(span, name, attributes, events, status, epoch_ns(record.ended))


def _attributes(record: RequestRecord, operation: str | None, model: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "switchboard.request_id": record.request_id,
        "switchboard.tenant": record.tenant or "default",
        "switchboard.outcome": record.outcome,
    }
    if record.client:
        host, _, port = record.client.rpartition(":")
        attributes["client.address"] = host
        if port.isdigit():
            attributes["client.port"] = int(port)
    if record.method:
        attributes["http.request.method"] = record.method
        if record.route:
            attributes["http.route"] = record.route
        if record.status:
            attributes["http.response.status_code"] = record.status
    else:
        attributes["rpc.method"] = record.name
    if operation is None:
        return attributes
    attributes.update(
        {
            "switchboard.api": record.api,
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "switchboard",
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": record.input_tokens,
            "gen_ai.usage.output_tokens": record.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": record.cached_tokens,
        }
    )
    if record.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(record.finish_reasons)
    ttft = record.ttft_s
    if ttft is not None:
        attributes["gen_ai.server.time_to_first_token"] = ttft
    first = record.first_request
    if first is not None:
        sampling = first.sampling
        attributes["gen_ai.request.max_tokens"] = sampling.max_tokens
        attributes["gen_ai.request.temperature"] = sampling.temperature
        attributes["gen_ai.request.top_p"] = sampling.top_p
        if len(record.traces or ()) > 1:
            attributes["gen_ai.request.choice.count"] = len(record.traces or ())
    return attributes


def _stages(record: RequestRecord) -> list[tuple[str, float]]:
    """Each stage reached, with when it ended (the engine's from its first request)."""
    stages: list[tuple[str, float | None]] = [
        ("admitted", record.admitted),
        ("prompt_built", record.built),
    ]
    if record.traces:
        engine = record.traces[0]
        stages += [
            ("engine.queued", engine.queued),
            ("engine.scheduled", engine.scheduled),
            ("engine.first_token", engine.first_token),
            ("engine.last_token", engine.last_token),
        ]
    stages += [
        ("first_token", record.first_token),
        ("last_token", record.last_token),
        ("written", record.ended),
    ]
    return [(name, at) for name, at in stages if at is not None]
