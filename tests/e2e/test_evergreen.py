"""Evergreen over a real websocket client against the live server (real vLLM, tiny model):
the spec's examples, sent as written (file refs as inline data), in both encodings.

Greedy outputs are checked against the OpenAI chat endpoint of the same server given the
same conversation: the same text means Evergreen built the same prompt. The abort tests
follow tests/aborts.py."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx
import pytest
import websockets
from google.protobuf import json_format, struct_pb2, text_format

from schemas import evergreen_service_pb2 as service_pb
from tests.aborts import CLOSE_TIMEOUT, AbortWatch, Workload

pytestmark = pytest.mark.e2e

GREEDY = (
    "configs { [type.googleapis.com/google.protobuf.Struct] { "
    'fields { key: "temperature" value { number_value: 0 } } '
    'fields { key: "max_tokens" value { number_value: 8 } } } }'
)


class Session:
    """An Evergreen websocket speaking JSON text frames or binary frames."""

    def __init__(self, ws: Any, binary: bool) -> None:
        self.ws, self.binary = ws, binary

    async def send(self, text: str) -> None:
        message = text_format.Parse(text, service_pb.SessionMessage())
        if self.binary:
            await self.ws.send(message.SerializeToString())
        else:
            await self.ws.send(json_format.MessageToJson(message))

    async def receive(self) -> service_pb.SessionMessage:
        frame = await asyncio.wait_for(self.ws.recv(), timeout=120)
        assert isinstance(frame, bytes) is self.binary
        if self.binary:
            return service_pb.SessionMessage.FromString(frame)
        return json_format.Parse(frame, service_pb.SessionMessage())

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

    async def aborted(self) -> tuple[dict[str, Any], int]:
        while True:  # fragments already sent may come first
            message = await self.receive()
            if message.actions:
                break
        assert message.actions[0].name == "ABORT"
        status = struct_pb2.Struct()
        assert message.actions[0].configs[0].Unpack(status)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await self.ws.recv()
        assert closed.value.rcvd is not None
        return json_format.MessageToDict(status), closed.value.rcvd.code


def chat(live: Any, messages: list[dict[str, str]], model: str | None = None) -> str:
    body = {
        "model": model or live.model,
        "messages": messages,
        "temperature": 0,
        "max_tokens": 8,
    }
    response = httpx.post(f"{live.base_url}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def first_turn(config: str) -> str:
    # The spec's first example; the video's two file parts sent as data: refs of text
    # (this model takes text only; the as-written video is refused, below).
    return f"""
        actions {{ name: "GENERATE" {config}
                  inputs {{ name: "prompt" id: "prompt_1" }}
                  outputs {{ name: "response" id: "response_1" }} }}
        node_fragments {{ id: "prompt_1" child_ids: "question_1" child_ids: "video_1" }}
        node_fragments {{ id: "question_1" chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} data: "Write a summary of this video: " }} }}
        node_fragments {{ id: "video_1" seq: 0 continued: true chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} ref: "data:,lap%201%20" }} }}
        node_fragments {{ id: "video_1" seq: 1 chunk_fragment {{
            metadata {{ mimetype: "text/plain" }} ref: "data:,lap%202" }} }}
    """


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_spec_conversation_reuses_prompt_and_response(live_server, binary: bool) -> None:  # type: ignore[no-untyped-def]
    async with websockets.connect(f"{live_server.ws_url}/evergreen/ws") as ws:
        session = Session(ws, binary)
        await session.send(first_turn(GREEDY))
        response_1 = await session.node("response_1")
        question = "Write a summary of this video: lap 1 lap 2"
        assert response_1 == chat(live_server, [{"role": "user", "content": question}])
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
    assert response_2 == chat(live_server, conversation)
    assert live_server.wait_idle() == 0


async def test_spec_video_as_written_is_refused_by_a_text_model(live_server) -> None:  # type: ignore[no-untyped-def]
    video = first_turn("").replace(
        'metadata { mimetype: "text/plain" } ref', 'metadata { mimetype: "video/mp4" } ref'
    )
    async with websockets.connect(f"{live_server.ws_url}/evergreen/ws") as ws:
        session = Session(ws, binary=False)
        await session.send(video)
        status, code = await session.aborted()
    assert status["code"] == "INVALID_ARGUMENT" and code == 4003
    assert "'video/mp4'" in status["message"] and "text only" in status["message"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_spec_customized_generate_and_streamed_chain(live_server, binary: bool) -> None:  # type: ignore[no-untyped-def]
    novel = "Write a heroic novel about a half-eaten jam doughnut."
    async with websockets.connect(f"{live_server.ws_url}/evergreen/ws") as ws:
        session = Session(ws, binary)
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
        with pytest.raises(asyncio.TimeoutError):  # p2_eot has not arrived: no output yet
            await asyncio.wait_for(ws.recv(), timeout=1)
        await session.send(
            'node_fragments { id: "p2_eot" chunk_fragment { metadata { '
            'mimetype: "application/x-protobuf; type=EndOfTurn" } } }'
        )
        chained = await session.node("r2")
    assert customized == chained == chat(live_server, [{"role": "user", "content": novel}])


async def test_a_lora_target(live_server) -> None:  # type: ignore[no-untyped-def]
    async with websockets.connect(f"{live_server.ws_url}/evergreen/ws") as ws:
        session = Session(ws, binary=True)
        await session.send(
            f'actions {{ name: "GENERATE" {GREEDY} target_spec {{ id: "{live_server.lora}" }} '
            'inputs { name: "prompt" id: "p" } outputs { name: "response" id: "r" } } '
            'node_fragments { id: "p" chunk_fragment { metadata { mimetype: "text/plain" } '
            'data: "def main():" } }'
        )
        text = await session.node("r")
    messages = [{"role": "user", "content": "def main():"}]
    assert text == chat(live_server, messages, model=live_server.lora)
    assert text != chat(live_server, messages)


# Sessions the abort workload is spread over: each stays under --evergreen-max-pending-actions.
SESSIONS = 2


def _long_actions(workload: Workload, session: int) -> str:
    """This session's share of the abort workload: a GENERATE per prompt (greedy, the
    workload's max_tokens), as one JSON frame."""
    config = {
        "@type": "type.googleapis.com/google.protobuf.Struct",
        "value": {"max_tokens": workload.max_tokens, "temperature": 0},
    }
    actions, fragments = [], []
    for i in range(session, len(workload.texts), SESSIONS):
        actions.append(
            {
                "name": "GENERATE",
                "configs": [config],
                "inputs": [{"name": "prompt", "id": f"p{i}"}],
                "outputs": [{"name": "response", "id": f"r{i}"}],
            }
        )
        text = base64.b64encode(workload.texts[i].encode()).decode()
        chunk = {"metadata": {"mimetype": "text/plain"}, "data": text}
        fragments.append({"id": f"p{i}", "chunkFragment": chunk})
    return json.dumps({"actions": actions, "nodeFragments": fragments})


async def _closed_after_abort(ws: Any) -> tuple[dict[str, Any], int]:
    """Skip the outputs already on their way; the ABORT's status, and the close code."""
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
        if message.get("actions"):
            break
    [abort] = message["actions"]
    assert abort["name"] == "ABORT"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None
    return abort["configs"][0]["value"], closed.value.rcvd.code


async def _sessions_running(live_server, abort_workload):  # type: ignore[no-untyped-def]
    """The workload's actions running in SESSIONS sockets, all held by vLLM."""
    url = f"{live_server.ws_url}/evergreen/ws"
    sockets = [await websockets.connect(url, close_timeout=CLOSE_TIMEOUT) for _ in range(SESSIONS)]
    watch = await AbortWatch.start(live_server.engine, abort_workload)
    for session, ws in enumerate(sockets):
        await ws.send(_long_actions(abort_workload, session))
    await watch.all_in_engine()
    return sockets, watch


async def test_a_client_that_leaves_mid_generation_aborts_its_requests(  # type: ignore[no-untyped-def]
    live_server, abort_workload
) -> None:
    sockets, watch = await _sessions_running(live_server, abort_workload)
    closing = asyncio.gather(*(ws.close() for ws in sockets))
    await watch.idle()
    await closing


async def test_a_session_that_aborts_mid_generation_aborts_its_requests(  # type: ignore[no-untyped-def]
    live_server, abort_workload
) -> None:
    sockets, watch = await _sessions_running(live_server, abort_workload)
    # A fragment past the final seq of a node aborts the session mid-generation.
    past_the_end = [
        {"id": "x", "chunkFragment": {"metadata": {"mimetype": "text/plain"}}},
        {"id": "x", "seq": 1},
    ]
    for ws in sockets:
        await ws.send(json.dumps({"nodeFragments": past_the_end}))
    await watch.idle()
    for ws in sockets:
        status, code = await _closed_after_abort(ws)
        assert status["code"] == "INVALID_ARGUMENT" and "past the node's final" in status["message"]
        assert code == 4003
