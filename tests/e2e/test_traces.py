"""What an operator sees, on the live server (real vLLM, traced to the suite's OTLP
receiver, tests/otlp_receiver.py): each surface's request (the HTTP APIs, GraphPipe, a
Responses-websocket response, a Salience Generate over gRPC and over the websocket, an
Evergreen GENERATE over the websocket and over gRPC, SMG's gRPC Generate) one SERVER span
under its caller's `traceparent`, with the GenAI attributes and the engine's stages, and
vLLM's own span of each of its engine requests (`llm_request`) under it, sent by the
server's exporter, naming an engine request id
that begins with the request's `x-request-id` (as vLLM's own log line of the request
does); the access log's fields of a real
request, its cached tokens included. The fake engine's finer points (errors, minted ids,
metrics): tests/unit/test_telemetry.py."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import websockets.sync.client
from google.protobuf import json_format
from smg_grpc_proto.generated import vllm_engine_pb2 as smg_pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as smg_grpc

from app.telemetry.access_log import LOGGER
from app.telemetry.ids import REQUEST_ID_HEADER
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import LiveServer
from tests.evergreen_frames import generate, leaf, message
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.otlp_receiver import Span, session_receiver, traceparent
from tests.waits import until_sync

pytestmark = pytest.mark.e2e

CALLER = "00f067aa0ba902b7"
ENGINE_SPAN = "llm_request"


def _caller() -> tuple[str, dict[str, str]]:
    """A fresh trace id, and the headers of a caller's span in it with a request id."""
    trace_id = secrets.token_hex(16)
    request_id = f"e2e-{trace_id[:8]}"
    return trace_id, {"traceparent": traceparent(trace_id, CALLER), "x-request-id": request_id}


def _ours_and_vllms(trace_id: str, engine_requests: int) -> tuple[Span, list[Span]]:
    """Our one span of the trace, and vLLM's spans of its engine requests, once all came."""

    def complete(spans: list[Span]) -> bool:
        ours = [s for s in spans if s.name != ENGINE_SPAN]
        return len(ours) == 1 and sum(s.name == ENGINE_SPAN for s in spans) == engine_requests

    spans = session_receiver().trace(trace_id, "our span and vLLM's", complete)
    (ours,) = [s for s in spans if s.name != ENGINE_SPAN]
    return ours, [s for s in spans if s.name == ENGINE_SPAN]


def _one_call(trace_id: str, request_id: str, calls: int) -> tuple[Span, list[Span]]:
    """Our span of the call `request_id` among a socket's `calls` spans of the trace, and
    vLLM's of its one engine request."""

    def complete(spans: list[Span]) -> bool:
        engine = [s for s in spans if s.name == ENGINE_SPAN]
        return len(spans) - len(engine) == calls and len(engine) == 1

    spans = session_receiver().trace(trace_id, "the calls' spans and vLLM's", complete)
    (ours,) = [s for s in spans if s.attributes.get("switchboard.request_id") == request_id]
    return ours, [s for s in spans if s.name == ENGINE_SPAN]


def _check(
    ours: Span,
    engine: list[Span],
    request_id: str,
    *,
    name: str,
    operation: str,
    built: bool = True,
) -> None:
    """`built`: the call builds its prompt after admission (the road's calls); a GraphPipe
    batch is decoded before it asks admission and has no such stage."""
    assert ours.parent_id == CALLER and ours.kind == 2, ours  # SERVER, under the caller
    assert ours.name == name and ours.service == "switchboard"
    attributes = ours.attributes
    assert attributes["gen_ai.operation.name"] == operation
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"]
    assert attributes["gen_ai.server.time_to_first_token"] > 0
    assert attributes["switchboard.request_id"] == request_id
    assert ours.status_code == 0
    stages = ["admitted", "prompt_built", "engine.scheduled", "engine.first_token", "written"]
    if not built:
        stages.remove("prompt_built")
    times = [ours.events[stage] for stage in stages]
    assert times == sorted(times), ours.events
    assert ours.start_ns <= times[0] and times[-1] <= ours.end_ns
    for span in engine:  # vLLM's own, for each engine request, under ours
        assert span.parent_id == ours.span_id, (span, ours)
        # Sent by the server's exporter (`Tracing.lend_to_vllm`), not vLLM's own.
        assert span.peer == ours.peer, "vLLM's span came through an exporter of its own"
        assert span.attributes["gen_ai.request.id"].startswith(f"{request_id}-")
        assert span.attributes["gen_ai.usage.completion_tokens"] > 0
    ids = {span.attributes["gen_ai.request.id"] for span in engine}
    assert len(ids) == len(engine)


def _check_completion(ours: Span, engine: list[Span], request_id: str, built: bool = True) -> None:
    """`_check` of a text completion of the tiny model (most surfaces' calls)."""
    _check(
        ours,
        engine,
        request_id,
        name="text_completion tiny",
        operation="text_completion",
        built=built,
    )


def _completed(live_server: LiveServer, body: dict[str, Any], request_id: str) -> httpx.Response:
    """`body` completed on /v1/completions under the caller's `request_id`."""
    answer = httpx.post(
        f"{live_server.base_url}/v1/completions",
        json=body,
        headers={"x-request-id": request_id},
        timeout=60,
    )
    assert answer.status_code == 200
    return answer


def test_completions_with_choices(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    body = {"model": "tiny", "prompt": "def main():", "max_tokens": 6, "n": 2}
    answer = httpx.post(f"{live_server.base_url}/v1/completions", json=body, headers=headers)
    assert answer.status_code == 200
    assert answer.headers["x-request-id"] == headers["x-request-id"]
    ours, engine = _ours_and_vllms(trace_id, 2)
    _check_completion(ours, engine, headers["x-request-id"])
    assert (
        ours.attributes["gen_ai.usage.output_tokens"] == answer.json()["usage"]["completion_tokens"]
    )


def test_streamed_chat(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{live_server.base_url}/v1/chat/completions", json=body, headers=headers
    ) as answer:
        assert answer.headers["x-request-id"] == headers["x-request-id"]
        assert "[DONE]" in "".join(answer.iter_text())
    ours, engine = _ours_and_vllms(trace_id, 1)
    _check(ours, engine, headers["x-request-id"], name="chat tiny", operation="chat")


def test_responses_and_messages(live_server: LiveServer) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 6}),
        (
            "/v1/messages",
            {"model": "tiny", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ]
    for path, body in calls:
        trace_id, headers = _caller()
        answer = httpx.post(f"{live_server.base_url}{path}", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        ours, engine = _ours_and_vllms(trace_id, 1)
        _check(ours, engine, headers["x-request-id"], name="chat tiny", operation="chat")


def test_graphpipe_batch(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    prompts = np.empty(2, dtype=object)
    prompts[:] = [b"import os", b"def f():"]
    request = infer_request(Infer([prompts], config='{"max_tokens": 4}'))
    answer = httpx.post(f"{live_server.base_url}/graphpipe", content=request, headers=headers)
    assert answer.status_code == 200
    assert not read_infer_response(answer.content).errors
    ours, engine = _ours_and_vllms(trace_id, 2)
    _check_completion(ours, engine, headers["x-request-id"], built=False)


def test_a_responses_websocket_response(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    create = {"type": "response.create", "model": "tiny", "input": "hi", "max_output_tokens": 5}
    with websockets.sync.client.connect(
        f"{live_server.ws_url}/v1/responses", additional_headers=headers
    ) as socket:
        assert socket.response is not None
        assert socket.response.headers["x-request-id"] == headers["x-request-id"]
        socket.send(json.dumps(create))
        # Five tokens end it at max_output_tokens: `response.incomplete`, its last event.
        ended = ("response.completed", "response.incomplete")
        while json.loads(socket.recv(timeout=60))["type"] not in ended:
            pass
    ours, engine = _ours_and_vllms(trace_id, 1)
    _check(ours, engine, f"{headers['x-request-id']}.1", name="chat tiny", operation="chat")


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    """The access log's lines written meanwhile, read."""
    lines: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(record.getMessage()))

    handler = Keep()
    logger = logging.getLogger(LOGGER)
    # `switchboard serve` sets the access log's level (app.telemetry.logs); the live
    # server's logger is left at the root's, which may be above INFO.
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_access_log_of_real_requests(
    live_server: LiveServer, access_lines: list[dict[str, Any]]
) -> None:
    """The second of two identical long prompts finds the first's blocks in vLLM's prefix
    cache: its line says how many of its input tokens were cached."""
    prompt = " ".join(f"word{i}" for i in range(150))  # ~600 tokens: blocks of 128
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    usages, ids = [], []
    for turn in range(2):
        request_id = f"access-{secrets.token_hex(4)}-{turn}"
        usages.append(_completed(live_server, body, request_id).json()["usage"])
        ids.append(request_id)

    def line_of(request_id: str) -> dict[str, Any]:
        # Written once the answer has gone: the client may read it before the server's
        # thread logs it.
        def lines() -> list[dict[str, Any]]:
            return [line for line in access_lines if line["request_id"] == request_id]

        until_sync(lambda: bool(lines()), f"the access log's line of {request_id}")
        (line,) = lines()
        return line

    first, second = (line_of(i) for i in ids)
    for line, usage in ((first, usages[0]), (second, usages[1])):
        assert line["api"] == "completions" and line["model"] == "tiny"
        assert line["status"] == 200 and line["outcome"] == "ok"
        assert line["input_tokens"] == usage["prompt_tokens"] > 256
        assert line["output_tokens"] == usage["completion_tokens"] == 4
        assert 0 < line["ttft_s"] <= line["duration_s"]
        assert line["client"].startswith("127.0.0.1:")
        assert prompt[:20] not in json.dumps(line)
    assert first["cached_tokens"] < second["cached_tokens"]
    assert second["cached_tokens"] >= 256  # every whole block of the first prompt


def test_the_request_id_begins_the_engines_in_vllms_own_log(live_server: LiveServer) -> None:
    """vLLM's own line of each request it adds (`--enable-log-requests`: "Added request
    ID.") names it by an id that begins with the caller's `x-request-id`, so an operator
    finds the request in the engine's log by the id the client sent."""
    from vllm.v1.engine.async_llm import logger as vllm_logger

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    llm = live_server.engine._llm  # vLLM's AsyncLLM, which --enable-log-requests sets
    handler, level = Keep(), vllm_logger.level
    vllm_logger.setLevel(logging.INFO)
    vllm_logger.addHandler(handler)
    llm.log_requests = True
    request_id = f"vlog-{secrets.token_hex(4)}"
    try:
        body = {"model": "tiny", "prompt": "def main():", "max_tokens": 2}
        _completed(live_server, body, request_id)
    finally:  # written as the engine took the request, before its answer
        llm.log_requests = False
        vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(level)
    added = [line for line in lines if line.startswith(f"Added request {request_id}-")]
    assert len(added) == 1, lines


def test_a_salience_generate_over_grpc(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    metadata = tuple(headers.items())
    with grpc.insecure_channel(live_server.grpc_target) as channel:
        salience = salience_grpc.SalienceStub(channel)
        opened = salience.OpenSession(pb.OpenSessionRequest(model="tiny"), timeout=60)
        request = pb.GenerateRequest(
            session_id=opened.session_id, append_tokens=[5, 6, 7], max_tokens=4
        )
        stream = salience.Generate(request, metadata=metadata, timeout=60)
        assert list(stream)[-1].HasField("done")
        assert (REQUEST_ID_HEADER, headers["x-request-id"]) in stream.initial_metadata()
    ours, engine = _ours_and_vllms(trace_id, 1)
    _check_completion(ours, engine, headers["x-request-id"])


def test_an_evergreen_generate_over_the_websocket(live_server: LiveServer) -> None:
    trace_id, headers = _caller()
    with websockets.sync.client.connect(
        f"{live_server.ws_url}/evergreen/ws", additional_headers=headers
    ) as socket:
        sent = message(generate("p1", "r1", max_tokens=4) + leaf("p1", "hi"))
        socket.send(json_format.MessageToJson(sent))
        final = False
        while not final:
            frame = service_pb.SessionMessage()
            json_format.Parse(socket.recv(timeout=60), frame)
            final = any(not f.continued for f in frame.node_fragments if f.id == "r1")
    ours, engine = _ours_and_vllms(trace_id, 1)
    _check_completion(ours, engine, f"{headers['x-request-id']}.1")


def test_a_salience_generate_over_the_websocket(live_server: LiveServer) -> None:
    """The socket's calls are numbered after it: its OpenSession `.1`, its Generate `.2`."""
    trace_id, headers = _caller()
    with websockets.sync.client.connect(
        f"{live_server.ws_url}/salience/ws", additional_headers=headers
    ) as socket:
        opened = {"id": "o", "method": "OpenSession", "request": {"model": "tiny"}}
        socket.send(json.dumps(opened))
        session = json.loads(socket.recv(timeout=60))["response"]["sessionId"]
        request = {"sessionId": session, "appendTokens": [5, 6, 7], "maxTokens": 4}
        socket.send(json.dumps({"id": "g", "method": "Generate", "request": request}))
        while "done" not in json.loads(socket.recv(timeout=60)).get("event", {}):
            pass
    ours, engine = _one_call(trace_id, f"{headers['x-request-id']}.2", 2)
    _check_completion(ours, engine, f"{headers['x-request-id']}.2")


def test_an_evergreen_generate_and_an_smg_generate_over_grpc(live_server: LiveServer) -> None:
    with grpc.insecure_channel(live_server.grpc_target) as channel:
        trace_id, headers = _caller()
        evergreen = evergreen_grpc.EvergreenServiceStub(channel)
        sent = iter([message(generate("p1", "r1", max_tokens=4) + leaf("p1", "hi"))])
        replies = evergreen.StartSession(sent, metadata=tuple(headers.items()), timeout=60)
        assert any(reply.node_fragments for reply in replies)
        ours, engine = _ours_and_vllms(trace_id, 1)
        _check_completion(ours, engine, f"{headers['x-request-id']}.1")
        trace_id, headers = _caller()
        smg = smg_grpc.VllmEngineStub(channel)  # SMG's gRPC worker protocol
        asked = smg_pb.GenerateRequest(
            request_id="smg-1",
            tokenized=smg_pb.TokenizedInput(input_ids=[5, 6, 7]),
            sampling_params=smg_pb.SamplingParams(max_tokens=4),
            stream=True,
        )
        generated = smg.Generate(asked, metadata=tuple(headers.items()), timeout=60)
        assert list(generated)[-1].HasField("complete")
        ours, engine = _ours_and_vllms(trace_id, 1)
        _check_completion(ours, engine, headers["x-request-id"])
        assert ours.attributes["switchboard.api"] == "smg"
