"""Admission and drain on the websocket protocols, over the fake engine: a Salience
Generate refused with an UNAVAILABLE error frame (the socket and the session untouched),
an Evergreen GENERATE refused with ABORT UNAVAILABLE, and the drain's goodbye on both
(and its refusal of new sessions). Real vLLM and a real server: tests/e2e/test_overload.py
and tests/e2e/test_drain.py."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from app.admission import Admission
from app.config import Settings
from app.drain import Drain
from app.main import create_app
from tests.fake_engine import FakeEngine


class Wire:
    """One websocket connection to the ASGI app at `path`, JSON text frames."""

    def __init__(self, app: Any, path: str) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        scope = {
            "type": "websocket",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [],
            "scheme": "ws",
            "server": ("test", 80),
            "client": ("test", 1234),
            "root_path": "",
            "subprotocols": [],
            "app": app,
        }
        self.task = asyncio.create_task(app(scope, self.inbox.get, self.outbox.put))

    def send(self, frame: dict[str, Any]) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(frame)})

    async def recv(self) -> dict[str, Any] | int:
        """The next frame, or the close code once the server closes."""
        while True:
            message = await asyncio.wait_for(self.outbox.get(), 5)
            if message["type"] == "websocket.send":
                return dict(json.loads(message["text"]))
            if message["type"] == "websocket.close":
                self.inbox.put_nowait({"type": "websocket.disconnect", "code": message["code"]})
                return int(message["code"])

    async def ended(self) -> None:
        await asyncio.wait_for(self.task, 5)


def _app(engine: FakeEngine, **settings: Any) -> Any:
    return create_app(Settings(model="fake", **settings), engine=engine)


def _generate(call_id: str, session: str, max_tokens: int) -> dict[str, Any]:
    request = {"sessionId": session, "appendTokens": [65, 66], "maxTokens": max_tokens}
    return {"id": call_id, "method": "Generate", "request": request}


async def _open(wire: Wire) -> str:
    wire.send({"id": "open", "method": "OpenSession", "request": {"model": "fake"}})
    reply = await wire.recv()
    assert isinstance(reply, dict)
    return str(reply["response"]["sessionId"])


def _turn(max_tokens: int) -> dict[str, Any]:
    struct = {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {}}
    struct["value"] = {"max_tokens": max_tokens}
    return {
        "actions": [
            {
                "name": "GENERATE",
                "configs": [struct],
                "inputs": [{"name": "prompt", "id": "p"}],
                "outputs": [{"name": "response", "id": "r"}],
            }
        ],
        "nodeFragments": [
            {
                "id": "p",
                "chunkFragment": {
                    "metadata": {"mimetype": "text/plain"},
                    "data": base64.b64encode(b"ab").decode(),
                },
            }
        ],
    }


async def _abort(wire: Wire) -> tuple[dict[str, Any], int]:
    """The ABORT's status and the close code, past any fragments."""
    while True:
        frame = await wire.recv()
        assert isinstance(frame, dict), frame
        if "actions" in frame:
            break
    [action] = frame["actions"]
    assert action["name"] == "ABORT"
    status = action["configs"][0]["value"]
    code = await wire.recv()
    assert isinstance(code, int)
    return status, code


async def test_a_refused_salience_generate_leaves_the_socket_and_session_as_they_were() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    admission: Admission = app.state.admission
    wire = Wire(app, "/salience/ws")
    session = await _open(wire)
    held = admission.admit("test")
    wire.send(_generate("g", session, 2))
    refused = await wire.recv()
    assert isinstance(refused, dict) and refused["id"] == "g"
    assert refused["error"]["code"] == "UNAVAILABLE"
    assert "retry after" in refused["error"]["message"]
    wire.send({"id": "d", "method": "DumpSession", "request": {"sessionId": session}})
    assert await wire.recv() == {"id": "d", "response": {}}  # nothing was appended
    held.release()
    wire.send(_generate("g2", session, 2))
    events = [await wire.recv() for _ in range(3)]
    assert all(isinstance(e, dict) and e["id"] == "g2" for e in events)
    assert admission.in_flight == 0 and admission.refused["salience"] == 1
    assert admission.admitted["salience"] == 1


async def test_a_refused_evergreen_generate_aborts_unavailable_with_the_retry_hint() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    admission: Admission = app.state.admission
    held = admission.admit("test")
    wire = Wire(app, "/evergreen/ws")
    wire.send(_turn(4))
    status, code = await _abort(wire)
    assert status["code"] == "UNAVAILABLE" and status["retry_after_s"] >= 1
    assert "retry after" in status["message"] and code == 4014
    await wire.ended()
    held.release()
    assert admission.in_flight == 0 and admission.refused == {"evergreen": 1}


async def test_the_drain_cuts_running_work_and_says_each_protocols_goodbye() -> None:
    engine = FakeEngine(step_delay=0.02)
    app = _app(engine, drain_timeout_s=0.2)
    drain: Drain = app.state.drain
    salience = Wire(app, "/salience/ws")
    session = await _open(salience)
    salience.send(_generate("g", session, 300))  # 6 s: cut by the drain
    idle_salience = Wire(app, "/salience/ws")
    await _open(idle_salience)
    evergreen = Wire(app, "/evergreen/ws")
    evergreen.send(_turn(300))
    idle_evergreen = Wire(app, "/evergreen/ws")
    async with asyncio.timeout(5):
        while app.state.admission.in_flight < 2:
            await asyncio.sleep(0.01)
    await drain.run(engine.abort)

    # Salience: the running Generate ends with UNAVAILABLE, then the socket's goodbye.
    frames = []
    while not isinstance(frame := await salience.recv(), int):
        frames.append(frame)
    assert frame == 1001
    call_error, goodbye = frames[-2], frames[-1]
    assert call_error["id"] == "g" and call_error["error"]["code"] == "UNAVAILABLE"
    assert goodbye["id"] == "" and "shutting down" in goodbye["error"]["message"]
    assert await idle_salience.recv() == goodbye and await idle_salience.recv() == 1001
    # Evergreen: ABORT UNAVAILABLE and 4014, busy or idle.
    for wire in (evergreen, idle_evergreen):
        status, code = await _abort(wire)
        assert status["code"] == "UNAVAILABLE" and code == 4014
    # New sessions are refused the same way.
    late = Wire(app, "/salience/ws")
    refused = await late.recv()
    assert isinstance(refused, dict) and refused["error"]["code"] == "UNAVAILABLE"
    assert await late.recv() == 1001
    late_evergreen = Wire(app, "/evergreen/ws")
    status, code = await _abort(late_evergreen)
    assert status["code"] == "UNAVAILABLE" and code == 4014
    for wire in (salience, idle_salience, evergreen, idle_evergreen, late, late_evergreen):
        await wire.ended()
    assert app.state.admission.in_flight == 0 and engine.running == set()
