"""`salience.v1.Salience` over native gRPC against the live server (real vLLM), with the
client grpcio-tools generates from the published proto (`schemas/salience_pb2_grpc`):
every RPC, readouts, errors as status codes, sessions shared with the websocket, and
cancellation (a cancelled call, a deadline) aborting the engine requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
import websockets

from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from schemas import salience_ws_pb2 as ws_pb
from tests import grpc_bytes
from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def stub_for(live: Any) -> AsyncIterator[Any]:
    async with grpc.aio.insecure_channel(live.grpc_target) as channel:
        yield salience_grpc.SalienceStub(channel)


async def status(call: Any) -> tuple[grpc.StatusCode, str]:
    """The status a call fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        if isinstance(call, grpc.aio.UnaryStreamCall):
            await events_of(call)
        else:
            await call
    return info.value.code(), info.value.details() or ""


async def events_of(call: Any) -> list[pb.GenerateEvent]:
    """The rest of a Generate's stream (`read`, so a test may have read some already)."""
    events = []
    while (event := await asyncio.wait_for(call.read(), 120)) is not grpc.aio.EOF:
        events.append(event)
    return events


async def open_session(stub: Any, model: str) -> str:
    reply = await stub.OpenSession(pb.OpenSessionRequest(model=model), timeout=30)
    return str(reply.session_id)


class Socket:
    """The websocket side, in binary frames: one call at a time."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, **call: Any) -> ws_pb.ServerFrame:
        self.n += 1
        await self.ws.send(ws_pb.ClientFrame(id=f"c{self.n}", **call).SerializeToString())
        frame = ws_pb.ServerFrame.FromString(await asyncio.wait_for(self.ws.recv(), 120))
        assert frame.id == f"c{self.n}"
        return frame

    async def generate(self, request: pb.GenerateRequest) -> list[pb.GenerateEvent]:
        self.n += 1
        await self.ws.send(ws_pb.ClientFrame(id=f"c{self.n}", generate=request).SerializeToString())
        events = []
        while True:
            frame = ws_pb.ServerFrame.FromString(await asyncio.wait_for(self.ws.recv(), 120))
            assert frame.id == f"c{self.n}" and frame.WhichOneof("reply") == "event", frame
            events.append(frame.event)
            if frame.event.HasField("done"):
                return events


def greedy(session: str, append: list[int], offset: int, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        session_id=session,
        append_tokens=append,
        offset=offset,
        max_tokens=max_tokens,
        top_k=1,
    )


async def test_every_rpc_with_logprobs_and_readouts_as_the_websocket_answers(
    live_server: LiveServer,
) -> None:
    tok = live_server.engine.tokenizer
    ids = tok.encode("def f(x): return x")
    request = greedy("", ids, 0, 4)
    request.logprobs_ranges.add(start=0, end=10_000)
    request.logprob_top_k = 2
    request.readout_ranges.add(start=2, end=10_000)
    async with stub_for(live_server) as stub:
        manifest = await stub.GetReadoutManifest(pb.GetReadoutManifestRequest())
        session = await open_session(stub, live_server.model)
        request.session_id = session
        over_grpc = await events_of(stub.Generate(request))
        forked = await stub.ForkSession(pb.ForkSessionRequest(session_id=session, at_position=3))
        dumped = await stub.DumpSession(pb.DumpSessionRequest(session_id=session))
        fork_dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=forked.session_id))
        assert await stub.CloseSession(pb.CloseSessionRequest(session_id=session)) == (
            pb.CloseSessionResponse()
        )
        # Idempotent.
        await stub.CloseSession(pb.CloseSessionRequest(session_id=session))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.DumpSession(pb.DumpSessionRequest(session_id=session))
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    async with websockets.connect(f"{live_server.ws_url}/salience/ws") as ws:
        sock = Socket(ws)
        ws_manifest = await sock.call(get_readout_manifest=pb.GetReadoutManifestRequest())
        opened = await sock.call(open_session=pb.OpenSessionRequest(model=live_server.model))
        request.session_id = opened.open_session.session_id
        over_ws = await sock.generate(request)
    assert manifest == ws_manifest.readout_manifest and len(manifest.concepts) > 0
    width = len(manifest.layers) * len(manifest.concepts)
    # The same core on the same engine: the same events, field for field.
    assert over_grpc == over_ws
    tokens = [e.token for e in over_grpc[:-1]]
    assert [t.position for t in tokens] == list(range(len(ids) + 4))
    assert all(len(t.logprobs) == 2 for t in tokens[1:]) and tokens[-1].has_sampled_logprob
    assert [len(t.readout) for t in tokens[2:]] == [width] * (len(tokens) - 3) + [0]
    done = over_grpc[-1].done
    assert (done.prompt_tokens, done.completion_tokens) == (len(ids), 4)
    assert done.finish_reason == pb.GenerateDone.FINISH_REASON_LENGTH
    assert list(dumped.tokens) == [*ids, *(t.id for t in tokens[len(ids) :])]
    assert list(fork_dump.tokens) == ids[:3]
    assert live_server.wait_idle() == 0


async def test_errors_are_the_proto_headers_status_codes(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    ids = tok.encode("class Tree:")

    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        stub = salience_grpc.SalienceStub(channel)
        session = await open_session(stub, live_server.model)
        await events_of(stub.Generate(greedy(session, ids, 0, 2)))
        at = len(ids) + 2
        codes = {
            "missing": await status(stub.DumpSession(pb.DumpSessionRequest(session_id="nope"))),
            "wrong model": await status(stub.OpenSession(pb.OpenSessionRequest(model="other"))),
            "drift": await status(stub.Generate(greedy(session, [5], 1, 0))),
            "overflow": await status(stub.Generate(greedy(session, [], at, 2000))),
            "vocabulary": await status(stub.Generate(greedy(session, [10**6], at, 0))),
            "fork past the end": await status(
                stub.ForkSession(pb.ForkSessionRequest(session_id=session, at_position=10**6))
            ),
        }
        # A request that is not a GenerateRequest at all (raw bytes on the same method).
        raw = grpc_bytes.unary_stream(channel, "/salience.v1.Salience/Generate")
        codes["undecodable"] = await status(raw(b"\xff\xff\xff"))
        # Busy: a second Generate while one runs.
        running = stub.Generate(greedy(session, [], at, 900))
        first = await running.read()
        assert first.HasField("token")
        codes["busy"] = await status(stub.Generate(greedy(session, [], at, 1)))
        running.cancel()
        assert live_server.wait_idle() == 0
        dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=session))
    assert {name: code for name, (code, _) in codes.items()} == {
        "missing": grpc.StatusCode.NOT_FOUND,
        "wrong model": grpc.StatusCode.NOT_FOUND,
        "drift": grpc.StatusCode.FAILED_PRECONDITION,
        "overflow": grpc.StatusCode.RESOURCE_EXHAUSTED,
        "vocabulary": grpc.StatusCode.INVALID_ARGUMENT,
        "fork past the end": grpc.StatusCode.FAILED_PRECONDITION,
        "undecodable": grpc.StatusCode.INVALID_ARGUMENT,
        "busy": grpc.StatusCode.ABORTED,
    }
    assert "salience.v1.GenerateRequest" in codes["undecodable"][1]
    # No refusal touched the session; the cancelled Generate kept what it decoded.
    assert list(dump.tokens)[: len(ids)] == ids and len(dump.tokens) > at


async def test_sessions_are_shared_with_the_websocket(live_server: LiveServer) -> None:
    tok = live_server.engine.tokenizer
    first = tok.encode("import os", add_special_tokens=False)
    second = tok.encode("\nprint(", add_special_tokens=False)
    async with (
        stub_for(live_server) as stub,
        websockets.connect(f"{live_server.ws_url}/salience/ws") as ws,
    ):
        sock = Socket(ws)
        # Opened over gRPC: generated in, forked and dumped over the websocket.
        session = await open_session(stub, live_server.model)
        over_ws = await sock.generate(greedy(session, first, 0, 3))
        decoded = [e.token.id for e in over_ws[:-1]]
        fork = (
            await sock.call(fork_session=pb.ForkSessionRequest(session_id=session, at_position=2))
        ).fork_session.session_id
        dumped = await sock.call(dump_session=pb.DumpSessionRequest(session_id=session))
        assert list(dumped.dump_session.tokens) == [*first, *decoded]
        # ... and on over gRPC, where the websocket left it.
        at = len(first) + 3
        over_grpc = await events_of(stub.Generate(greedy(session, second, at, 2)))
        assert over_grpc[-1].done.prompt_tokens == at + len(second)
        fork_dump = await stub.DumpSession(pb.DumpSessionRequest(session_id=fork))
        assert list(fork_dump.tokens) == first[:2]
        # The reverse: opened over the websocket, used over gRPC.
        opened = await sock.call(open_session=pb.OpenSessionRequest(model=live_server.model))
        other = opened.open_session.session_id
        await events_of(stub.Generate(greedy(other, first, 0, 1)))
        again = await sock.call(dump_session=pb.DumpSessionRequest(session_id=other))
        assert len(again.dump_session.tokens) == len(first) + 1
        await stub.CloseSession(pb.CloseSessionRequest(session_id=other))
        closed = await sock.call(dump_session=pb.DumpSessionRequest(session_id=other))
        assert closed.error.code == "NOT_FOUND"


async def test_close_session_on_either_transport_cancels_generate_on_the_other(
    live_server: LiveServer,
) -> None:
    ids = live_server.engine.tokenizer.encode("while True:")
    async with (
        stub_for(live_server) as stub,
        websockets.connect(f"{live_server.ws_url}/salience/ws") as ws,
    ):
        sock = Socket(ws)
        # Generate over gRPC, CloseSession over the websocket.
        session = await open_session(stub, live_server.model)
        call = stub.Generate(greedy(session, ids, 0, 900))
        assert (await call.read()).HasField("token")
        await sock.call(close_session=pb.CloseSessionRequest(session_id=session))
        events = await events_of(call)
        assert events[-1].done.finish_reason == pb.GenerateDone.FINISH_REASON_CANCELLED
        assert len(events) < 900
        assert live_server.wait_idle() == 0
        # Generate over the websocket, CloseSession over gRPC.
        opened = await sock.call(open_session=pb.OpenSessionRequest(model=live_server.model))
        other = opened.open_session.session_id
        sock.n += 1
        frame = ws_pb.ClientFrame(id="long", generate=greedy(other, ids, 0, 900))
        await ws.send(frame.SerializeToString())
        assert ws_pb.ServerFrame.FromString(await ws.recv()).event.HasField("token")
        await stub.CloseSession(pb.CloseSessionRequest(session_id=other))
        while True:
            reply = ws_pb.ServerFrame.FromString(await asyncio.wait_for(ws.recv(), 60))
            if reply.event.HasField("done"):
                break
        assert reply.event.done.finish_reason == pb.GenerateDone.FINISH_REASON_CANCELLED
    assert live_server.wait_idle() == 0
