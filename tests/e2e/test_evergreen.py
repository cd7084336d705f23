"""Evergreen against the live server (real vLLM, tiny model), each scenario on every
transport: the websocket in JSON and in binary frames, and native gRPC
(`evergreen.v2.EvergreenService/StartSession`, the client grpcio-tools generates from the
published protos). The spec's examples are sent as written (file refs as inline data).

Greedy outputs are checked against the OpenAI chat endpoint of the same server given the
same conversation: the same text means Evergreen built the same prompt. A broken rule
ends a session with an ABORT message whose status the transport repeats (a close code
and reason, or the call's status and details). The abort tests follow tests/aborts.py,
on one websocket encoding (frames are decoded before any abort path) and gRPC.

What only one transport has is in its own module: close codes of malformed frames and
auth (tests/unit/test_evergreen_socket.py), gRPC's half-close and undecodable messages
(test_grpc_evergreen.py), a gRPC deadline (test_grpc_aborts.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from tests.aborts import AbortWatch, Workload
from tests.conftest import LiveServer
from tests.evergreen_client import Session, Transport, reference_chat, transport
from tests.evergreen_frames import (
    GREEDY,
    PAST_THE_END,
    SESSIONS,
    first_turn,
    workload_actions,
)

pytestmark = pytest.mark.e2e

TRANSPORTS = ["websocket-json", "websocket-binary", "grpc"]
ABORT_TRANSPORTS = ["websocket-json", "grpc"]


@pytest.fixture(params=TRANSPORTS)
async def evergreen(
    request: pytest.FixtureRequest, live_server: LiveServer
) -> AsyncIterator[Transport]:
    async with transport(request.param, live_server) as opened:
        yield opened


async def test_spec_conversation_reuses_prompt_and_response(
    live_server: LiveServer, evergreen: Transport
) -> None:
    async with evergreen.session() as session:
        await session.send(first_turn(GREEDY))
        response_1 = await session.node("response_1")
        question = "Write a summary of this video: lap 1 lap 2"
        assert response_1 == reference_chat(live_server, [{"role": "user", "content": question}])
        # The second turn sends neither prompt_1 nor response_1 again.
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
        response_2 = await session.node("response_2")
    conversation = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": response_1},
        {"role": "user", "content": "Who's winning?"},
    ]
    assert response_2 == reference_chat(live_server, conversation)
    assert live_server.wait_idle() == 0


async def test_spec_video_as_written_is_refused_by_a_text_model(
    live_server: LiveServer, evergreen: Transport
) -> None:
    video = first_turn("").replace(
        'metadata { mimetype: "text/plain" } ref', 'metadata { mimetype: "video/mp4" } ref'
    )
    async with evergreen.session() as session:
        await session.send(video)
        status, end = await session.aborted()
    assert status["code"] == "INVALID_ARGUMENT" and end.repeats(status), (status, end)
    assert "'video/mp4'" in status["message"] and "text only" in status["message"]


async def test_spec_customized_generate_and_streamed_chain(
    live_server: LiveServer, evergreen: Transport
) -> None:
    novel = "Write a heroic novel about a half-eaten jam doughnut."
    async with evergreen.session() as session:
        # "Customized generate action": a config, and a prompt that ends its turn.
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
        # "Streamed chains": the same prompt, its root streamed over two fragments, each
        # piece in a message of its own; the action runs once the last piece is in.
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
    assert customized == chained
    assert chained == reference_chat(live_server, [{"role": "user", "content": novel}])
    assert live_server.wait_idle() == 0


async def test_a_lora_target(live_server: LiveServer, evergreen: Transport) -> None:
    async with evergreen.session() as session:
        await session.send(
            f'actions {{ name: "GENERATE" {GREEDY} target_spec {{ id: "{live_server.lora}" }} '
            'inputs { name: "prompt" id: "p" } outputs { name: "response" id: "r" } } '
            'node_fragments { id: "p" chunk_fragment { metadata { mimetype: "text/plain" } '
            'data: "def main():" } }'
        )
        text = await session.node("r")
    messages = [{"role": "user", "content": "def main():"}]
    assert text == reference_chat(live_server, messages, model=live_server.lora)
    assert text != reference_chat(live_server, messages)


async def _running(
    evergreen: Transport, live_server: LiveServer, workload: Workload, stack: AsyncExitStack
) -> tuple[list[Session], AbortWatch]:
    """The workload's actions running in SESSIONS sessions, all held by vLLM."""
    sessions = [await stack.enter_async_context(evergreen.session()) for _ in range(SESSIONS)]
    watch = await AbortWatch.start(live_server.engine, workload)
    for share, session in enumerate(sessions):
        await session.send_mapping(workload_actions(workload, share))
    await watch.all_in_engine()
    return sessions, watch


@pytest.mark.parametrize("evergreen", ABORT_TRANSPORTS, indirect=True)
async def test_a_client_that_leaves_mid_generation_aborts_its_requests(
    live_server: LiveServer, evergreen: Transport, abort_workload: Workload
) -> None:
    async with AsyncExitStack() as stack:
        sessions, watch = await _running(evergreen, live_server, abort_workload, stack)
        # A websocket's close handshake may wait on a client that reads nothing: the
        # engine must be idle while it does.
        leaving = asyncio.gather(*(session.leave() for session in sessions))
        await watch.idle()
        await leaving


@pytest.mark.parametrize("evergreen", ABORT_TRANSPORTS, indirect=True)
async def test_a_session_that_aborts_mid_generation_aborts_its_requests(
    live_server: LiveServer, evergreen: Transport, abort_workload: Workload
) -> None:
    async with AsyncExitStack() as stack:
        sessions, watch = await _running(evergreen, live_server, abort_workload, stack)
        # A fragment past the final seq of a node aborts the session mid-generation.
        for session in sessions:
            await session.send(PAST_THE_END)
        await watch.idle()
        for session in sessions:
            status, end = await session.aborted()
            assert status["code"] == "INVALID_ARGUMENT", status
            assert "past the node's final" in status["message"]
            assert end.repeats(status), (status, end)
