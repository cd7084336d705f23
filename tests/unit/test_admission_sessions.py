"""Admission and drain on the websocket protocols, over the fake engine: a Salience
Generate refused with an UNAVAILABLE error frame (the socket and the session untouched),
an Evergreen GENERATE refused with ABORT UNAVAILABLE, and the drain's goodbye on both
(and its refusal of new sessions). Real vLLM and a real server: tests/e2e/test_overload.py
and tests/fleet/test_drain.py."""

from __future__ import annotations

import asyncio
from typing import Any

from app.admission import Admission, ProtocolName
from app.config import Settings
from app.drain import Drain
from app.main import create_app
from tests.asgi_wire import TIMEOUT_S, Wire
from tests.evergreen_frames import turn
from tests.fake_engine import FakeEngine
from tests.waits import until


def _app(engine: FakeEngine, **settings: Any) -> Any:
    return create_app(Settings(model="fake", **settings), engine=engine)


def _generate(call_id: str, session: str, max_tokens: int) -> dict[str, Any]:
    request = {"sessionId": session, "appendTokens": [65, 66], "maxTokens": max_tokens}
    return {"id": call_id, "method": "Generate", "request": request}


async def _abort(wire: Wire) -> tuple[dict[str, Any], int]:
    """The ABORT's status and the close code, past any fragments."""
    async with asyncio.timeout(TIMEOUT_S):
        while "actions" not in (frame := await wire.recv()):
            pass
        [action] = frame["actions"]
        assert action["name"] == "ABORT"
        status: dict[str, Any] = action["configs"][0]["value"]
        code = await wire.recv_or_close()
    assert isinstance(code, int)
    return status, code


async def test_a_refused_salience_generate_leaves_the_socket_and_session_as_they_were() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    admission: Admission = app.state.admission
    wire = Wire(app, "/salience/ws")
    session = await wire.open_session()
    held = admission.admit(ProtocolName.OPENAI)
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
    await wire.disconnect()


async def test_a_refused_evergreen_generate_aborts_unavailable_with_the_retry_hint() -> None:
    engine = FakeEngine()
    app = _app(engine, max_queued_requests=1)
    admission: Admission = app.state.admission
    held = admission.admit(ProtocolName.OPENAI)
    wire = Wire(app, "/evergreen/ws")
    wire.send(turn("ab", 4))
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
    session = await salience.open_session()
    salience.send(_generate("g", session, 300))  # 6 s: cut by the drain
    idle_salience = Wire(app, "/salience/ws")
    await idle_salience.open_session()
    evergreen = Wire(app, "/evergreen/ws")
    evergreen.send(turn("ab", 300))
    idle_evergreen = Wire(app, "/evergreen/ws")
    await until(lambda: app.state.admission.in_flight >= 2, "both GENERATEs admitted")
    await drain.run(engine.abort)

    # Salience: the running Generate ends with UNAVAILABLE, then the socket's goodbye.
    frames = []
    async with asyncio.timeout(TIMEOUT_S):
        while not isinstance(frame := await salience.recv_or_close(), int):
            frames.append(frame)
    assert frame == 1001
    call_error, goodbye = frames[-2], frames[-1]
    assert call_error["id"] == "g" and call_error["error"]["code"] == "UNAVAILABLE"
    assert goodbye["id"] == "" and "shutting down" in goodbye["error"]["message"]
    assert await idle_salience.recv() == goodbye and await idle_salience.recv_or_close() == 1001
    # Evergreen: ABORT UNAVAILABLE and 4014, busy or idle.
    for wire in (evergreen, idle_evergreen):
        status, code = await _abort(wire)
        assert status["code"] == "UNAVAILABLE" and code == 4014
    # New sessions are refused the same way.
    late = Wire(app, "/salience/ws")
    refused = await late.recv()
    assert refused["error"]["code"] == "UNAVAILABLE"
    assert await late.recv_or_close() == 1001
    late_evergreen = Wire(app, "/evergreen/ws")
    status, code = await _abort(late_evergreen)
    assert status["code"] == "UNAVAILABLE" and code == 4014
    for wire in (salience, idle_salience, evergreen, idle_evergreen, late, late_evergreen):
        await wire.ended()
    assert app.state.admission.in_flight == 0 and engine.running == set()
