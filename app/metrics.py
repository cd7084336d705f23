"""`GET /metrics`: what the Gateway API Inference Extension's endpoint picker scrapes.

vLLM registers its own gauges (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`, ...) in prometheus_client's default
registry; they are served as vLLM writes them. vLLM 0.32 no longer exports
`vllm:gpu_cache_usage_perc`, which the EPP protocol document and older pickers read, so it
is re-exported under that name with the value of `vllm:kv_cache_usage_perc`. HTTP metrics
are prometheus-fastapi-instrumentator's default set (`http_requests_total`,
`http_request_duration_seconds`, ...: its names, labels and buckets, from its own
`metrics.default`) in a registry of the app's own (so that several apps in one process,
as in tests, do not collide), recorded by `HttpMetrics` rather than the library's
middleware: that one walks the app's routes again to name the handler, builds a request,
a response and a gather per request, ~40 us of a request's ~330 us of frontend CPU
(measured on the fake engine); the router has named the route already (`scope["route"]`).

Admission (`app.admission`), read from the app's `Admission` at scrape time, per protocol
(`ProtocolName`: every one listed, zeros included): `switchboard_admitted_total` and
`switchboard_refused_total` (units of work: an OpenAI prompt x choice, an Anthropic
message, a GraphPipe row, an Evergreen GENERATE, a Salience Generate; refusals include a
draining server's), and the gauges `switchboard_queued_requests` (admitted, not yet
started by the engine) and `switchboard_queued_tokens` (their prompt tokens, all
protocols).

Per API and per tenant, each inference API's requests by outcome, their tokens and
latency histograms (`app.telemetry.metrics.RequestMetrics`: `switchboard_requests_total`,
`switchboard_time_to_first_token_seconds`, ...).

Batches (`app.batches`), read from this replica's runner at scrape time (no store read):
`switchboard_batch_requests{state}` (its batch requests `queued` in the runner, waiting
for the lane, and `running` in the engine), `switchboard_batch_results_total{outcome}`
(results it wrote: succeeded, errored, expired, cancelled; with replicas, sum it over
them), `switchboard_batches_active` (batches not ended yet, at the runner's last read of
the store: fleet-wide with a shared store, the same on every replica). Batch work is
admitted as protocol `batch`.

Sessions that outlive connections (Salience's; `app.protocols.salience.lifecycle`), read
from the app's runner at scrape time:
`switchboard_sessions_evicted_total{protocol, reason}` (idle sessions this replica evicted
to make room: `cap`, the session cap; `tokens`, the token bound; expiries are not counted;
with replicas sharing a store, sum it over them), and the gauges `switchboard_sessions`
and `switchboard_session_tokens` (what the sessions are charged against the token bound),
which are the store's: with replicas sharing one they are fleet-wide, the same on every
replica (take one, not the sum). A store that does not answer within a second leaves the
gauges out of that scrape.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator import metrics as http_metrics
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.admission import Admission, ProtocolName
from app.batches.runner import BatchRunner
from app.batches.service import Batches
from app.errors import SwitchboardError
from app.protocols.salience.lifecycle import Eviction
from app.sessions.salience import SalienceRunner
from app.store.batches import OUTCOMES
from app.telemetry.metrics import RequestMetrics

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
LEGACY_KV_CACHE_USAGE = "vllm:gpu_cache_usage_perc"


class LegacyKvCacheUsage(Collector):
    """Re-exports `vllm:kv_cache_usage_perc` as `vllm:gpu_cache_usage_perc`."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            LEGACY_KV_CACHE_USAGE,
            "KV-cache usage, 1 means 100 percent (alias of vllm:kv_cache_usage_perc).",
            labels=None,
        )

    def collect(self) -> Iterator[Metric]:
        collector = self._source._names_to_collectors.get(KV_CACHE_USAGE)
        if collector is None or collector is self:
            return
        family = self._family()
        for metric in collector.collect():
            for sample in metric.samples:
                if sample.name == KV_CACHE_USAGE:
                    family.add_sample(LEGACY_KV_CACHE_USAGE, sample.labels, sample.value)
        yield family


_legacy_collector = LegacyKvCacheUsage(REGISTRY)


def kv_cache_usage() -> float:
    """vLLM's latest KV-cache usage (0 to 1) from its own gauge; 0 before it reports (or
    without an engine that does), for what routers poll besides /metrics."""
    collector = REGISTRY._names_to_collectors.get(KV_CACHE_USAGE)
    if collector is None or collector is _legacy_collector:
        return 0.0
    for metric in collector.collect():
        for sample in metric.samples:
            if sample.name == KV_CACHE_USAGE:
                return float(sample.value)
    return 0.0


def _register_legacy_alias() -> None:
    # Once per process: several apps (tests) share the default registry.
    if LEGACY_KV_CACHE_USAGE not in REGISTRY._names_to_collectors:
        REGISTRY.register(_legacy_collector)


class AdmissionMetrics(Collector):
    """The admission counters and gauges of one app, read when scraped."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    def collect(self) -> Iterator[Metric]:
        admission = self._admission
        admitted = CounterMetricFamily(
            "switchboard_admitted", "Units of work admitted.", labels=["protocol"]
        )
        refused = CounterMetricFamily(
            "switchboard_refused",
            "Units of work refused (queue at its bound, or draining).",
            labels=["protocol"],
        )
        queued = GaugeMetricFamily(
            "switchboard_queued_requests",
            "Admitted units the engine has not started yet.",
            labels=["protocol"],
        )
        waiting = admission.queued()
        protocols = sorted({*ProtocolName, *admission.admitted, *admission.refused})
        for protocol in protocols:
            admitted.add_metric([protocol], admission.admitted[protocol])
            refused.add_metric([protocol], admission.refused[protocol])
            queued.add_metric([protocol], waiting[protocol])
        tokens = GaugeMetricFamily(
            "switchboard_queued_tokens",
            "Prompt tokens of the admitted units the engine has not started yet.",
            value=admission.queued_tokens,
        )
        yield from (admitted, refused, queued, tokens)


class SessionMetrics(Collector):
    """The session counters and gauges of one app, read when scraped (the gauges from
    the figures `refresh` read last)."""

    def __init__(self, runner: Callable[[], SalienceRunner]) -> None:
        self._runner = runner
        self._stats: tuple[int, int] | None = (0, 0)

    async def refresh(self) -> None:
        try:
            self._stats = await asyncio.wait_for(self._runner().stats(), _STATS_TIMEOUT_S)
        except (SwitchboardError, TimeoutError):
            self._stats = None

    def collect(self) -> Iterator[Metric]:
        runner = self._runner()
        evicted = CounterMetricFamily(
            "switchboard_sessions_evicted",
            "Idle sessions this replica evicted to make room (reason: cap, the session cap; "
            "tokens, the token bound).",
            labels=["protocol", "reason"],
        )
        for reason in Eviction:
            evicted.add_metric([ProtocolName.SALIENCE, reason.value], runner.evicted[reason])
        yield evicted
        if self._stats is None:
            return
        held, charged = self._stats
        sessions = GaugeMetricFamily(
            "switchboard_sessions",
            "Sessions held (by the store: fleet-wide when replicas share one).",
            labels=["protocol"],
        )
        sessions.add_metric([ProtocolName.SALIENCE], held)
        tokens = GaugeMetricFamily(
            "switchboard_session_tokens",
            "Tokens the sessions are charged against the token bound (held, plus what "
            "running Generates may add; fleet-wide when replicas share a store).",
            labels=["protocol"],
        )
        tokens.add_metric([ProtocolName.SALIENCE], charged)
        yield from (sessions, tokens)


class BatchMetrics(Collector):
    """This replica's batch runner, read when scraped (zeros before it exists)."""

    def __init__(self, batches: Callable[[], Batches]) -> None:
        self._batches = batches

    def collect(self) -> Iterator[Metric]:
        try:
            runner: BatchRunner | None = self._batches().runner
        except AttributeError:  # the app's objects are not built yet (no engine)
            runner = None
        requests = GaugeMetricFamily(
            "switchboard_batch_requests",
            "Batch requests on this replica: queued (waiting for the lane), running.",
            labels=["state"],
        )
        requests.add_metric(["queued"], 0 if runner is None else runner.queued)
        requests.add_metric(["running"], 0 if runner is None else runner.running)
        results = CounterMetricFamily(
            "switchboard_batch_results",
            "Results of batch requests this replica wrote, by outcome.",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            results.add_metric([outcome], 0 if runner is None else runner.answered.get(outcome, 0))
        active = GaugeMetricFamily(
            "switchboard_batches_active",
            "Batches not ended yet, at the runner's last read (the store's: fleet-wide when "
            "replicas share one).",
            value=0 if runner is None else runner.active,
        )
        yield from (requests, results, active)


_STATS_TIMEOUT_S = 1.0
_UNNAMED = "none"  # a request no route took (a 404), as the instrumentator groups it
_UNRECORDED = frozenset({"/metrics"})  # the scrapes themselves


@dataclass(frozen=True, slots=True)
class _Sized:
    """What the instrumentator's recorder reads of a request or a response: its headers'
    `Content-Length`."""

    headers: dict[str, bytes]

    @classmethod
    def of(cls, raw: Iterable[tuple[bytes, bytes]]) -> _Sized:
        for name, value in raw:
            if name.lower() == b"content-length":
                return cls({"Content-Length": value})
        return cls({})


class HttpMetrics:
    """ASGI middleware: each HTTP request recorded by `record` (the instrumentator's
    default set) once it has been answered, under its route's path template, its method
    and its status class (`2xx`); 500 when the app raised before answering; the latency
    is the whole request's, a stream's included (the time to its answer's start is kept
    apart, as the instrumentator keeps it)."""

    def __init__(self, app: ASGIApp, record: Callable[[Any], None]) -> None:
        self.app = app
        self._record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = answered = time.perf_counter()
        status, headers = 500, []

        async def watched(message: Message) -> None:
            nonlocal status, headers, answered
            if message["type"] == "http.response.start":
                status, headers = message["status"], message.get("headers", [])
                answered = time.perf_counter()
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            route = scope.get("route")
            handler = getattr(route, "path", None) or _UNNAMED
            if handler not in _UNRECORDED:
                ended = time.perf_counter()
                self._record(
                    http_metrics.Info(
                        request=_Sized.of(scope["headers"]),
                        response=_Sized.of(headers),
                        method=scope["method"],
                        modified_handler=handler,
                        modified_status=f"{str(status)[0]}xx",
                        modified_duration=ended - start,
                        modified_duration_without_streaming=answered - start,
                    )
                )


def install_metrics(
    app: FastAPI,
    admission: Admission,
    requests: RequestMetrics,
    salience: Callable[[], SalienceRunner],
    batches: Callable[[], Batches],
) -> None:
    """/metrics on `app`; `salience()` and `batches()` are the app's once the app has its
    objects."""
    _register_legacy_alias()
    http_registry = CollectorRegistry()
    http_registry.register(AdmissionMetrics(admission))
    http_registry.register(requests)
    sessions = SessionMetrics(salience)
    http_registry.register(sessions)
    http_registry.register(BatchMetrics(batches))
    app.add_middleware(HttpMetrics, record=http_metrics.default(registry=http_registry))

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        await sessions.refresh()
        body = generate_latest(REGISTRY) + generate_latest(http_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
