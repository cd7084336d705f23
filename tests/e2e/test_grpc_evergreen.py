"""`evergreen.v2.EvergreenService/StartSession` over native gRPC against the live server
(real vLLM), with the client grpcio-tools generates from the published protos: the
spec's examples, a conversation reusing earlier nodes, a half-close that drains, an ABORT
as the final message and the call's status.

Outputs are checked against the websocket tests' reference, the OpenAI chat endpoint of
the same server on the same conversation."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2, text_format

from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from tests.e2e.test_evergreen import GREEDY, chat, first_turn

pytestmark = pytest.mark.e2e


class Session:
    """One StartSession call, driven message by message."""

    def __init__(self, channel: grpc.aio.Channel, **call: Any) -> None:
        self.call = evergreen_grpc.EvergreenServiceStub(channel).StartSession(**call)
        self._reading: asyncio.Future[Any] | None = None

    async def send(self, text: str) -> None:
        await self.call.write(text_format.Parse(text, service_pb.SessionMessage()))

    async def receive(self) -> service_pb.SessionMessage:
        reading, self._reading = self._reading or asyncio.ensure_future(self.call.read()), None
        message = await asyncio.wait_for(reading, timeout=120)
        assert message is not grpc.aio.EOF, "the call ended"
        assert isinstance(message, service_pb.SessionMessage)
        return message

    async def quiet_for(self, seconds: float) -> bool:
        """Whether nothing arrives for `seconds` (a read stays pending for `receive`)."""
        self._reading = self._reading or asyncio.ensure_future(self.call.read())
        done, _ = await asyncio.wait({self._reading}, timeout=seconds)
        return not done

    async def node(self, node_id: str) -> str:
        """The text of node_id, checking its fragments stream as the spec says."""
        fragments = []
        while True:
            message = await self.receive()
            assert not message.actions, message
            for fragment in message.node_fragments:
                assert fragment.id == node_id and fragment.seq == len(fragments)
                fragments.append(fragment)
                if not fragment.continued:
                    first = fragments[0].chunk_fragment.metadata
                    assert (first.mimetype, first.role) == ("text/plain", "model")
                    return b"".join(f.chunk_fragment.data for f in fragments).decode()

    async def aborted(self) -> tuple[dict[str, Any], grpc.StatusCode, str]:
        """The ABORT message's status, then the call's own status and details."""
        while True:  # fragments already sent may come first
            message = await self.receive()
            if message.actions:
                break
        assert [a.name for a in message.actions] == ["ABORT"]
        status = struct_pb2.Struct()
        assert message.actions[0].configs[0].Unpack(status)
        with pytest.raises(grpc.aio.AioRpcError) as ended:  # the stream ends with the status
            await self.call.read()
        assert ended.value.code() == await self.call.code()
        return json_format.MessageToDict(status), ended.value.code(), ended.value.details() or ""


@pytest.fixture
async def channel(live_server) -> Any:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(live_server.grpc_target) as channel:
        yield channel


async def test_spec_conversation_reuses_prompt_and_response(live_server, channel) -> None:  # type: ignore[no-untyped-def]
    session = Session(channel)
    await session.send(first_turn(GREEDY))
    response_1 = await session.node("response_1")
    question = "Write a summary of this video: lap 1 lap 2"
    assert response_1 == chat(live_server, [{"role": "user", "content": question}])
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
    assert response_2 == chat(live_server, conversation)
    assert live_server.wait_idle() == 0


async def test_spec_customized_generate_and_streamed_chain(live_server, channel) -> None:  # type: ignore[no-untyped-def]
    novel = "Write a heroic novel about a half-eaten jam doughnut."
    session = Session(channel)
    await session.send(
        f"""
        actions {{ name: "GENERATE" {GREEDY}
                  inputs {{ name: "text" id: "prompt_1" }}
                  outputs {{ name: "text" id: "response_1" }} }}
        node_fragments {{ id: "prompt_1" child_ids: "prompt_1_text" child_ids: "prompt_1_eot" }}
        node_fragments {{ id: "prompt_1_text" chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} data: "{novel}" }} }}
        node_fragments {{ id: "prompt_1_eot" chunk_fragment {{
            metadata {{ mimetype: "application/x-protobuf; type=EndOfTurn" }} }} }}
        """
    )
    customized = await session.node("response_1")
    for text in [
        'actions { name: "GENERATE" ' + GREEDY + ' inputs { name: "text" id: "p2" } '
        'outputs { name: "text" id: "r2" } }',
        'node_fragments { id: "p2" child_ids: "p2_text" continued: true }',
        'node_fragments { id: "p2_text" chunk_fragment { metadata { mimetype: "text/plain" } '
        f'data: "{novel}" }} }}',
        'node_fragments { id: "p2" child_ids: "p2_eot" seq: 1 }',
    ]:
        await session.send(text)
    assert await session.quiet_for(1)  # p2_eot has not arrived: no output yet
    await session.send(
        'node_fragments { id: "p2_eot" chunk_fragment { metadata { '
        'mimetype: "application/x-protobuf; type=EndOfTurn" } } }'
    )
    chained = await session.node("r2")
    session.call.cancel()
    assert customized == chained == chat(live_server, [{"role": "user", "content": novel}])
    assert live_server.wait_idle() == 0


async def test_a_broken_rule_is_an_abort_message_then_the_status(live_server, channel) -> None:  # type: ignore[no-untyped-def]
    video = first_turn("").replace(
        'metadata { mimetype: "text/plain" } ref', 'metadata { mimetype: "video/mp4" } ref'
    )
    session = Session(channel)
    await session.send(video)
    status, code, details = await session.aborted()
    assert status["code"] == "INVALID_ARGUMENT" and code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == status["message"] and "'video/mp4'" in details


async def test_an_undecodable_message_aborts_the_session(live_server, channel) -> None:  # type: ignore[no-untyped-def]
    raw = channel.stream_stream("/evergreen.v2.EvergreenService/StartSession")()
    await raw.write(b"\xff\xff\xff")
    message = service_pb.SessionMessage.FromString(await raw.read())
    assert [a.name for a in message.actions] == ["ABORT"]
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await raw.read()
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "evergreen.v2.SessionMessage" in (ended.value.details() or "")


async def test_an_abort_mid_generation_stops_it(live_server, channel) -> None:  # type: ignore[no-untyped-def]
    long = (
        "configs { [type.googleapis.com/google.protobuf.Struct] { "
        'fields { key: "max_tokens" value { number_value: 900 } } } }'
    )
    session = Session(channel)
    await session.send(
        f'actions {{ name: "GENERATE" {long} inputs {{ name: "prompt" id: "p" }} '
        'outputs { name: "response" id: "r" } } '
        'node_fragments { id: "p" chunk_fragment { metadata { mimetype: "text/plain" } '
        'data: "Go on and on" } }'
    )
    first = await session.receive()
    assert first.node_fragments[0].continued
    # A fragment past the final seq of a node aborts the session mid-generation.
    await session.send(
        'node_fragments { id: "x" chunk_fragment { metadata { mimetype: "text/plain" } } }'
        ' node_fragments { id: "x" seq: 1 }'
    )
    status, code, details = await session.aborted()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "past the node's final" in details
    assert status["code"] == "INVALID_ARGUMENT"
    assert live_server.wait_idle() == 0
