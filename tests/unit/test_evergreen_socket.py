"""The Evergreen websocket over the fake engine: both encodings, aborts with their final
message and close code, auth, file refs, and no engine request outliving its session."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2, text_format
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from app.admission import Admission
from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError
from app.main import create_app
from app.protocols.evergreen.lifecycle import abort_message, close_code
from app.protocols.evergreen.session import Limits
from app.sessions.evergreen import EvergreenRun
from schemas import evergreen_service_pb2 as service_pb
from tests.fake_engine import FakeEngine

TEXT = 'metadata { mimetype: "text/plain" }'


def message(text: str) -> service_pb.SessionMessage:
    return text_format.Parse(text, service_pb.SessionMessage())


def generate(prompt: str, response: str, max_tokens: int = 4, config: str = "") -> str:
    configs = (
        "configs { [type.googleapis.com/google.protobuf.Struct] { fields { "
        f'key: "max_tokens" value {{ number_value: {max_tokens} }} }} {config} }} }}'
    )
    return (
        f'actions {{ name: "GENERATE" inputs {{ name: "prompt" id: "{prompt}" }} '
        f'outputs {{ name: "response" id: "{response}" }} {configs} }}'
    )


def leaf(node_id: str, data: str, extra: str = "") -> str:
    return (
        f'node_fragments {{ id: "{node_id}" chunk_fragment {{ {TEXT} data: "{data}" }} {extra} }}'
    )


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def client_for(engine: FakeEngine, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(model="fake", **settings), engine=engine))


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with client_for(engine) as c:
        yield c


class Socket:
    """A websocket that speaks SessionMessages in JSON or in binary frames."""

    def __init__(self, ws: Any, binary: bool) -> None:
        self.ws, self.binary = ws, binary

    def send(self, text: str) -> None:
        msg = message(text)
        if self.binary:
            self.ws.send_bytes(msg.SerializeToString())
        else:
            self.ws.send_text(json_format.MessageToJson(msg))

    def receive(self) -> service_pb.SessionMessage:
        frame = self.ws.receive()
        if frame["type"] == "websocket.close":
            raise WebSocketDisconnect(frame["code"], frame.get("reason"))
        if self.binary:
            assert frame.get("bytes") is not None, frame
            return service_pb.SessionMessage.FromString(frame["bytes"])
        assert frame.get("text") is not None, frame
        return json_format.Parse(frame["text"], service_pb.SessionMessage())

    def node(self, node_id: str) -> tuple[str, list[Any]]:
        """Read fragments until node_id's final one: (its text, the fragments)."""
        fragments = []
        while True:
            for fragment in self.receive().node_fragments:
                assert fragment.id == node_id
                fragments.append(fragment)
                if not fragment.continued:
                    return b"".join(f.chunk_fragment.data for f in fragments).decode(), fragments

    def aborted(self) -> tuple[dict[str, Any], int, str]:
        """The ABORT message's status, then the close code and reason."""
        final = self.receive()
        (action,) = final.actions
        assert action.name == "ABORT" and not final.node_fragments
        status = struct_pb2.Struct()
        assert action.configs[0].Unpack(status)
        with pytest.raises(WebSocketDisconnect) as closed:
            self.receive()
        return json_format.MessageToDict(status), closed.value.code, closed.value.reason


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_two_turns_reuse_the_first_response(
    client: TestClient, engine: FakeEngine, binary: bool
) -> None:
    with client.websocket_connect("/evergreen/ws") as ws:
        sock = Socket(ws, binary)
        sock.send(generate("p1", "r1") + leaf("p1", "hi"))
        text, fragments = sock.node("r1")
        # The fake continues "[user]hi\n[assistant]" with the code points after "]".
        assert text == "^_`a"
        assert [f.seq for f in fragments] == [0, 1, 2, 3]
        assert [f.continued for f in fragments] == [True, True, True, False]
        assert fragments[0].chunk_fragment.metadata.mimetype == "text/plain"
        assert fragments[0].chunk_fragment.metadata.role == "model"
        assert not any(f.chunk_fragment.HasField("metadata") for f in fragments[1:])
        sock.send(
            generate("p2", "r2", max_tokens=2)
            + 'node_fragments { id: "p2" child_ids: "p1" child_ids: "r1" child_ids: "q2" }'
            + leaf("q2", "more")
        )
        assert sock.node("r2")[0] == "^_"
    prompt = engine.tokenizer.decode(engine.requests[1].prompt_token_ids or [])
    assert prompt == "[user]hi\n[assistant]^_`a\n[user]more\n[assistant]"


def test_json_frames_take_camel_case_and_base64(client: TestClient) -> None:
    frame = {
        "actions": [
            {
                "name": "GENERATE",
                "inputs": [{"name": "text", "id": "p"}],
                "outputs": [{"name": "text", "id": "r"}],
                "configs": [
                    {
                        "@type": "type.googleapis.com/google.protobuf.Struct",
                        "value": {"maxOutputTokens": 1},
                    }
                ],
            }
        ],
        "nodeFragments": [
            {
                "id": "p",
                "chunkFragment": {
                    "metadata": {"mimetype": "text/plain"},
                    "data": base64.b64encode(b"hi").decode(),
                },
            }
        ],
    }
    with client.websocket_connect("/evergreen/ws") as ws:
        ws.send_text(json.dumps(frame))
        reply = json.loads(ws.receive_text())
    assert reply == {
        "nodeFragments": [
            {
                "id": "r",
                "chunkFragment": {
                    "metadata": {"mimetype": "text/plain", "role": "model"},
                    "data": base64.b64encode(b"^").decode(),
                },
            }
        ]
    }


@pytest.mark.parametrize(
    ("frame", "binary", "match"),
    [
        ("not json", False, "JSON mapping"),
        ('{"nodeFragments": [{"idd": "x"}]}', False, "JSON mapping"),
        (b"\xff\xff\xff", True, "not an evergreen.v2.SessionMessage"),
    ],
)
def test_a_malformed_frame_aborts(
    client: TestClient, frame: str | bytes, binary: bool, match: str
) -> None:
    with client.websocket_connect("/evergreen/ws") as ws:
        if isinstance(frame, bytes):
            ws.send_bytes(frame)
        else:
            ws.send_text(frame)
        status, code, reason = Socket(ws, binary).aborted()
    assert status["code"] == "INVALID_ARGUMENT" and match in status["message"]
    assert code == 4003 and reason == status["message"][:123]


def test_a_config_number_out_of_range_is_invalid_argument(client: TestClient) -> None:
    # 1e400 parses as infinity; the Struct then does not map back to JSON.
    frame = (
        '{"actions": [{"name": "GENERATE", "inputs": [{"name": "prompt", "id": "p"}], '
        '"configs": [{"@type": "type.googleapis.com/google.protobuf.Struct", '
        '"value": {"temperature": 1e400}}]}]}'
    )
    with client.websocket_connect("/evergreen/ws") as ws:
        ws.send_text(frame)
        status, code, _ = Socket(ws, binary=False).aborted()
    assert status["code"] == "INVALID_ARGUMENT" and "finite" in status["message"]
    assert code == 4003


def test_an_abort_mid_generation_aborts_the_engine_request(engine: FakeEngine) -> None:
    engine.step_delay = 0.01
    with client_for(engine) as client, client.websocket_connect("/evergreen/ws") as ws:
        sock = Socket(ws, binary=True)
        sock.send(generate("p", "r", max_tokens=400) + leaf("p", "hi"))
        assert sock.receive().node_fragments[0].id == "r"
        assert engine.num_running_requests() == 1
        sock.send(leaf("r", "spoof"))
        while True:  # fragments already on their way, then the abort
            final = sock.receive()
            if final.actions:
                break
        assert final.actions[0].name == "ABORT"
        with pytest.raises(WebSocketDisconnect) as closed:
            sock.receive()
        assert closed.value.code == 4003
        assert engine.num_running_requests() == 0


def test_a_client_that_leaves_ends_its_engine_requests(engine: FakeEngine) -> None:
    engine.step_delay = 0.01
    with client_for(engine) as client:
        with client.websocket_connect("/evergreen/ws") as ws:
            sock = Socket(ws, binary=False)
            sock.send(generate("p", "r", max_tokens=400) + leaf("p", "hi"))
            sock.receive()
            assert engine.num_running_requests() == 1
        deadline = time.monotonic() + 5
        while engine.num_running_requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.num_running_requests() == 0


def test_an_engine_failure_aborts_with_internal(engine: FakeEngine) -> None:
    async def failing(request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        yield TokenEvent(token_ids=[1], text="a")
        raise EngineError("the engine fell over")

    engine.generate = failing  # type: ignore[method-assign]
    with client_for(engine) as client, client.websocket_connect("/evergreen/ws") as ws:
        sock = Socket(ws, binary=False)
        sock.send(generate("p", "r") + leaf("p", "hi"))
        assert sock.receive().node_fragments[0].chunk_fragment.data == b"a"
        status, code, _ = sock.aborted()
    assert status == {"code": "INTERNAL", "message": "the engine fell over"}
    assert code == 4013


def test_an_unknown_target_is_not_found(client: TestClient) -> None:
    action = 'actions { name: "GENERATE" inputs { name: "prompt" id: "p" } '
    action += 'target_spec { id: "nope" } }'
    with client.websocket_connect("/evergreen/ws") as ws:
        sock = Socket(ws, binary=False)
        sock.send(action)
        status, code, _ = sock.aborted()
    assert status["code"] == "NOT_FOUND" and code == 4005


def test_auth(engine: FakeEngine) -> None:
    with client_for(engine, api_key="sesame") as client:
        with client.websocket_connect("/evergreen/ws") as ws:
            status, code, _ = Socket(ws, binary=False).aborted()
        assert status["code"] == "UNAUTHENTICATED" and code == 4016
        with client.websocket_connect("/evergreen/ws?token=sesame") as ws:
            sock = Socket(ws, binary=False)
            sock.send(generate("p", "r", max_tokens=1) + leaf("p", "hi"))
            assert sock.node("r")[0] == "^"
        headers = {"Authorization": "Bearer sesame"}
        with client.websocket_connect("/evergreen/ws", headers=headers) as ws:
            sock = Socket(ws, binary=True)
            sock.send(generate("p", "r", max_tokens=1) + leaf("p", "hi"))
            assert sock.node("r")[0] == "^"


def test_file_refs_read_under_the_root_only(engine: FakeEngine, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "a.txt").write_text("hi")
    (tmp_path / "secret.txt").write_text("secret")
    (root / "notes" / "link.txt").symlink_to(tmp_path / "secret.txt")
    ref = 'node_fragments {{ id: "p" chunk_fragment {{ {} ref: "{}" }} }}'
    with client_for(engine, evergreen_file_root=root) as client:
        with client.websocket_connect("/evergreen/ws") as ws:
            sock = Socket(ws, binary=False)
            sock.send(generate("p", "r", max_tokens=1) + ref.format(TEXT, "file://notes/a.txt"))
            assert sock.node("r")[0] == "^"
        assert engine.tokenizer.decode(engine.requests[-1].prompt_token_ids or []).startswith(
            "[user]hi\n"
        )
        for uri, match in [
            ("file://notes/link.txt", "leads outside the file root"),
            ("file://notes/missing.txt", "no such file"),
            ("file://notes", "not a regular file"),
            # OSErrors other than a missing file were INTERNAL, as if the server failed.
            ("file://notes/a.txt/b.txt", "Not a directory"),
            ("file://notes/" + "x" * 300, "File name too long"),
        ]:
            with client.websocket_connect("/evergreen/ws") as ws:
                sock = Socket(ws, binary=False)
                sock.send(generate("p", "r") + ref.format(TEXT, uri))
                status, code, _ = sock.aborted()
            assert match in status["message"] and code == 4003
    assert engine.num_running_requests() == 0


class ScriptedClient:
    """A client that delivers `frames` one per message, yielding to the event loop
    `pause` times before each but the first, then waits for ever (the session ends it)."""

    def __init__(self, frames: list[str], pause: int) -> None:
        self.frames = [message(text) for text in frames]
        self.pause = pause
        self.sent: list[service_pb.SessionMessage] = []

    async def messages(self) -> AsyncGenerator[service_pb.SessionMessage, None]:
        first = True
        while self.frames:
            if not first or self.sent:
                for _ in range(self.pause):
                    await asyncio.sleep(0)
            first = False
            yield self.frames.pop(0)
        await asyncio.Event().wait()

    async def send(self, message: service_pb.SessionMessage) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("pause", range(1, 6))
def test_nothing_starts_once_the_session_has_failed(engine: FakeEngine, pause: int) -> None:
    # Action #0's prompt is too long: it fails as soon as it runs. A message the reader
    # takes after that must not start action #1 on the engine (its request used to
    # start, to be aborted a moment later, and could stream output before the ABORT).
    client = ScriptedClient(
        [
            generate("p0", "r0", max_tokens=1) + leaf("p0", "x" * 600),
            generate("p1", "r1", max_tokens=1) + leaf("p1", "hi"),
        ],
        pause,
    )
    run = EvergreenRun(engine, Admission(None, None), Limits(), None, client.send)
    failure = asyncio.run(run.serve(client.messages()))
    assert engine.requests == [] and client.sent == []
    assert failure is not None and close_code(failure) == 4008
    assert abort_message(failure).actions[0].name == "ABORT"
