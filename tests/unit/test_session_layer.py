"""The transport-independent session layer (`app.sessions`) on the fake engine: used as a
gRPC transport would use it (no websocket), blocking work kept off the event loop, and
our own bugs reaching clients as an error id, never as their text."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from starlette.testclient import TestClient

from app.admission import Admission
from app.config import Settings
from app.drain import Drain
from app.engine.base import DecodedImage, GenerationRequest, TokenEvent, VisionInfo
from app.main import create_app
from app.protocols.evergreen.session import Limits
from app.sessions.evergreen import EvergreenRun
from app.sessions.salience import SalienceRunner
from app.store.sessions import MemorySessions
from schemas import evergreen_service_pb2 as service_pb
from schemas import salience_pb2 as pb
from tests.asgi_wire import Wire
from tests.evergreen_client import TestClientSocket
from tests.evergreen_frames import generate, leaf, message
from tests.fake_engine import FakeEngine
from tests.principals import ANYONE
from tests.salience_client import dump, gen
from tests.waits import until

START, END, PAD = 5, 6, 7


def runner_on(engine: FakeEngine) -> SalienceRunner:
    admission = Admission(None, None)
    return SalienceRunner.from_settings(
        engine, admission, Drain(admission, 0), Settings(model="fake")
    )


class SlowDecoder:
    """A `read_image` that blocks its thread until released (or 5 s pass)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self, data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
        self.started.set()
        self.release.wait(timeout=5)
        self.finished.set()
        return DecodedImage(pixels=None, digest=data.hex(), pad_tokens=2)


async def test_a_slow_image_decode_blocks_neither_the_loop_nor_other_calls() -> None:
    engine = FakeEngine()
    decoder = SlowDecoder()
    vision = VisionInfo(START, PAD, END, max_images=4, read_image=decoder)
    engine._info = dataclasses.replace(engine.info, vision=vision)
    app = create_app(Settings(model="fake"), engine=engine)
    first, second = Wire(app, "/salience/ws"), Wire(app, "/salience/ws")
    sid = await first.open_session()
    image = {"bytes": "aW1n", "mime": "image/png", "padRangeStart": 1, "padRangeEnd": 5}
    first.send(
        gen(
            "g", sessionId=sid, appendTokens=[1, START, PAD, PAD, END], maxTokens=1, images=[image]
        ),
        dump("d", sid),
    )
    await until(decoder.started.is_set, "the image decode to start")
    # While the image decodes, another socket is served: the loop is free.
    other = await second.open_session()
    assert other and not decoder.finished.is_set()
    decoder.release.set()
    # The socket that sent the image kept its frame order: the dump sees the append.
    replies = [await first.recv() for _ in range(3)]
    assert {"id": "d", "response": {"tokens": [1, START, PAD, PAD, END]}} in replies
    await first.disconnect()
    await second.disconnect()


async def test_cancel_and_close_session_from_another_connection_as_grpc_would() -> None:
    engine = FakeEngine(step_delay=0.01)
    runner = runner_on(engine)
    opened = await runner.unary("OpenSession", pb.OpenSessionRequest(model="fake"), ANYONE)
    assert isinstance(opened, pb.OpenSessionResponse)
    sid = opened.session_id
    events: list[pb.GenerateEvent] = []

    async def emit(event: pb.GenerateEvent) -> None:
        events.append(event)

    request = pb.GenerateRequest(session_id=sid, append_tokens=[1], max_tokens=400)
    generation = await runner.start_generate(request, ANYONE)
    stream = asyncio.create_task(runner.run_generate(generation, emit))
    await until(lambda: bool(events), "the first event")
    # CloseSession from elsewhere (another socket, a gRPC call) ends the stream cleanly.
    await runner.unary("CloseSession", pb.CloseSessionRequest(session_id=sid), ANYONE)
    await asyncio.wait_for(stream, 5)
    assert events[-1].done.finish_reason == pb.GenerateDone.FINISH_REASON_CANCELLED
    assert len(events) < 100 and engine.running == set()


async def test_a_transport_that_cancels_its_call_aborts_the_engine_request() -> None:
    engine = FakeEngine(step_delay=0.01)
    runner = runner_on(engine)
    opened = await runner.unary("OpenSession", pb.OpenSessionRequest(model="fake"), ANYONE)
    assert isinstance(opened, pb.OpenSessionResponse)
    sid = opened.session_id
    events: list[pb.GenerateEvent] = []

    async def emit(event: pb.GenerateEvent) -> None:
        events.append(event)

    request = pb.GenerateRequest(session_id=sid, append_tokens=[1, 2], max_tokens=400)
    stream = asyncio.create_task(
        runner.run_generate(await runner.start_generate(request, ANYONE), emit)
    )
    await until(lambda: len(events) >= 3, "three events")
    stream.cancel()  # a gRPC deadline, a dropped connection
    with pytest.raises(asyncio.CancelledError):
        await stream
    assert engine.running == set() and not any(e.HasField("done") for e in events)
    assert isinstance(runner.store, MemorySessions)
    session = runner.store.table.get(sid)
    assert session is not None and not session.busy
    assert 5 <= len(session.tokens) < 402  # what was decoded stays
    assert runner.running(sid) is None


async def test_evergreen_half_close_drains_then_ends_cleanly() -> None:
    # A gRPC client sends its messages and half-closes; it still gets its outputs.
    engine = FakeEngine(step_delay=0.005)
    sent: list[service_pb.SessionMessage] = []

    async def send(out: service_pb.SessionMessage) -> None:
        sent.append(out)

    async def messages() -> AsyncIterator[service_pb.SessionMessage]:
        yield message(generate("p", "r", max_tokens=5) + leaf("p", "hi"))
        yield message(
            generate("p2", "r2", max_tokens=2) + ' node_fragments { id: "p2" child_ids: "r" }'
        )
        yield message(generate("never", "r3"))  # its input never comes: it never runs

    run = EvergreenRun(engine, Admission(None, None), Limits(), None, send)
    assert await asyncio.wait_for(run.serve(messages(), drain=True), 5) is None
    fragments = [f for out in sent for f in out.node_fragments]
    assert [f.id for f in fragments] == ["r"] * 5 + ["r2"] * 2
    assert not fragments[4].continued and not fragments[-1].continued
    assert engine.running == set() and len(engine.requests) == 2


async def test_evergreen_client_leaving_cancels_its_actions() -> None:
    engine = FakeEngine(step_delay=0.01)
    sent: list[service_pb.SessionMessage] = []
    left = asyncio.Event()

    async def send(out: service_pb.SessionMessage) -> None:
        sent.append(out)
        left.set()

    async def messages() -> AsyncIterator[service_pb.SessionMessage]:
        yield message(generate("p", "r", max_tokens=400) + leaf("p", "hi"))
        await left.wait()

    run = EvergreenRun(engine, Admission(None, None), Limits(), None, send)
    assert await asyncio.wait_for(run.serve(messages()), 5) is None
    assert engine.running == set() and 1 <= len(sent) < 100


async def broken(request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
    raise RuntimeError("a secret detail of our bug")
    yield  # pragma: no cover


def test_a_bug_reaches_salience_clients_as_an_error_id(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine()
    monkeypatch.setattr(engine, "generate", broken)
    app = create_app(Settings(model="fake"), engine=engine)
    with TestClient(app) as client, client.websocket_connect("/salience/ws") as ws:
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        sid = ws.receive_json()["response"]["sessionId"]
        ws.send_json(gen("g", sessionId=sid, appendTokens=[1], maxTokens=1))
        error = ws.receive_json()["error"]
        ws.send_json(dump("d", sid))
        assert ws.receive_json()["response"] == {}  # rolled back, and free
    assert error["code"] == "INTERNAL" and "secret" not in json.dumps(error)
    assert error["message"].startswith("Internal server error (error id ")
    assert "a secret detail of our bug" in caplog.text  # the log has it, under the id


def test_a_bug_aborts_evergreen_sessions_with_an_error_id(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    monkeypatch.setattr(engine, "generate", broken)
    app = create_app(Settings(model="fake"), engine=engine)
    with TestClient(app) as client, client.websocket_connect("/evergreen/ws") as ws:
        sock = TestClientSocket(ws, binary=True)
        sock.send(generate("p", "r") + leaf("p", "hi"))
        status, code, reason = sock.aborted()
    assert status["code"] == "INTERNAL" and code == 4013
    assert "secret" not in status["message"] + reason
    assert status["message"].startswith("Internal server error (error id ")
