"""What only gRPC's `evergreen.v2.EvergreenService/StartSession` has, against the live
server (real vLLM): a half-close that drains the session, then the status OK; a message
that does not decode, answered with an ABORT then INVALID_ARGUMENT. The scenarios every
transport shares (the spec's examples, ABORT then the status, aborts mid-generation) are
in test_evergreen.py, run over gRPC as over the websocket."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from tests import grpc_bytes
from tests.conftest import LiveServer
from tests.evergreen_client import GrpcSession, reference_chat
from tests.evergreen_frames import GREEDY, abort_status, first_turn

pytestmark = pytest.mark.e2e


@pytest.fixture
async def channel(live_server: LiveServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        yield channel


async def test_a_half_close_drains_the_session_then_ends_ok(
    live_server: LiveServer, channel: grpc.aio.Channel
) -> None:
    session = GrpcSession(evergreen_grpc.EvergreenServiceStub(channel).StartSession())
    await session.send(first_turn(GREEDY))
    response_1 = await session.node("response_1")
    question = "Write a summary of this video: lap 1 lap 2"
    assert response_1 == reference_chat(live_server, [{"role": "user", "content": question}])
    # The second turn sends neither prompt_1 nor response_1 again; then the client
    # half-closes: the session drains and the call ends OK.
    await session.send(
        f"""
        actions {{ name: "GENERATE" {GREEDY}
                  inputs {{ name: "prompt" id: "prompt_2" }}
                  outputs {{ name: "response" id: "response_2" }} }}
        node_fragments {{ id: "prompt_2" child_ids: "prompt_1" child_ids: "response_1"
                          child_ids: "question_2" }}
        node_fragments {{ id: "question_2" chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} data: "Who's winning?" }} }}
        """
    )
    await session.call.done_writing()
    response_2 = await session.node("response_2")
    assert await session.call.read() is grpc.aio.EOF
    assert await session.call.code() == grpc.StatusCode.OK
    conversation = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": response_1},
        {"role": "user", "content": "Who's winning?"},
    ]
    assert response_2 == reference_chat(live_server, conversation)
    assert live_server.wait_idle() == 0


async def test_an_undecodable_message_aborts_the_session(
    live_server: LiveServer, channel: grpc.aio.Channel
) -> None:
    raw = grpc_bytes.stream_stream(channel, "/evergreen.v2.EvergreenService/StartSession")()
    await raw.write(b"\xff\xff\xff")
    status = abort_status(service_pb.SessionMessage.FromString(await raw.read()))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await raw.read()
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert status["code"] == "INVALID_ARGUMENT"
    assert "evergreen.v2.SessionMessage" in (ended.value.details() or "")
