"""Per-API and per-tenant metrics of the inference APIs' requests, read at scrape time.

Every request of an inference API (`record.OPERATIONS`: the `api` label, a closed set) is
counted once it ends, under its tenant (the `tenant` label; the first
`MAX_TENANTS` tenants seen have series of their own, any later one is counted as
`other`, so a server with many tenants still has a bounded number of series):

- `switchboard_requests_total{api, tenant, outcome}`: ok, client_error, refused (the
  admission bound, or a draining server), failed (the server's fault), cancelled (the
  client left);
- `switchboard_input_tokens_total`, `switchboard_output_tokens_total`,
  `switchboard_cached_tokens_total` (of the input, those the prefix cache held);
- histograms: `switchboard_time_to_first_token_seconds` (from the request's arrival, its
  body and admission included, to its first token), `switchboard_inter_token_latency_
  seconds` (a request's mean gap between its tokens as the server hands them on,
  counted once per gap: the engine's own, per step, is `vllm:inter_token_latency_
  seconds`), `switchboard_admission_wait_seconds` (admitted to the engine's first
  token: what admission counts as queued), `switchboard_request_duration_seconds` (its
  whole answer, the client's reading included).

And the gauge `switchboard_connections{api, tenant}`: the session connections open now
(websockets: `salience`, `evergreen`, `responses`; gRPC streams: `evergreen`).

Each request is counted by a few additions at its end; none per token. The buckets are
finer at the low end than vLLM's (whose inter-token latency starts at 10 ms, where a
CPU's or a fast GPU's every gap falls into one bucket).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from app.telemetry.record import OUTCOMES, RequestRecord

MAX_TENANTS = 64
OTHER_TENANT = "other"
DEFAULT_TENANT = "default"

TTFT_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
DURATION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0,
)  # fmt: skip


class _Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.total = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.total += value * times

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


class _Series:
    """One (api, tenant)'s figures."""

    __slots__ = ("cached", "duration", "input", "itl", "outcomes", "output", "ttft", "wait")

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.input = self.output = self.cached = 0
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.wait = _Histogram(TTFT_BUCKETS)
        self.duration = _Histogram(DURATION_BUCKETS)


class RequestMetrics(Collector):
    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _Series] = {}
        self._tenants: set[str] = set()
        self._connections: Counter[tuple[str, str]] = Counter()

    def connected(self, api: str, tenant: str | None, change: int) -> None:
        """A session connection of `api` opened (+1) or closed (-1)."""
        self._connections[(api, self._tenant(tenant))] += change

    def observe(self, record: RequestRecord) -> None:
        """Count `record`, once it has ended (a record of no inference API is not)."""
        api = record.api
        if api is None or record.handed_off:
            return
        series = self._series_of(api, self._tenant(record.tenant))
        series.outcomes[record.outcome] += 1
        series.input += record.input_tokens
        series.output += record.output_tokens
        series.cached += record.cached_tokens
        series.duration.observe(record.duration_s)
        first = record.first_token
        if first is None:
            return
        series.ttft.observe(first - record.started)
        if record.admitted is not None:
            series.wait.observe(first - record.admitted)
        gaps = record.output_tokens - 1
        if gaps > 0 and record.last_token is not None:
            series.itl.observe((record.last_token - first) / gaps, gaps)

    def _tenant(self, tenant: str | None) -> str:
        name = tenant or DEFAULT_TENANT
        if name in self._tenants:
            return name
        if len(self._tenants) >= MAX_TENANTS:
            return OTHER_TENANT
        self._tenants.add(name)
        return name

    def _series_of(self, api: str, tenant: str) -> _Series:
        key = (api, tenant)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        return series

    def collect(self) -> Iterator[Metric]:
        labels = ["api", "tenant"]
        requests = CounterMetricFamily(
            "switchboard_requests",
            "Requests of each inference API that have ended, by outcome (ok, client_error, "
            "refused, failed, cancelled).",
            labels=[*labels, "outcome"],
        )
        tokens = {
            name: CounterMetricFamily(f"switchboard_{name}_tokens", doc, labels=labels)
            for name, doc in (
                ("input", "Prompt tokens of the requests that have ended."),
                ("output", "Generated tokens of the requests that have ended."),
                ("cached", "Prompt tokens the prefix cache held, of those requests."),
            )
        }
        histograms = {
            name: HistogramMetricFamily(f"switchboard_{name}_seconds", doc, labels=labels)
            for name, doc in (
                (
                    "time_to_first_token",
                    "From a request's arrival (its body and admission included) to its "
                    "first token.",
                ),
                (
                    "inter_token_latency",
                    "A request's mean gap between tokens as the server hands them on, "
                    "counted once per gap.",
                ),
                (
                    "admission_wait",
                    "From a request's admission to the engine's first token (what "
                    "admission counts as queued).",
                ),
                ("request_duration", "A request's whole answer, its client's reading included."),
            )
        }
        for (api, tenant), series in sorted(self._series.items()):
            values = [api, tenant]
            for outcome, count in series.outcomes.items():
                requests.add_metric([*values, outcome], count)
            tokens["input"].add_metric(values, series.input)
            tokens["output"].add_metric(values, series.output)
            tokens["cached"].add_metric(values, series.cached)
            for name, histogram in (
                ("time_to_first_token", series.ttft),
                ("inter_token_latency", series.itl),
                ("admission_wait", series.wait),
                ("request_duration", series.duration),
            ):
                histograms[name].add_metric(values, histogram.buckets(), histogram.total)
        yield requests
        yield from tokens.values()
        yield from histograms.values()
        connections = GaugeMetricFamily(
            "switchboard_connections",
            "Session connections open now (websockets; gRPC streams).",
            labels=labels,
        )
        for (api, tenant), count in sorted(self._connections.items()):
            connections.add_metric([api, tenant], count)
        yield connections
