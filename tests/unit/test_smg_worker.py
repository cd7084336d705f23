"""SMG's gRPC worker protocol (`vllm.grpc.engine.VllmEngine`) on the app's gRPC port, on
a fake engine: the health names SMG probes, Generate streamed and not (token ids, usage,
logprobs, n, finish reasons), the errors (a bad request, a full queue, a draining
server), Abort by the client's request id, a cancelled call aborting its engine
requests, and the informational RPCs. (Through a real SMG on real vLLM:
tests/fleet/test_smg_grpc.py.)"""

from __future__ import annotations

import asyncio
import io
import itertools
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest
import zmq
from fastapi.testclient import TestClient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from app.config import Settings
from app.main import create_app
from app.routes.grpc import vllm_engine
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.waits import until

SERVICE = "vllm.grpc.engine.VllmEngine"


@contextmanager
def worker(
    engine: FakeEngine | None = None, **more: Any
) -> Iterator[tuple[pb_grpc.VllmEngineStub, TestClient, grpc.Channel]]:
    port = free_port()
    app = create_app(Settings(model="fake", grpc_port=port, **more), engine=engine or FakeEngine())
    with TestClient(app) as client, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield pb_grpc.VllmEngineStub(channel), client, channel


def request(
    ids: list[int], *, stream: bool = True, request_id: str = "r1", **params: Any
) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(**params),
        stream=stream,
    )


def test_health_answers_for_the_name_smg_probes_and_turns_with_the_drain() -> None:
    with worker() as (stub, client, channel):
        health: Any = health_pb2_grpc.HealthStub(channel)  # its stubs type no methods
        serving = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
        assert serving.status == health_pb2.HealthCheckResponse.SERVING
        assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=10).healthy
        app: Any = client.app
        portal: Any = client.portal  # set inside `with`
        portal.call(app.state.drain.begin)
        drained = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10)
        assert drained.status == health_pb2.HealthCheckResponse.NOT_SERVING
        answer = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
        assert not answer.healthy and answer.message == "draining"
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(request([65, 66], max_tokens=2), timeout=10))
        refused = info.value
        assert isinstance(refused, grpc.Call)
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        # The status alone, no initial metadata before it: SMG's client sees the call's
        # start fail and tries another worker (a stream that began and then failed
        # would be passed on to its client as an error).
        assert not refused.initial_metadata()
        assert [key for key, _ in refused.trailing_metadata() or ()].count("x-request-id") == 1


def test_streamed_generate_sends_delta_chunks_then_a_complete() -> None:
    with worker() as (stub, _, _):
        replies = list(stub.Generate(request([65, 66], max_tokens=4), timeout=10))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    completes = [r.complete for r in replies if r.HasField("complete")]
    assert replies[-1].HasField("complete") and len(completes) == 1
    assert [t for c in chunks for t in c.token_ids] == [67, 68, 69, 70]
    assert sum(c.completion_tokens for c in chunks) == 4
    assert all(c.prompt_tokens == 2 for c in chunks)
    done = completes[0]
    assert (done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("length", 2, 4)
    assert list(done.output_ids) == []  # SMG accumulates a vLLM worker's chunks


@pytest.mark.parametrize(("interval_ms", "fewer"), [(100.0, True), (0.0, False)])
def test_a_streams_chunks_carry_what_came_in_the_interval(interval_ms: float, fewer: bool) -> None:
    """30 tokens 10 ms apart: in chunks at most every 100 ms, at most a few chunks (the
    engine only slows on a loaded host, which makes fewer); every token, in order, either
    way."""
    engine = FakeEngine(step_delay=0.01)
    with worker(engine, grpc_stream_interval_ms=interval_ms) as (stub, _, _):
        replies = list(stub.Generate(request([65], max_tokens=30), timeout=30))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    assert [t for c in chunks for t in c.token_ids] == list(range(66, 96))
    assert len(chunks[0].token_ids) == 1  # the first token at once
    if fewer:
        assert len(chunks) < 10, [len(c.token_ids) for c in chunks]


def test_the_interval_grows_with_the_streams_past_the_chunks_an_interval() -> None:
    """Past --grpc-stream-chunks-per-interval streamed choices, each stream's interval
    grows in proportion: 8 streams of 30 tokens 10 ms apart at 1 chunk an interval of
    20 ms pause 160 ms between chunks, so a few chunks each (at 20 ms, 16); a lone stream
    keeps 20 ms; every token comes, in order, either way."""
    engine = FakeEngine(step_delay=0.01)
    settings: dict[str, Any] = {
        "grpc_stream_interval_ms": 20.0,
        "grpc_stream_chunks_per_interval": 1,
    }

    def chunks(stub: pb_grpc.VllmEngineStub, index: int) -> list[list[int]]:
        call = stub.Generate(request([65], max_tokens=30, request_id=f"r{index}"), timeout=30)
        return [list(r.chunk.token_ids) for r in call if r.HasField("chunk")]

    with worker(engine, **settings) as (stub, _, _):
        with ThreadPoolExecutor(8) as pool:
            streams = list(pool.map(lambda index: chunks(stub, index), range(8)))
        alone = chunks(stub, 8)
    for stream in [*streams, alone]:
        assert [t for chunk in stream for t in chunk] == list(range(66, 96))
        assert len(stream[0]) == 1  # the first token at once
    sent = sum(len(stream) for stream in streams)
    assert sent < 8 * 8, [[len(chunk) for chunk in stream] for stream in streams]
    assert len(alone) >= 8, [len(chunk) for chunk in alone]  # fewer only on a slow host


def test_a_streams_end_does_not_wait_out_the_interval() -> None:
    """A choice's last token and its Complete go as they come, not after the interval
    under way: with a 10-minute interval, a stream of 5 tokens ends well within its
    deadline."""
    engine = FakeEngine(step_delay=0.01)
    with worker(engine, grpc_stream_interval_ms=600_000.0) as (stub, _, _):
        replies = list(stub.Generate(request([65], max_tokens=5), timeout=30))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    assert [t for c in chunks for t in c.token_ids] == [66, 67, 68, 69, 70]
    assert replies[-1].complete.finish_reason == "length"


def test_unstreamed_generate_answers_one_complete_per_choice() -> None:
    with worker() as (stub, _, _):
        replies = list(
            stub.Generate(
                request([65], stream=False, max_tokens=3, n=2, temperature=1.0, logprobs=2),
                timeout=10,
            )
        )
    assert all(r.HasField("complete") for r in replies)
    by_index = {r.complete.index: r.complete for r in replies}
    assert sorted(by_index) == [0, 1]
    for done in by_index.values():
        assert list(done.output_ids) == [66, 67, 68]
        assert list(done.output_logprobs.token_ids) == [66, 67, 68]
        assert list(done.output_logprobs.top_logprobs[0].token_ids) == [66, 67]


def test_a_stop_token_is_the_matched_stop() -> None:
    with worker() as (stub, _, _):
        replies = list(stub.Generate(request([65], max_tokens=8, stop_token_ids=[68]), timeout=10))
    done = replies[-1].complete
    assert done.finish_reason == "stop" and done.matched_token_id == 68


@pytest.mark.parametrize(
    ("ids", "params", "field"),
    [
        ([65, 999], {"max_tokens": 2}, "tokenized.input_ids"),
        ([65], {"max_tokens": 2, "temperature": 5.0}, "sampling_params.temperature"),
        ([65], {"max_tokens": 2, "json_schema": "not json"}, "sampling_params.json_schema"),
        ([65], {"max_tokens": 2, "regex": "UNCOMPILABLE"}, "cannot compile"),
        ([65], {"max_tokens": 100_000}, "sampling_params.max_tokens"),
    ],
)
def test_a_bad_request_is_invalid_argument_naming_its_field(
    ids: list[int], params: dict[str, Any], field: str
) -> None:
    engine = FakeEngine()
    with worker(engine) as (stub, _, _), pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(request(ids, **params), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # never SMG's 429
    assert field in (info.value.details() or "")
    assert engine.requests == []


def test_multimodal_inputs_are_refused() -> None:
    with worker() as (stub, _, _), pytest.raises(grpc.RpcError) as info:
        bad = request([65], max_tokens=2)
        bad.mm_inputs.im_token_id = 3
        list(stub.Generate(bad, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_full_queue_refuses_unavailable_before_prompt_work() -> None:
    engine = FakeEngine()
    with worker(engine, max_queued_requests=1) as (stub, client, _):
        app: Any = client.app
        portal: Any = client.portal  # set inside `with`
        admission = app.state.admission
        held = portal.call(admission.admit, "test")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(request([65], max_tokens=2), timeout=10))
        portal.call(held.release)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "retry after" in (info.value.details() or "")
        assert admission.refused["smg"] == 1
        assert engine.requests == []


def test_abort_by_request_id_ends_the_stream_as_aborted() -> None:
    engine = FakeEngine(step_delay=0.05)
    with worker(engine) as (stub, _, _):
        stream = stub.Generate(request([65], max_tokens=200, request_id="mine"), timeout=30)
        first = next(stream)
        assert first.HasField("chunk")
        stub.Abort(pb.AbortRequest(request_ids=["mine", "unknown"]), timeout=10)
        rest = list(stream)
    assert rest[-1].complete.finish_reason == "abort"
    produced = sum(len(r.chunk.token_ids) for r in [first, *rest] if r.HasField("chunk"))
    assert produced < 200
    assert len(engine.aborted) == 1 and not engine.running


def test_abort_reaches_only_its_tenants_requests_and_tells_nothing_of_others() -> None:
    """The Abort RPC as the caller's tenant: another tenant's abort of a running name
    stops nothing and answers as for a name no call holds; the owner's stops it."""
    engine = FakeEngine(step_delay=0.05)
    keys: dict[str, Any] = {"api_key": "full", "tenant_api_key": ["acme:acme-key", "beta:beta-key"]}
    acme, beta, full = (
        (("authorization", f"Bearer {k}"),) for k in ("acme-key", "beta-key", "full")
    )
    with worker(engine, **keys) as (stub, _, _):
        stream = stub.Generate(
            request([65], max_tokens=200, request_id="mine"), metadata=acme, timeout=30
        )
        first = next(stream)
        assert first.HasField("chunk")
        for other in (beta, full):
            answers = [
                stub.Abort(pb.AbortRequest(request_ids=[name]), metadata=other, timeout=10)
                for name in ("mine", "unknown")
            ]
            assert answers[0] == answers[1] == pb.AbortResponse()
        assert engine.aborted == [] and engine.running
        stub.Abort(pb.AbortRequest(request_ids=["mine"]), metadata=acme, timeout=10)
        rest = list(stream)
    assert rest[-1].complete.finish_reason == "abort"
    assert len(engine.aborted) == 1


def test_a_cancelled_call_aborts_its_engine_request() -> None:
    engine = FakeEngine(step_delay=0.05)
    with worker(engine) as (stub, _, _):
        stream = stub.Generate(request([65], max_tokens=500), timeout=30)
        next(stream)
        stream.cancel()
        asyncio.run(until(lambda: not engine.running, "the engine request ends"))
    assert len(engine.requests) == 1


def test_model_info_loads_and_server_info() -> None:
    with worker() as (stub, _, _):
        model = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (model.served_model_name, model.vocab_size, model.max_context_length) == (
            "fake",
            256,
            512,
        )
        assert model.is_generation and list(model.eos_token_ids) == [0]
        loads = stub.GetLoads(pb.GetLoadsRequest(), timeout=10)
        assert loads.dp_rank_count == 1 and loads.loads[0].num_total_reqs == 0
        server = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        assert server.server_type == "vllm-grpc" and not server.is_paused


def test_server_info_carries_the_engines_kv_cache_and_scheduler_facts() -> None:
    engine = FakeEngine()
    engine.info = replace(
        engine.info,
        kv_block_size=16,
        kv_cache_dtype="auto",
        model_dtype="torch.bfloat16",
        max_num_seqs=64,
        reasoning_parser="qwen3",
        grammar_start="after_reasoning",
    )
    with worker(engine) as (stub, _, _):
        server = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert (server.block_size, server.kv_cache_dtype, server.model_dtype) == (
        16,
        "auto",
        "torch.bfloat16",
    )
    assert server.max_num_seqs == 64
    assert (server.engine_reasoning_parser, server.constrained_decoding_start) == (
        "qwen3",
        "after_reasoning",
    )


def test_get_tokenizer_streams_the_model_directorys_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {}}')
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    engine = FakeEngine()
    engine._info = replace(engine.info, model_path=str(tmp_path))
    with worker(engine) as (stub, _, _):
        chunks = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=10))
        model = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert chunks[-1].sha256
    names = zipfile.ZipFile(io.BytesIO(b"".join(c.data for c in chunks))).namelist()
    assert sorted(names) == ["config.json", "tokenizer.json"]
    assert model.model_type == "llama"


def test_a_model_without_tokenizer_files_is_told_without_its_path(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine._info = replace(engine.info, model_path=str(tmp_path / "hidden-model-dir"))
    with worker(engine) as (stub, _, _), pytest.raises(grpc.RpcError) as info:
        list(stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=10))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "error id" in str(info.value.details())
    assert "hidden-model-dir" not in str(info.value.details())


def test_unserved_methods_are_unimplemented() -> None:
    with worker() as (stub, _, _):
        with pytest.raises(grpc.RpcError) as info:
            stub.Embed(pb.EmbedRequest(request_id="e"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as info:  # an engine that publishes none
            list(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


# -- KV-cache events -------------------------------------------------------------------

STORED: dict[str, Any] = {  # one BlockStored as vLLM's publisher encodes it
    "type": "BlockStored",
    "block_hashes": [2**63 + 5],  # vLLM sends the low 64 bits of the digest unsigned
    "parent_block_hash": None,
    "token_ids": [5, 6, 7, 8],
    "block_size": 4,
    "lora_id": 1,
    "medium": "GPU",
    "lora_name": "tiny-lora",
    "extra_keys": [["tiny-lora"]],
}


@contextmanager
def publisher(engine: FakeEngine) -> Iterator[Callable[[], None]]:
    """A ZMQ publisher in vLLM's framing (topic, sequence, msgpack batch) that `engine`
    reports as its rank 0's, as vLLM's `--kv-events-config` would (a bind wildcard);
    yields a function that publishes the next batch."""
    port = free_port()
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    engine.kv_sources = {
        0: {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "",
            "endpoint": f"tcp://*:{port}", "replay_endpoint": None},
    }  # fmt: skip
    sequence = itertools.count(1)

    def publish() -> None:
        batch = msgspec.msgpack.encode([1.0, [STORED], 0])
        pub.send_multipart([b"", next(sequence).to_bytes(8, "big"), batch])

    try:
        yield publish
    finally:
        pub.close(linger=0)
        context.term()


def _first_batch(
    replies: Iterator[common_pb2.KvEventBatch], publish: Callable[[], None]
) -> common_pb2.KvEventBatch:
    """The first batch with events (a subscriber joins a publisher late: publish until
    it hears; the relay's load-only heartbeats carry none)."""
    found: list[common_pb2.KvEventBatch] = []

    def read() -> None:
        found.append(next(reply for reply in replies if reply.events))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 20
    while reader.is_alive() and time.monotonic() < deadline:
        publish()
        reader.join(0.1)
    assert found, "no KV-event batch relayed in 20 s"
    return found[0]


def test_kv_events_are_relayed_with_the_load_record() -> None:
    engine = FakeEngine()
    with publisher(engine) as publish, worker(engine) as (stub, _, _):
        replies = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=30)
        batch = _first_batch(replies, publish)
        replies.cancel()
    (event,) = batch.events
    (block,) = event.stored.blocks
    assert block.block_hash == 5 - 2**63  # the proto's signed 64 bits of the same hash
    assert (list(block.token_ids), block.block_size, block.lora_id) == ([5, 6, 7, 8], 4, 1)
    assert batch.dp_rank == 0 and batch.sequence_number >= 1
    assert batch.HasField("load")  # the worker's load on every batch, as GetLoads says it


def test_kv_events_need_a_full_key_the_tokens_being_every_tenants() -> None:
    engine = FakeEngine()
    keys: dict[str, Any] = {"api_key": "full", "tenant_api_key": ["acme:acme-key"]}
    with publisher(engine) as publish, worker(engine, **keys) as (stub, _, _):
        with pytest.raises(grpc.RpcError) as info:
            acme = (("authorization", "Bearer acme-key"),)
            request = common_pb2.SubscribeKvEventsRequest()
            list(stub.SubscribeKvEvents(request, metadata=acme, timeout=10))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        full = (("authorization", "Bearer full"),)
        replies = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(), metadata=full, timeout=30
        )
        assert _first_batch(replies, publish).events
        replies.cancel()


def test_kv_event_subscriptions_are_bounded_and_end_with_the_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_engine, "MAX_KV_SUBSCRIBERS", 1)
    engine = FakeEngine()
    with publisher(engine) as publish, worker(engine) as (stub, client, _):
        replies = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=30)
        _first_batch(replies, publish)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        app: Any = client.app
        portal: Any = client.portal
        drained = threading.Thread(
            target=portal.call, args=(app.state.drain.run, engine.abort), daemon=True
        )
        drained.start()
        with pytest.raises(grpc.RpcError) as info:
            list(replies)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        drained.join(30)
        assert not drained.is_alive()  # the drain waited for the subscription's end
        with pytest.raises(grpc.RpcError) as info:  # none opens while the server drains
            list(stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=10))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_concurrent_streams_each_get_their_own_tokens() -> None:
    engine = FakeEngine(step_delay=0.01)
    results: dict[int, list[int]] = {}
    with worker(engine) as (stub, _, _):

        def one(i: int) -> None:
            replies = stub.Generate(
                request([i + 10], max_tokens=20, request_id=f"c{i}"), timeout=30
            )
            results[i] = [t for r in replies if r.HasField("chunk") for t in r.chunk.token_ids]

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert results == {i: list(range(i + 11, i + 31)) for i in range(8)}


def test_streamed_logprobs_ride_each_chunk() -> None:
    with worker() as (stub, _, _):
        replies = list(stub.Generate(request([65], max_tokens=4, logprobs=1), timeout=10))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    assert [t for c in chunks for t in c.output_logprobs.token_ids] == [66, 67, 68, 69]
    assert all(len(c.output_logprobs.top_logprobs) == len(c.token_ids) for c in chunks)
