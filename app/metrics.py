"""`GET /metrics`: what the Gateway API Inference Extension's endpoint picker scrapes.

vLLM registers its own gauges (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`, ...) in prometheus_client's default
registry; they are served as vLLM writes them. vLLM 0.32 no longer exports
`vllm:gpu_cache_usage_perc`, which the EPP protocol document and older pickers read, so it
is re-exported under that name with the value of `vllm:kv_cache_usage_perc`. HTTP metrics
come from prometheus-fastapi-instrumentator in a registry of the app's own (so that
several apps in one process, as in tests, do not collide).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator import Instrumentator

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


def _register_legacy_alias() -> None:
    # Once per process: several apps (tests) share the default registry.
    if LEGACY_KV_CACHE_USAGE not in REGISTRY._names_to_collectors:
        REGISTRY.register(_legacy_collector)


def install_metrics(app: FastAPI) -> None:
    _register_legacy_alias()
    http_registry = CollectorRegistry()
    Instrumentator(registry=http_registry, excluded_handlers=["/metrics"]).instrument(app)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body = generate_latest(REGISTRY) + generate_latest(http_registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
