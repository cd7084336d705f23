"""The routers' contracts on the suite's live server (real vLLM, the tiny model): SMG's
gRPC worker service (`vllm.grpc.engine.VllmEngine`) and llm-d's token-in/token-out
route give the engine's own greedy token ids for the same token-id prompt,
streamed and not; a JSON schema (what SMG sends for a forced tool call) is enforced by
the engine; an abort by the client's request id stops a long request on either; a bad
request is refused before any engine request; GetServerInfo's engine facts are those
`vllm serve --grpc` reads off the same vLLM config; SubscribeKvEvents is UNIMPLEMENTED
on a server without a KV-event publisher (the relay: tests/unit/test_smg_worker.py).
(Through a real SMG: tests/fleet/test_smg_grpc.py; against `vllm serve
--enable-scale-out`: bench/tokens_vs_vllm.py.)"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import grpc
import httpx
import pytest
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc
from smg_grpc_servicer.vllm.model_info import (
    constrained_decoding_start,
    engine_reasoning_parser,
    server_facts,
)

from app.engine.base import GenerationRequest, SamplingOptions
from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 300, 42, 9, 250, 11, 64]
TOKENS = 12


def _completion_ids(live_server: LiveServer) -> list[int]:
    """The engine's own greedy continuation of `PROMPT` (what /v1/completions runs)."""
    request = GenerationRequest(
        request_id=f"e2e-anchor-{time.monotonic_ns()}",
        prompt_token_ids=PROMPT,
        sampling=SamplingOptions(max_tokens=TOKENS, temperature=0.0, ignore_eos=True),
    )

    async def run() -> list[int]:
        return [t async for event in live_server.engine.generate(request) for t in event.token_ids]

    ids = live_server.call(run())
    assert len(ids) == TOKENS
    return ids


def _generate(stream: bool, **params: Any) -> pb.GenerateRequest:
    sampling = {"temperature": 0.0, "max_tokens": TOKENS, "ignore_eos": True} | params
    return pb.GenerateRequest(
        request_id=f"e2e-{time.monotonic_ns()}",
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )


@pytest.fixture(scope="module")
def stub(live_server: LiveServer) -> Any:
    with grpc.insecure_channel(live_server.grpc_target) as channel:
        yield pb_grpc.VllmEngineStub(channel)


def test_smg_generate_matches_completions(live_server: LiveServer, stub: Any) -> None:
    expected = _completion_ids(live_server)
    streamed = list(stub.Generate(_generate(True, logprobs=1), timeout=300))
    ids = [t for r in streamed if r.HasField("chunk") for t in r.chunk.token_ids]
    assert ids == expected
    logprob_ids = [
        t for r in streamed if r.HasField("chunk") for t in r.chunk.output_logprobs.token_ids
    ]
    assert logprob_ids == expected
    done = streamed[-1].complete
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == (
        "length",
        len(PROMPT),
        TOKENS,
    )
    whole = list(stub.Generate(_generate(False), timeout=300))
    assert [list(r.complete.output_ids) for r in whole] == [expected]


def test_smg_json_schema_is_enforced(live_server: LiveServer, stub: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}},
        "required": ["name"],
        "additionalProperties": False,
    }
    for _ in range(10):
        params: dict[str, Any] = {"temperature": 1.0, "max_tokens": 60, "ignore_eos": False}
        params["json_schema"] = json.dumps(schema)
        done = list(stub.Generate(_generate(False, **params), timeout=300))[-1].complete
        if done.finish_reason == "length":
            continue  # cut short: no whole document to read
        text = live_server.engine.tokenizer.decode(list(done.output_ids))
        document = json.loads(text)
        assert set(document) == {"name"} and len(document["name"]) <= 8, text


def test_smg_bad_requests_run_nothing(live_server: LiveServer, stub: Any) -> None:
    before = live_server.engine_requests()
    for params in ({"temperature": 9.0}, {"regex": "(unclosed"}, {"max_tokens": 10**6}):
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(_generate(True, **params), timeout=300))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert live_server.engine_requests() == before


def test_smg_abort_stops_the_request(live_server: LiveServer, stub: Any) -> None:
    request = _generate(True, max_tokens=900)
    stream = stub.Generate(request, timeout=120)
    first = next(stream)
    assert first.HasField("chunk")
    stub.Abort(pb.AbortRequest(request_ids=[request.request_id]), timeout=30)
    rest = list(stream)
    assert rest[-1].complete.finish_reason == "abort"
    assert rest[-1].complete.completion_tokens < 900


def test_smg_server_info_is_vllm_serve_grpcs_on_the_same_engine(
    live_server: LiveServer, stub: Any
) -> None:
    """The engine's facts SMG pairs and counts workers by are what `vllm serve --grpc`
    (smg-grpc-servicer's `server_facts`) reads off the live engine's own vLLM config."""
    config = live_server.engine._llm.vllm_config
    facts = server_facts(config)
    info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
    assert (info.block_size, info.kv_cache_dtype, info.model_dtype, info.max_num_seqs) == (
        facts["block_size"],
        facts["kv_cache_dtype"],
        facts["model_dtype"],
        facts["max_num_seqs"],
    )
    assert info.block_size > 0 and info.max_num_seqs > 0 and info.model_dtype
    # The live server runs no reasoning parser: vLLM constrains from the first token.
    assert (info.engine_reasoning_parser, info.constrained_decoding_start) == (
        engine_reasoning_parser(config),
        constrained_decoding_start(config),
    )
    assert info.constrained_decoding_start == "first_token"


def test_smg_kv_events_are_unimplemented_without_a_publisher(stub: Any) -> None:
    """The live server runs without --kv-events-config: vLLM publishes nothing, so SMG is
    told UNIMPLEMENTED (and stops asking), not left with a silent stream."""
    with pytest.raises(grpc.RpcError) as info:
        list(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=30))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "--kv-events-config" in (info.value.details() or "")


def test_tokens_generate_matches_completions(live_server: LiveServer) -> None:
    expected = _completion_ids(live_server)
    params = {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True, "logprobs": 2}
    body = {"model": live_server.model, "token_ids": PROMPT, "sampling_params": params}
    url = f"{live_server.base_url}/inference/v1/generate"
    plain = httpx.post(url, json=body, timeout=300).json()
    choice = plain["choices"][0]
    assert choice["token_ids"] == expected
    assert [c["token_id"] for c in choice["logprobs"]["content"]] == expected
    streamed: list[int] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=300) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                streamed += [t for c in event["choices"] for t in c["token_ids"]]
    assert streamed == expected


def test_tokens_abort_stops_the_request(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/inference/v1/generate"
    params = {"max_tokens": 900, "ignore_eos": True}
    body = {"token_ids": PROMPT, "sampling_params": params, "request_id": "e2e-abort"}
    answers: list[Any] = []
    thread = threading.Thread(
        target=lambda: answers.append(httpx.post(url, json=body, timeout=120).json())
    )
    thread.start()
    deadline = time.monotonic() + 60
    while live_server.running_requests() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    aborted = httpx.post(
        f"{live_server.base_url}/inference/v1/abort_requests",
        json={"request_ids": ["e2e-abort"]},
        timeout=30,
    )
    assert aborted.status_code == 200
    thread.join(120)
    choice = answers[0]["choices"][0]
    assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 900
