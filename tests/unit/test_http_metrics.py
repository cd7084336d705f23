"""The HTTP metrics (`app.metrics.HttpMetrics`) are prometheus-fastapi-instrumentator's:
the same requests through its own middleware and through ours give the same series,
labels and counts (durations aside), and the app records every call it answers under
its route's template, the scrapes left out."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator import metrics as http_metrics

from app.config import Settings
from app.main import create_app
from app.metrics import HttpMetrics
from tests.fake_engine import FakeEngine


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/items/{item}")
    async def post(item: str) -> dict[str, str]:
        if item == "bad":
            raise HTTPException(422, "bad")
        return {"item": item}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"a"
            yield b"b"

        return StreamingResponse(chunks())

    @app.get("/metrics")
    async def scrape() -> dict[str, str]:
        return {}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    return app


def _series(registry: CollectorRegistry) -> dict[str, float]:
    """Every HTTP series but the durations' values: name{labels} -> value."""
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("#") or not line.startswith("http_"):
            continue
        name, value = line.rsplit(" ", 1)
        if "duration" in name and not name.split("{")[0].endswith("_count"):
            continue  # a duration's buckets and sum: when, not what
        if name.split("{")[0].endswith("_created"):
            continue
        out[name] = float(value)
    return out


async def _drive(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for item in ("a", "b", "bad"):
            await client.post(f"/items/{item}", content=b"x" * 17)
        await client.get("/items/a")  # the path matches, the method does not: 405
        await client.get("/nowhere")
        await client.get("/stream")
        await client.get("/metrics")
        await client.get("/boom")


async def test_the_same_series_as_the_instrumentators_own_middleware() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = _app()
    Instrumentator(registry=theirs, excluded_handlers=["/metrics"]).instrument(reference)
    app = _app()
    app.add_middleware(HttpMetrics, record=http_metrics.default(registry=ours))
    await _drive(reference)
    await _drive(app)
    assert _series(ours) == _series(theirs)
    series = _series(ours)
    assert series['http_requests_total{handler="/items/{item}",method="POST",status="2xx"}'] == 2
    assert series['http_requests_total{handler="none",method="GET",status="4xx"}'] == 1
    assert series['http_requests_total{handler="/boom",method="GET",status="5xx"}'] == 1
    assert not any('handler="/metrics"' in name for name in series)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_app_records_each_call_it_answers(stream: bool) -> None:
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    transport = httpx.ASGITransport(app=app)
    body = {"model": "fake", "prompt": "hi", "max_tokens": 3, "stream": stream}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for _ in range(3):
            assert (await client.post("/v1/completions", json=body)).status_code == 200
        await client.get("/metrics")
        text = (await client.get("/metrics")).text
    pattern = r'http_requests_total\{handler="/v1/completions",method="POST",status="2xx"\} (\S+)'
    found = re.search(pattern, text)
    assert found is not None and float(found.group(1)) == 3
    assert 'handler="/metrics"' not in text
