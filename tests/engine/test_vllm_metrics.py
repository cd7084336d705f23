"""vLLM's own metrics are the same whichever path a request's outputs take: the process's
consumer of the engine core's outputs (app.engine.vllm.consumer: pulled by `generate`,
pushed by `run`) or AsyncLLM's own output handler (the path kept for an engine-level
stream interval). The endpoint picker, vllm-router and SMG read these: the scheduler's
gauges (`vllm:num_requests_running`/`waiting`), the KV cache's
(`vllm:kv_cache_usage_perc` and its legacy alias), `vllm:lora_requests_info`, the prefix
cache's counters, the token counters and the latency histograms.

One workload, run three times on the live server's engine, one path at a time: requests
at once (one on the LoRA adapter, one with logprobs), then the same prompts again (prefix
cache hits). Each path gets prompts of its own, alike in
length, so that no run finds another's blocks in the cache. Every counter moves by the
same amount on every path; every histogram observes as many values, and those that count
tokens put them in the same buckets (those that time things cannot: the times differ).
While the requests run, the gauges show them; afterwards, none."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from app.engine.base import GenerationRequest, SamplingOptions, TokenEvent
from tests.conftest import LiveServer

pytestmark = pytest.mark.engine

PROMPT_LEN, OUTPUT_LEN, CONCURRENT = 300, 24, 4
PATHS = ("AsyncLLM", "consumer pulled", "consumer pushed")
# Histograms whose values are times: as many observations on every path, not the same.
TIMED = ("_seconds",)
# Per engine step, not per request: how the steps fall depends on timing.
PER_STEP = ("vllm:iteration_tokens_total",)


def _families() -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Every `vllm:` sample in prometheus_client's default registry, by family: (sample
    name, labels) -> value."""
    from prometheus_client import REGISTRY

    out: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for metric in REGISTRY.collect():
        if not metric.name.startswith("vllm:"):
            continue
        samples = out.setdefault(metric.name + ":" + metric.type, {})
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _moved(
    before: dict[str, dict[Any, float]], after: dict[str, dict[Any, float]]
) -> dict[str, dict[Any, float]]:
    return {
        family: {key: value - before.get(family, {}).get(key, 0.0) for key, value in s.items()}
        for family, s in after.items()
    }


def _gauge(name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client import REGISTRY

    return [
        (sample.labels, sample.value)
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]


def _lora_running() -> str:
    """`vllm:lora_requests_info`'s running adapters, as the picker reads them: from its
    latest sample (its value is the time vLLM set it; the label sets of earlier readings
    stay in the registry)."""
    samples = _gauge("vllm:lora_requests_info")
    labels, _ = max(samples, key=lambda sample: sample[1])
    return labels["running_lora_adapters"]


def _prompts(path: int) -> Iterator[list[int]]:
    for i in range(CONCURRENT):
        start = 10 + 400 * (path * CONCURRENT + i) % 1900
        yield [(start + j) % 1990 + 10 for j in range(PROMPT_LEN)]


def _requests(live_server: LiveServer, path: int, round_: int) -> list[GenerationRequest]:
    requests = []
    for i, prompt in enumerate(_prompts(path)):
        sampling = SamplingOptions(
            max_tokens=OUTPUT_LEN,
            temperature=0.0,
            ignore_eos=True,
            logprobs=2 if i == 1 else None,
        )
        requests.append(
            GenerationRequest(
                f"metrics-{path}-{round_}-{i}",
                prompt_token_ids=prompt,
                sampling=sampling,
                lora_name=live_server.lora if i == 0 else None,
            )
        )
    return requests


async def _pulled(engine: Any, request: GenerationRequest, seen: list[int]) -> list[TokenEvent]:
    events = []
    async for event in engine.generate(request):
        events.append(event)
        seen.append(len(events))
    return events


async def _pushed(engine: Any, request: GenerationRequest, seen: list[int]) -> list[TokenEvent]:
    events: list[TokenEvent] = []

    def receive(event: TokenEvent) -> None:
        events.append(event)
        seen.append(len(events))

    await engine.run(request, receive)
    return events


def _run_path(live_server: LiveServer, path: int) -> tuple[list[list[TokenEvent]], list[Any]]:
    """The workload on path `path`: its events, and the gauges read while it ran."""
    engine = live_server.engine
    consume = _pushed if PATHS[path] == "consumer pushed" else _pulled

    async def workload() -> tuple[list[list[TokenEvent]], list[Any]]:
        engine._stepwise = PATHS[path] != "AsyncLLM"
        try:
            outputs: list[list[TokenEvent]] = []
            gauges: list[Any] = []
            for round_ in range(2):
                seen: list[int] = []
                tasks = [
                    asyncio.ensure_future(consume(engine, request, seen))
                    for request in _requests(live_server, path, round_)
                ]
                # The gauges while every request has output and none has ended.
                while len(seen) < 3 * CONCURRENT and not any(t.done() for t in tasks):
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.05)  # a stat logger's record after a step or two
                gauges.append(
                    (
                        _gauge("vllm:num_requests_running"),
                        _lora_running(),
                        _gauge("vllm:kv_cache_usage_perc"),
                        _gauge("vllm:gpu_cache_usage_perc"),
                    )
                )
                outputs += await asyncio.gather(*tasks)
            return outputs, gauges
        finally:
            engine._stepwise = True

    return live_server.call(workload())


def test_vllm_metrics_are_the_same_on_every_output_path(live_server: LiveServer) -> None:
    moved = []
    for path in range(len(PATHS)):
        assert live_server.wait_idle() == 0
        before = _families()
        outputs, gauges = _run_path(live_server, path)
        assert live_server.wait_idle() == 0
        moved.append(_moved(before, _families()))
        assert [sum(len(e.token_ids) for e in events) for events in outputs] == [OUTPUT_LEN] * (
            2 * CONCURRENT
        )
        # While they ran: the scheduler's gauge counted them, the KV cache held them, and
        # the adapter was listed as running.
        for running, lora, kv, legacy in gauges:
            assert sum(value for _, value in running) == CONCURRENT, PATHS[path]
            assert sum(value for _, value in kv) > 0, PATHS[path]
            assert [value for _, value in legacy] == [value for _, value in kv]
            assert live_server.lora in lora.split(","), PATHS[path]
        # Afterwards, nothing.
        assert sum(value for _, value in _gauge("vllm:num_requests_running")) == 0
        assert sum(value for _, value in _gauge("vllm:num_requests_waiting")) == 0
        assert sum(value for _, value in _gauge("vllm:kv_cache_usage_perc")) == 0
        assert _lora_running() == ""
    reference = moved[0]
    families = sorted(reference)
    hits = reference["vllm:prefix_cache_hits:counter"]
    assert sum(hits.values()) >= CONCURRENT * 256, "the second round hit the prefix cache"
    for path in range(1, len(PATHS)):
        theirs = moved[path]
        assert sorted(theirs) == families, PATHS[path]
        for family in families:
            name, kind = family.rsplit(":", 1)
            if kind in ("gauge", "info") or name in PER_STEP:
                continue
            ours = {k: v for k, v in reference[family].items() if v}
            other = {k: v for k, v in theirs[family].items() if v}
            if kind == "histogram" and name.endswith(TIMED):
                ours = {k: v for k, v in ours.items() if k[0].endswith("_count")}
                other = {k: v for k, v in other.items() if k[0].endswith("_count")}
            assert other == ours, f"{family} on {PATHS[path]}"
