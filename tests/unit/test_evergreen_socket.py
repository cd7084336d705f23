"""The Evergreen websocket over the fake engine: both encodings, aborts with their final
message and close code, auth, file refs, and no engine request outliving its session
(a GENERATE that would run 500 s must be gone within 5 s of its session's end)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from starlette.testclient import TestClient

from app.admission import Admission
from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError
from app.main import create_app
from app.protocols.evergreen.lifecycle import abort_message, close_code
from app.protocols.evergreen.session import Limits
from app.sessions.evergreen import EvergreenRun
from schemas import evergreen_service_pb2 as service_pb
from tests.asgi_wire import Wire
from tests.evergreen_client import TestClientSocket
from tests.evergreen_frames import TEXT, generate, leaf, message
from tests.fake_engine import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


def client_for(engine: FakeEngine, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(model="fake", **settings), engine=engine))


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with client_for(engine) as c:
        yield c


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_two_turns_reuse_the_first_response(
    client: TestClient, engine: FakeEngine, binary: bool
) -> None:
    with client.websocket_connect("/evergreen/ws") as ws:
        sock = TestClientSocket(ws, binary)
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
        status, code, reason = TestClientSocket(ws, binary).aborted()
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
        status, code, _ = TestClientSocket(ws, binary=False).aborted()
    assert status["code"] == "INVALID_ARGUMENT" and "finite" in status["message"]
    assert code == 4003


# A GENERATE that no test could wait out (500 s unaborted), and how soon after its session
# ends (a broken rule, the client gone) it must be gone from the engine.
LONG_TOKENS, STEP_S = 50_000, 0.01
BOUND_S = 5.0


def long_generation() -> tuple[FakeEngine, Wire]:
    """An Evergreen socket to a fresh app whose one GENERATE runs LONG_TOKENS tokens."""
    engine = FakeEngine(max_model_len=LONG_TOKENS + 64, step_delay=STEP_S)
    wire = Wire(create_app(Settings(model="fake"), engine=engine), "/evergreen/ws")
    return engine, wire


def _parse(frame: str | bytes | int) -> service_pb.SessionMessage:
    assert isinstance(frame, bytes), frame
    return service_pb.SessionMessage.FromString(frame)


async def test_an_abort_mid_generation_aborts_the_engine_request() -> None:
    engine, wire = long_generation()
    turn = message(generate("p", "r", max_tokens=LONG_TOKENS) + leaf("p", "hi"))
    wire.send_bytes(turn.SerializeToString())
    assert _parse(await wire.frame()).node_fragments[0].id == "r"
    assert engine.num_running_requests() == 1
    wire.send_bytes(message(leaf("r", "spoof")).SerializeToString())  # a broken rule
    async with asyncio.timeout(BOUND_S):
        while not (final := _parse(await wire.frame())).actions:
            pass  # fragments already on their way, then the abort
        assert final.actions[0].name == "ABORT"
        assert await wire.frame() == 4003
        await wire.ended()
    assert engine.num_running_requests() == 0


async def test_a_client_that_leaves_ends_its_engine_requests() -> None:
    engine, wire = long_generation()
    turn = message(generate("p", "r", max_tokens=LONG_TOKENS) + leaf("p", "hi"))
    wire.send(json_format.MessageToDict(turn))
    await wire.frame()
    assert engine.num_running_requests() == 1
    await wire.disconnect()  # the route returns within Wire's TIMEOUT_S, its request ended
    assert engine.num_running_requests() == 0


def test_an_engine_failure_aborts_with_internal(
    engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        yield TokenEvent(token_ids=[1], text="a")
        raise EngineError("the engine fell over")

    monkeypatch.setattr(engine, "generate", failing)
    with client_for(engine) as client, client.websocket_connect("/evergreen/ws") as ws:
        sock = TestClientSocket(ws, binary=False)
        sock.send(generate("p", "r") + leaf("p", "hi"))
        assert sock.receive().node_fragments[0].chunk_fragment.data == b"a"
        status, code, _ = sock.aborted()
    assert status == {"code": "INTERNAL", "message": "the engine fell over"}
    assert code == 4013


def test_an_unknown_target_is_not_found(client: TestClient) -> None:
    action = 'actions { name: "GENERATE" inputs { name: "prompt" id: "p" } '
    action += 'target_spec { id: "nope" } }'
    with client.websocket_connect("/evergreen/ws") as ws:
        sock = TestClientSocket(ws, binary=False)
        sock.send(action)
        status, code, _ = sock.aborted()
    assert status["code"] == "NOT_FOUND" and code == 4005


def test_auth(engine: FakeEngine) -> None:
    with client_for(engine, api_key="sesame") as client:
        with client.websocket_connect("/evergreen/ws") as ws:
            status, code, _ = TestClientSocket(ws, binary=False).aborted()
        assert status["code"] == "UNAUTHENTICATED" and code == 4016
        with client.websocket_connect("/evergreen/ws?token=sesame") as ws:
            sock = TestClientSocket(ws, binary=False)
            sock.send(generate("p", "r", max_tokens=1) + leaf("p", "hi"))
            assert sock.node("r")[0] == "^"
        headers = {"Authorization": "Bearer sesame"}
        with client.websocket_connect("/evergreen/ws", headers=headers) as ws:
            sock = TestClientSocket(ws, binary=True)
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
            sock = TestClientSocket(ws, binary=False)
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
                sock = TestClientSocket(ws, binary=False)
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
