"""What an operator sees of a request (`app.telemetry`), on the fake engine: its
`x-request-id` taken or minted and answered, the prefix of its engine requests' ids; its
access-log line; its per-API metrics; traced, its span under the caller's, with the GenAI
attributes and the stages, and the engine's context; untraced, nothing of it. The same
on real vLLM and over every transport: tests/e2e/test_traces.py."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import grpc
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from smg_grpc_proto.generated import vllm_engine_pb2 as smg_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as smg_grpc

from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError
from app.main import create_app
from app.telemetry.access_log import LOGGER, fields, text
from app.telemetry.logs import RequestIdFilter
from app.telemetry.metrics import MAX_TENANTS, OTHER_TENANT, RequestMetrics
from app.telemetry.record import RequestRecord
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.asgi_wire import Wire
from tests.conftest import free_port
from tests.evergreen_client import TestClientSocket
from tests.evergreen_frames import generate, leaf, message
from tests.fake_engine import FakeEngine
from tests.otlp_receiver import OtlpReceiver, Span, otlp_receiver, traceparent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
PROMPT = "a prompt no log may hold"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with otlp_receiver() as made:
        yield made


def _app(engine: FakeEngine, receiver: OtlpReceiver | None = None, **settings: Any) -> FastAPI:
    engine_args = {} if receiver is None else {"otlp_traces_endpoint": receiver.endpoint}
    return create_app(Settings(model="fake", engine_args=engine_args, **settings), engine=engine)


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def _chat(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _traced(app: FastAPI, receiver: OtlpReceiver, trace_id: str, count: int = 1) -> list[Span]:
    app.state.telemetry.tracing.flush()
    return receiver.trace(trace_id, f"{count} span(s)", lambda spans: len(spans) >= count)


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in /metrics")


# -- request ids -----------------------------------------------------------------------


async def test_a_clients_request_id_is_answered_and_begins_its_engine_requests_ids() -> None:
    engine = FakeEngine()
    async with _client(_app(engine)) as client:
        body = {"prompt": "ab", "max_tokens": 2, "n": 2}
        answer = await client.post("/v1/completions", json=body, headers={"x-request-id": "r-1"})
        assert answer.status_code == 200
        assert answer.headers["x-request-id"] == "r-1"
        ids = [request.request_id for request in engine.requests]
        assert len(ids) == 2 and all(i.startswith("r-1-cmpl-") for i in ids), ids
        assert len(set(ids)) == 2


@pytest.mark.parametrize(
    "offered", [None, "", "has space", "x" * 129, "caf\u00e9", "line\nbreak"], ids=repr
)
async def test_a_request_id_that_is_none_is_minted_and_answered_on_every_answer(
    offered: str | None,
) -> None:
    engine = FakeEngine()
    headers = {} if offered is None else {"x-request-id": offered}
    minted = set()
    async with _client(_app(engine, api_key="k")) as client:
        for method, path, status in (
            ("POST", "/v1/completions", 401),  # refused before any work
            ("GET", "/nowhere", 404),
            ("GET", "/health", 200),
            ("GET", "/metrics", 200),
        ):
            raw = {k.encode(): v.encode() for k, v in headers.items()}
            answer = await client.request(method, path, headers=raw, json={})
            assert answer.status_code == status
            answered = answer.headers["x-request-id"]
            assert re.fullmatch("[0-9a-f]{32}", answered), answered
            minted.add(answered)
    assert len(minted) == 4  # a new one each time


async def test_a_websocket_answers_its_request_id_on_the_upgrade() -> None:
    app = _app(FakeEngine())
    wire = Wire(app, "/salience/ws", headers=[(b"x-request-id", b"socket-7")])
    await wire.open_session()
    assert wire.accepted is not None
    assert (b"x-request-id", b"socket-7") in wire.accepted["headers"]
    await wire.disconnect()


async def test_log_lines_written_while_a_request_is_served_carry_its_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(FakeEngine):
        async def run(self, request: GenerationRequest, receive: Any) -> None:
            raise RuntimeError("a bug of ours")

    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.ERROR, logger="app.errors"):
        async with _client(_app(Broken())) as client:
            answer = await client.post(
                "/v1/chat/completions", json=_chat(), headers={"x-request-id": "logged-9"}
            )
    assert answer.status_code == 500
    internal = [r for r in caplog.records if r.name == "app.errors"]
    assert internal and all(getattr(r, "request_id", None) == "logged-9" for r in internal)


# -- the access log --------------------------------------------------------------------


async def test_the_access_log_has_a_json_line_per_request_without_prompt_or_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _client(_app(engine, api_key="sesame", access_log="json")) as client:
            headers = {"authorization": "Bearer sesame", "x-request-id": "acc-1"}
            ok = await client.post("/v1/chat/completions", json=_chat(5), headers=headers)
            by_query = await client.post("/v1/chat/completions?token=sesame", json=_chat())
            refused = await client.post("/v1/chat/completions", json=_chat())
            await client.get("/health")
    assert ok.status_code == by_query.status_code == 200 and refused.status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 3, lines  # the probe writes none
    for line in lines:
        assert PROMPT not in line and "sesame" not in line
    first, second, third = (json.loads(line) for line in lines)
    usage = ok.json()["usage"]
    assert first["request_id"] == "acc-1"
    assert first["api"] == "chat" and first["model"] == "fake" and first["tenant"] == "default"
    assert first["status"] == 200 and first["outcome"] == "ok" and first["error"] is None
    assert first["input_tokens"] == usage["prompt_tokens"]
    assert first["output_tokens"] == usage["completion_tokens"] == 5
    assert first["cached_tokens"] == 0
    assert 0 < first["ttft_s"] <= first["duration_s"]
    assert first["client"] == "127.0.0.1:123"
    assert first["call"] == "POST /v1/chat/completions"
    assert second["call"] == "POST /v1/chat/completions"  # no query string
    assert third["status"] == 401 and third["outcome"] == "client_error"
    assert third["error"] == "Unauthenticated" and third["output_tokens"] == 0


async def test_the_text_access_log_names_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _client(_app(FakeEngine())) as client:
            await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert line.startswith('127.0.0.1:123 "POST /v1/completions" 200 request_id=')
    for field in ("api=completions", "model=fake", "outcome=ok", "output_tokens=3", "ttft_s="):
        assert field in line, line
    assert PROMPT not in line


async def test_access_log_off_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _client(_app(FakeEngine(), access_log="off")) as client:
            await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_the_text_line_has_every_field_of_the_json_one() -> None:
    """The text form writes its line out by hand (`access_log.text`), beside `fields`:
    the same fields, the time left to the handler's format, the first three unnamed."""
    record = RequestRecord("r-1", name="POST /v1/chat/completions", client="10.0.0.1:9")
    record.status, record.tenant, record.api, record.ended = 200, "acme", "chat", 1.0
    line = text(record, "tiny")
    named = dict(pair.split("=", 1) for pair in line.split(" ")[4:])
    every = fields(record, "tiny")
    in_front = [every.pop(key) for key in ("client", "call", "status")]
    every.pop("time")
    assert line.startswith(f'{in_front[0]} "{in_front[1]}" {in_front[2]} ')
    assert list(named) == list(every)
    assert named == {k: "-" if v is None else str(v) for k, v in every.items()}


# -- metrics ---------------------------------------------------------------------------


async def test_metrics_count_each_apis_requests_by_outcome_and_their_tokens() -> None:
    app = _app(FakeEngine())
    async with _client(app) as client:
        for _ in range(2):
            ok = await client.post("/v1/chat/completions", json=_chat(6, stream=True))
            assert ok.status_code == 200
        bad = await client.post("/v1/chat/completions", json={"messages": "no"})
        assert bad.status_code == 400
        message = {
            "model": "fake",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}],
        }
        assert (await client.post("/v1/messages", json=message)).status_code == 200
        app.state.admission.close()  # a draining server refuses
        refused = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert refused.status_code == 503
        text = (await client.get("/metrics")).text
    chat = {"api": "chat", "tenant": "default"}
    assert _metric(text, "switchboard_requests_total", outcome="ok", **chat) == 2
    assert _metric(text, "switchboard_requests_total", outcome="client_error", **chat) == 1
    assert _metric(text, "switchboard_requests_total", api="completions", outcome="refused") == 1
    assert _metric(text, "switchboard_requests_total", api="messages", outcome="ok") == 1
    assert _metric(text, "switchboard_output_tokens_total", **chat) == 12
    assert _metric(text, "switchboard_input_tokens_total", **chat) > 0
    assert _metric(text, "switchboard_output_tokens_total", api="messages") == 3
    assert _metric(text, "switchboard_time_to_first_token_seconds_count", **chat) == 2
    assert _metric(text, "switchboard_inter_token_latency_seconds_count", **chat) == 10  # gaps
    assert _metric(text, "switchboard_admission_wait_seconds_count", **chat) == 2
    assert _metric(text, "switchboard_request_duration_seconds_count", **chat) == 3
    buckets = _metric(text, "switchboard_request_duration_seconds_bucket", le="+Inf", **chat)
    assert buckets == 3


async def test_a_tenants_requests_are_its_own(caplog: pytest.LogCaptureFixture) -> None:
    """The tenant the key names (`--tenant-api-key`) is on the access log's line and the
    metrics' label."""
    app = _app(FakeEngine(), tenant_api_key=["acme:k-acme"], access_log="json")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        async with _client(app) as client:
            headers = {"authorization": "Bearer k-acme"}
            answer = await client.post("/v1/chat/completions", json=_chat(3), headers=headers)
            assert answer.status_code == 200
            text = (await client.get("/metrics")).text
    (line,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert line["tenant"] == "acme"
    assert _metric(text, "switchboard_output_tokens_total", api="chat", tenant="acme") == 3


def test_tenants_past_the_bound_share_one_series() -> None:
    metrics = RequestMetrics()
    for i in range(MAX_TENANTS + 5):
        record = RequestRecord(f"r{i}", name="test", api="chat")
        record.tenant = f"tenant-{i}"
        metrics.observe(record)
    families = {family.name: family for family in metrics.collect()}
    tenants = {sample.labels["tenant"] for sample in families["switchboard_requests"].samples}
    assert len(tenants) == MAX_TENANTS + 1 and OTHER_TENANT in tenants
    others = [
        s.value
        for s in families["switchboard_requests"].samples
        if s.labels["tenant"] == OTHER_TENANT and s.labels["outcome"] == "ok"
    ]
    assert others == [5]


# -- traces ----------------------------------------------------------------------------


async def test_a_traced_call_is_one_span_under_its_callers_with_the_genai_attributes(
    receiver: OtlpReceiver,
) -> None:
    engine = FakeEngine()
    app = _app(engine, receiver)
    trace_id = "1" * 32
    headers = {"traceparent": traceparent(trace_id, CALLER_SPAN), "x-request-id": "span-1"}
    async with _client(app) as client:
        answer = await client.post("/v1/chat/completions", json=_chat(5, True), headers=headers)
        assert answer.status_code == 200
    (span,) = _traced(app, receiver, trace_id)
    assert span.parent_id == CALLER_SPAN and span.kind == 2  # SERVER
    assert span.name == "chat fake" and span.service == "switchboard"
    attributes = span.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "fake"
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.server.time_to_first_token"] > 0
    assert attributes["switchboard.request_id"] == "span-1"
    assert attributes["switchboard.tenant"] == "default"
    assert attributes["http.route"] == "/v1/chat/completions"
    assert attributes["http.response.status_code"] == 200
    assert span.status_code == 0 and "error.type" not in attributes
    stages = [
        "admitted",
        "prompt_built",
        "engine.queued",
        "engine.scheduled",
        "engine.first_token",
        "engine.last_token",
        "last_token",
        "written",
    ]
    assert all(stage in span.events for stage in stages), span.events
    times = [span.events[stage] for stage in stages]
    assert times == sorted(times) and span.start_ns <= times[0] and times[-1] <= span.end_ns
    assert span.events["first_token"] <= span.events["last_token"]
    # The engine was handed this span's context: vLLM's span of the request goes under it.
    (request,) = engine.requests
    assert request.trace is not None
    assert request.trace.headers["traceparent"] == traceparent(trace_id, span.span_id)


async def test_a_request_without_a_caller_is_a_traces_root(receiver: OtlpReceiver) -> None:
    engine = FakeEngine()
    app = _app(engine, receiver)
    async with _client(app) as client:
        await client.get("/v1/models", headers={"x-request-id": "root-1"})
    app.state.telemetry.tracing.flush()
    spans = receiver.wait(
        "the span", lambda s: any(x.attributes.get("switchboard.request_id") == "root-1" for x in s)
    )
    (span,) = [s for s in spans if s.attributes.get("switchboard.request_id") == "root-1"]
    assert span.parent_id == "" and span.name == "GET /v1/models"
    assert "gen_ai.operation.name" not in span.attributes


class _FailingEngine(FakeEngine):
    """Fails after its second token, as an engine dying mid-stream would."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            count = 0
            async for event in inner:
                if count == 2:
                    raise EngineError("the engine fell over")
                count += 1
                yield event
        finally:
            await inner.aclose()


async def test_errors_mark_the_span(receiver: OtlpReceiver) -> None:
    """A client's mistake is an `error.type` (the HTTP conventions leave a server span's
    status unset for a 4xx); a refusal, and a failure inside a started stream, are the
    server's: ERROR."""
    engine = _FailingEngine()
    app = _app(engine, receiver)
    ids = {"bad": "2" * 32, "failed": "3" * 32, "refused": "4" * 32}
    async with _client(app) as client:

        async def post(name: str, body: dict[str, Any]) -> httpx.Response:
            headers = {"traceparent": traceparent(ids[name])}
            return await client.post("/v1/chat/completions", json=body, headers=headers)

        assert (await post("bad", {"messages": 7})).status_code == 400
        failed = await post("failed", _chat(8, stream=True))
        assert failed.status_code == 200 and "the engine fell over" in failed.text
        app.state.admission.close()
        assert (await post("refused", _chat())).status_code == 503
    (bad,) = _traced(app, receiver, ids["bad"])
    assert bad.attributes["error.type"] == "InvalidRequest" and bad.status_code == 0
    (failed_span,) = _traced(app, receiver, ids["failed"])
    assert failed_span.attributes["error.type"] == "EngineError"
    assert failed_span.status_code == 2
    assert failed_span.attributes["switchboard.outcome"] == "failed"
    (refused,) = _traced(app, receiver, ids["refused"])
    assert refused.attributes["error.type"] == "ShuttingDown" and refused.status_code == 2
    assert refused.attributes["switchboard.outcome"] == "refused"


async def test_an_unsampled_caller_is_not_traced(receiver: OtlpReceiver) -> None:
    engine = FakeEngine()
    app = _app(engine, receiver)
    trace_id = "5" * 32
    async with _client(app) as client:
        headers = {"traceparent": traceparent(trace_id, sampled=False)}
        await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=headers)
    app.state.telemetry.tracing.flush()
    assert receiver.spans(trace_id) == []
    (request,) = engine.requests  # the engine's own span follows the caller's choice
    assert request.trace is not None and request.trace.headers["traceparent"].endswith("-00")


async def test_untraced_a_request_carries_no_trace() -> None:
    engine = FakeEngine()
    app = _app(engine)
    assert app.state.telemetry.tracing is None
    async with _client(app) as client:
        headers = {"traceparent": traceparent("6" * 32)}
        await client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}, headers=headers)
    (request,) = engine.requests
    assert request.trace is None


# -- sessions: websockets and gRPC ---------------------------------------------------


def _settings(receiver: OtlpReceiver, **more: Any) -> Settings:
    return Settings(model="fake", engine_args={"otlp_traces_endpoint": receiver.endpoint}, **more)


def _by_request(spans: list[Span]) -> dict[str, Span]:
    return {s.attributes["switchboard.request_id"]: s for s in spans}


def test_a_salience_sockets_calls_are_spans_numbered_after_it(receiver: OtlpReceiver) -> None:
    engine = FakeEngine()
    app = create_app(_settings(receiver), engine=engine)
    trace_id = "7" * 32
    headers = {"traceparent": traceparent(trace_id, CALLER_SPAN), "x-request-id": "sock-1"}
    with (
        TestClient(app) as client,
        client.websocket_connect("/salience/ws", headers=headers) as ws,
    ):
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        session = ws.receive_json()["response"]["sessionId"]
        generate = {"sessionId": session, "appendTokens": [65, 66], "maxTokens": 3}
        ws.send_json({"id": "g", "method": "Generate", "request": generate})
        assert "done" in [ws.receive_json() for _ in range(4)][-1]["event"]
    spans = _by_request(_traced(app, receiver, trace_id, 2))
    opened, generated = spans["sock-1.1"], spans["sock-1.2"]
    assert opened.name == "salience.v1.Salience/OpenSession"
    assert opened.attributes["rpc.method"] == opened.name
    assert generated.name == "text_completion fake"
    assert generated.attributes["gen_ai.usage.output_tokens"] == 3
    assert generated.attributes["gen_ai.usage.input_tokens"] == 2
    assert {opened.parent_id, generated.parent_id} == {CALLER_SPAN}
    assert "first_token" in generated.events and "engine.first_token" in generated.events
    (request,) = engine.requests
    assert request.request_id.startswith("sock-1.2-sal-")


def test_an_evergreen_sockets_generates_are_spans(receiver: OtlpReceiver) -> None:
    engine = FakeEngine()
    app = create_app(_settings(receiver), engine=engine)
    trace_id = "8" * 32
    headers = {"traceparent": traceparent(trace_id, CALLER_SPAN), "x-request-id": "eg-1"}
    with (
        TestClient(app) as client,
        client.websocket_connect("/evergreen/ws", headers=headers) as ws,
    ):
        socket = TestClientSocket(ws, binary=False)
        socket.send(generate("p1", "r1") + leaf("p1", "hi"))
        assert socket.node("r1")[0] == "^_`a"
        during = client.get("/metrics").text
    after = TestClient(app).get("/metrics").text
    assert _metric(during, "switchboard_connections", api="evergreen") == 1
    assert _metric(after, "switchboard_connections", api="evergreen") == 0
    (span,) = _traced(app, receiver, trace_id)
    assert span.attributes["switchboard.request_id"] == "eg-1.1"
    assert span.attributes["switchboard.api"] == "evergreen" and span.parent_id == CALLER_SPAN
    assert span.attributes["gen_ai.usage.output_tokens"] == 4
    assert engine.requests[0].request_id.startswith("eg-1.1-evg-")


def test_grpc_calls_are_spans_under_their_metadata(receiver: OtlpReceiver) -> None:
    engine = FakeEngine()
    port = free_port()
    app = create_app(_settings(receiver, grpc_port=port), engine=engine)
    trace_id = "9" * 32
    with TestClient(app), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        salience = salience_grpc.SalienceStub(channel)
        metadata = (("traceparent", traceparent(trace_id, CALLER_SPAN)), ("x-request-id", "g-1"))
        opened, call = salience.OpenSession.with_call(
            pb.OpenSessionRequest(model="fake"), metadata=metadata, timeout=10
        )
        assert ("x-request-id", "g-1") in call.initial_metadata()
        request = pb.GenerateRequest(session_id=opened.session_id, append_tokens=[65], max_tokens=2)
        metadata = (("traceparent", traceparent(trace_id, CALLER_SPAN)), ("x-request-id", "g-2"))
        stream = salience.Generate(request, metadata=metadata, timeout=10)
        assert list(stream)[-1].HasField("done")
        assert ("x-request-id", "g-2") in stream.initial_metadata()
        evergreen = evergreen_grpc.EvergreenServiceStub(channel)
        metadata = (("traceparent", traceparent(trace_id, CALLER_SPAN)), ("x-request-id", "g-3"))
        sent = iter([message(generate("p1", "r1") + leaf("p1", "hi"))])
        replies = evergreen.StartSession(sent, metadata=metadata, timeout=10)
        assert any(m.node_fragments for m in replies)
        smg = smg_grpc.VllmEngineStub(channel)  # SMG's gRPC worker protocol
        metadata = (("traceparent", traceparent(trace_id, CALLER_SPAN)), ("x-request-id", "g-4"))
        asked = smg_pb.GenerateRequest(
            request_id="smg-1",
            tokenized=smg_pb.TokenizedInput(input_ids=[65, 66]),
            sampling_params=smg_pb.SamplingParams(max_tokens=3),
            stream=True,
        )
        generated = smg.Generate(asked, metadata=metadata, timeout=10)
        assert list(generated)[-1].HasField("complete")
        assert ("x-request-id", "g-4") in generated.initial_metadata()
    spans = _by_request(_traced(app, receiver, trace_id, 4))
    assert spans["g-1"].name == "salience.v1.Salience/OpenSession"
    assert spans["g-2"].name == "text_completion fake"
    assert spans["g-2"].attributes["gen_ai.usage.output_tokens"] == 2
    assert spans["g-3.1"].attributes["switchboard.api"] == "evergreen"
    assert spans["g-4"].name == "text_completion fake"
    assert spans["g-4"].attributes["switchboard.api"] == "smg"
    assert spans["g-4"].attributes["gen_ai.usage.input_tokens"] == 2
    assert spans["g-4"].attributes["gen_ai.usage.output_tokens"] == 3
    assert "engine.first_token" in spans["g-4"].events
    assert all(span.parent_id == CALLER_SPAN for span in spans.values())
    ids = sorted(request.request_id for request in engine.requests)
    assert ids[0].startswith("g-2-sal-") and ids[1].startswith("g-3.1-evg-")
    assert ids[2].startswith("g-4-")
