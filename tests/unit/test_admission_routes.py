"""Admission and drain on the HTTP protocols, over the fake engine: refusals in each
protocol's shape with the retry hint, whole calls refused whole, tickets always given
back, the drain's order (readiness, refusals, cut streams, goodbyes). The same on real
vLLM and a real `switchboard serve` is in tests/e2e/test_overload.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import numpy as np
import pytest

from app.admission import Admission, ProtocolName, generate
from app.config import Settings
from app.drain import Drain
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError, Overloaded
from app.main import create_app
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.waits import until


def _app(engine: FakeEngine, **settings: Any) -> Any:
    return create_app(Settings(model="fake", **settings), engine=engine)


def _client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30)


def _strings(*values: str) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


def _settled(app: Any, engine: FakeEngine) -> None:
    admission: Admission = app.state.admission
    assert admission.in_flight == 0
    assert not admission.queued() and admission.queued_tokens == 0
    assert engine.running == set()


async def test_an_openai_burst_past_the_bound_is_refused_in_shape_with_retry_after() -> None:
    engine = FakeEngine(step_delay=0.2)  # each request queued until its first token
    app = _app(engine, max_queued_requests=2)
    async with _client(app) as client:
        body = {"prompt": "ab", "max_tokens": 2}
        responses = await asyncio.gather(
            *(client.post("/v1/completions", json=body) for _ in range(8))
        )
        metrics = (await client.get("/metrics")).text
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(ok) == 2 and len(refused) == 6
    for response in refused:
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "overloaded"
        assert "queued requests" in error["message"]
    assert all(r.json()["choices"][0]["text"] == "cd" for r in ok)
    assert 'switchboard_admitted_total{protocol="openai"} 2.0' in metrics
    assert 'switchboard_refused_total{protocol="openai"} 6.0' in metrics
    assert 'switchboard_queued_requests{protocol="openai"} 0.0' in metrics
    _settled(app, engine)


async def test_metrics_list_every_protocol_before_its_first_call() -> None:
    """Each protocol admission counts has its series from the start, at zero (the
    Responses API's too, its own label): a dashboard sees it before its first call."""
    app = _app(FakeEngine())
    async with _client(app) as client:
        metrics = (await client.get("/metrics")).text
        await client.post(
            "/v1/responses", json={"input": "hi", "max_output_tokens": 2, "store": False}
        )
        after = (await client.get("/metrics")).text
    for protocol in (
        "openai",
        "responses",
        "anthropic",
        "graphpipe",
        "evergreen",
        "salience",
        "smg",
        "tokens",
    ):
        for family in ("admitted_total", "refused_total", "queued_requests"):
            assert f'switchboard_{family}{{protocol="{protocol}"}} 0.0' in metrics, (
                protocol,
                family,
            )
    assert 'switchboard_admitted_total{protocol="responses"} 1.0' in after


async def test_a_call_is_admitted_whole_or_refused_whole() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=2)
    async with _client(app) as client:
        # Two prompts x two choices: four units against a bound of two.
        body = {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 2, "stream": True}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 503 and response.headers["retry-after"]
        assert response.json()["error"]["code"] == "overloaded"  # JSON, not a stream
        admission: Admission = app.state.admission
        assert admission.refused == {"openai": 4} and not admission.admitted["openai"]
        response = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 2},
        )
        assert response.status_code == 200 and len(response.json()["choices"]) == 2
    _settled(app, engine)


async def test_a_request_refused_by_its_core_gives_its_tickets_back() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    async with _client(app) as client:
        for _ in range(3):
            response = await client.post("/v1/completions", json={"prompt": "ab", "suffix": "x"})
            assert response.status_code == 400
    _settled(app, engine)


async def test_a_higher_priority_call_is_admitted_past_lower_priority_waiters() -> None:
    engine = FakeEngine(step_delay=0.3)
    app = _app(engine, max_queued_requests=2)
    async with _client(app) as client:

        def call(priority: int) -> Any:
            body = {"prompt": "ab", "max_tokens": 1, "priority": priority}
            return client.post("/v1/completions", json=body)

        low = [asyncio.create_task(call(5)) for _ in range(2)]
        await until(lambda: app.state.admission.in_flight >= 2, "both calls admitted")
        assert (await call(5)).status_code == 503
        assert (await call(0)).status_code == 200  # lower value: runs first
        assert [(await t).status_code for t in low] == [200, 200]
    _settled(app, engine)


async def test_a_graphpipe_batch_past_the_bound_is_an_infer_response_error() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=2)
    async with _client(app) as client:
        call = Infer([_strings("ab", "cd", "ef")], config='{"max_tokens": 2}')
        response = await client.post("/graphpipe", content=infer_request(call))
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        answer = read_infer_response(response.content)
        assert answer.outputs == [] and answer.errors[0][0] == 503
        call = Infer([_strings("ab", "cd")], config='{"max_tokens": 2}')
        response = await client.post("/graphpipe", content=infer_request(call))
        assert response.status_code == 200
        metrics = (await client.get("/metrics")).text
    assert 'switchboard_refused_total{protocol="graphpipe"} 3.0' in metrics
    assert 'switchboard_admitted_total{protocol="graphpipe"} 2.0' in metrics
    _settled(app, engine)


async def test_the_token_bound_is_checked_before_tokenizing() -> None:
    engine = FakeEngine(step_delay=0.2)
    app = _app(engine, max_queued_tokens=100)
    async with _client(app) as client:
        long = {"prompt": "x" * 60, "max_tokens": 1}
        first = asyncio.create_task(client.post("/v1/completions", json=long))
        await until(lambda: app.state.admission.in_flight > 0, "the first call admitted")
        assert (await client.post("/v1/completions", json=long)).status_code == 503
        assert (await first).status_code == 200
    _settled(app, engine)


async def test_ready_turns_503_when_saturated_or_draining_and_health_stays_200() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    async with _client(app) as client:
        assert (await client.get("/ready")).status_code == 200
        ticket = app.state.admission.admit(ProtocolName.OPENAI)
        saturated = await client.get("/ready")
        assert saturated.status_code == 503 and saturated.headers["retry-after"]
        ticket.release()
        assert (await client.get("/ready")).status_code == 200
        app.state.drain.begin()
        draining = await client.get("/ready")
        assert draining.status_code == 503 and "draining" in draining.json()["error"]["message"]
        assert (await client.get("/health")).status_code == 200


# The drain test's clock: the fake's step, the drain's timeout, and the long requests'
# tokens (20 s unaborted, 40 times the drain).
STEP_S, DRAIN_S, LONG = 0.05, 0.5, 400


async def test_the_drain_refuses_new_work_lets_streams_finish_then_cuts_the_rest() -> None:
    engine = FakeEngine(step_delay=STEP_S)
    app = _app(engine, drain_timeout_s=DRAIN_S)
    drain: Drain = app.state.drain
    said_goodbye: list[str] = []

    async def goodbye() -> None:
        said_goodbye.append("session")

    drain.subscribe(goodbye)
    async with _client(app) as client:
        short = {"prompt": "ab", "max_tokens": 4, "stream": True}  # 0.2 s: finishes
        long = {"prompt": "ab", "max_tokens": LONG, "stream": True}  # cut at DRAIN_S
        streams = [
            asyncio.create_task(client.post("/v1/completions", json=body)) for body in (short, long)
        ]
        call = Infer([_strings("ab")], config=json.dumps({"max_tokens": LONG}))
        graphpipe = asyncio.create_task(client.post("/graphpipe", content=infer_request(call)))
        await until(lambda: app.state.admission.in_flight >= 3, "the three calls admitted")
        drain.begin()
        refused = await client.post("/v1/completions", json=short)
        assert refused.status_code == 503 and "shutting down" in refused.text
        assert refused.headers["retry-after"]
        started = asyncio.get_running_loop().time()
        await drain.run(engine.abort)
        took = asyncio.get_running_loop().time() - started
        # What the drain cut has ended, its tickets given back, by the time it returns.
        assert app.state.admission.in_flight == 0 and engine.running == set()
        finished, cut = [await s for s in streams]
        gp = await graphpipe
    # The drain gave the work in flight its whole timeout (the short stream ended in it),
    # then cut the rest, long before the long requests could have ended by themselves.
    assert DRAIN_S <= took < LONG * STEP_S / 3, took
    assert finished.text.endswith("data: [DONE]\n\n") and "error" not in finished.text
    events = [line[6:] for line in cut.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "overloaded" and "shutting down" in error["message"]
    assert gp.status_code == 503 and read_infer_response(gp.content).errors[0][0] == 503
    assert said_goodbye == ["session"]
    _settled(app, engine)


class _FailingEngine(FakeEngine):
    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            yield await anext(inner)
            raise EngineError("the engine fell over")
        finally:
            await inner.aclose()


async def test_generate_releases_its_ticket_however_the_request_ends() -> None:
    admission = Admission(None, None)
    engine = _FailingEngine()
    ticket = admission.admit(ProtocolName.SALIENCE, tokens=50)
    request = GenerationRequest(request_id="r", prompt_token_ids=[1, 2, 3])
    run = generate(engine, request, ticket)
    await anext(run)
    assert not ticket.queued and ticket.tokens == 3  # running from the first event
    with pytest.raises(EngineError):
        await anext(run)
    assert admission.in_flight == 0 and engine.running == set()
    # Closed before its first event: released, engine request aborted.
    slow = FakeEngine(step_delay=0.05)
    ticket = admission.admit(ProtocolName.SALIENCE)
    run = generate(slow, GenerationRequest(request_id="s", prompt_text="ab"), ticket)
    task = asyncio.ensure_future(anext(run))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await run.aclose()
    assert admission.in_flight == 0 and slow.running == set()
    # Cut before it started: refused as Overloaded, never reaching the engine.
    ticket = admission.admit(ProtocolName.SALIENCE)
    admission.cut()
    with pytest.raises(Overloaded, match="shutting down"):
        await anext(generate(slow, GenerationRequest(request_id="t", prompt_text="a"), ticket))
    assert admission.in_flight == 0 and "t" not in [r.request_id for r in slow.requests]
