"""The Responses API's websocket mode (`app.routes.ws.responses`) on the fake engine: the
same events as the SSE stream, responses one after the other on one socket, continuation
from the connection's own `store: false` responses (bounded, and evicted by a failed
continuation), the spec's error events, warm-ups, auth at the handshake, cancel on close
and the drain's goodbye. The same over real clients on real vLLM (the openai SDK's
`responses.connect`, the Codex CLI): tests/e2e/test_responses_ws.py,
tests/e2e/agents/test_codex.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from app.config import Settings
from app.main import create_app
from tests.asgi_wire import Wire
from tests.fake_engine import FakeEngine

WS = "/v1/responses"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _create(**body: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": "fake", "store": False, **body}


async def _turn(wire: Wire) -> list[dict[str, Any]]:
    """One response's events, up to its terminal one."""
    events = [await wire.recv()]
    while events[-1]["type"] not in TERMINAL:
        events.append(await wire.recv())
    return events


def _app(engine: FakeEngine, **settings: Any) -> Any:
    return create_app(Settings(model="fake", **settings), engine=engine)


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


async def test_a_response_is_its_sse_stream_as_json_frames() -> None:
    engine = FakeEngine()
    app = _app(engine)
    wire = Wire(app, WS)
    wire.send(_create(input="hi", max_output_tokens=6))
    framed = await _turn(wire)
    await wire.disconnect()
    body = {"model": "fake", "input": "hi", "max_output_tokens": 6, "stream": True, "store": False}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await client.post("/v1/responses", json=body)
    streamed = [
        json.loads(line.removeprefix("data: "))
        for line in answer.text.splitlines()
        if line.startswith("data: ")
    ]

    def shape(events: list[dict[str, Any]]) -> list[Any]:
        return [(e["type"], e["sequence_number"], e.get("delta")) for e in events]

    assert shape(framed) == shape(streamed)
    assert framed[-1]["type"] == "response.incomplete"
    assert _text(framed) == framed[-1]["response"]["output"][0]["content"][0]["text"]


async def test_turns_continue_from_the_connections_own_responses() -> None:
    engine = FakeEngine()
    wire = Wire(_app(engine, responses_ws_kept=2), WS)
    wire.send(_create(input="one", max_output_tokens=3))
    first = (await _turn(wire))[-1]["response"]
    # Sent at once: the second waits for the first to end.
    wire.send(
        _create(input="two", previous_response_id=first["id"], max_output_tokens=3),
        _create(input="three", max_output_tokens=3),
    )
    second = (await _turn(wire))[-1]["response"]
    third = (await _turn(wire))[-1]["response"]
    prompt = "".join(chr(t) for t in engine.requests[1].prompt_token_ids or ())
    first_text = first["output"][0]["content"][0]["text"]
    assert prompt == f"[user]one\n[assistant]{first_text}\n[user]two\n[assistant]"
    assert second["previous_response_id"] == first["id"]
    # Kept: two; the first is the least recently used, gone.
    wire.send(_create(input="four", previous_response_id=first["id"]))
    error = await wire.recv()
    assert error["type"] == "error" and error["status"] == 404
    assert error["error"]["code"] == "previous_response_not_found"
    assert error["error"]["param"] == "previous_response_id"
    wire.send(_create(input="four", previous_response_id=third["id"], max_output_tokens=2))
    assert (await _turn(wire))[-1]["type"] == "response.incomplete"  # still usable
    await wire.disconnect()


@pytest.mark.parametrize(
    ("failing", "param"),
    [
        ({"input": "two", "temperature": 9}, "temperature"),
        # The Open Responses suite's: an output of a call the response never made.
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input.0.call_id",
        ),
    ],
)
async def test_a_failed_continuation_evicts_what_it_continued(
    failing: dict[str, Any], param: str
) -> None:
    wire = Wire(_app(FakeEngine()), WS)
    wire.send(_create(input="one", max_output_tokens=3))
    first = (await _turn(wire))[-1]["response"]
    wire.send(_create(previous_response_id=first["id"], **failing))
    refused = await wire.recv()
    assert (refused["status"], refused["error"]["param"]) == (400, param)
    wire.send(_create(input="two", previous_response_id=first["id"]))
    assert (await wire.recv())["error"]["code"] == "previous_response_not_found"
    await wire.disconnect()


@pytest.mark.parametrize(
    ("frame", "param"),
    [
        ("not json", None),
        ('{"type": "response.cancel"}', "type"),
        ('["response.create"]', "type"),
        (
            '{"type": "response.create", "model": "fake", "input": "x", "background": true}',
            "background",
        ),
        ('{"type": "response.create", "model": "fake", "input": "x", "generate": 1}', "generate"),
        (
            '{"type": "response.create", "model": "fake", "input": [{"role": "robot"}]}',
            "input.0.role",
        ),
    ],
)
async def test_a_bad_frame_is_the_specs_error_event_and_the_socket_stays(
    frame: str, param: str | None
) -> None:
    wire = Wire(_app(FakeEngine()), WS)
    wire.inbox.put_nowait({"type": "websocket.receive", "text": frame})
    error = await wire.recv()
    assert set(error) == {"type", "status", "error"} and error["type"] == "error"
    assert error["status"] == 400 and error["error"]["param"] == param
    assert isinstance(error["error"]["code"], str) and error["error"]["message"]
    wire.send(_create(input="x", max_output_tokens=2))
    assert (await _turn(wire))[-1]["type"] == "response.incomplete"
    await wire.disconnect()


async def test_a_refusal_is_an_error_event_with_its_retry_hint() -> None:
    engine = FakeEngine()
    app = _app(engine)
    wire = Wire(app, WS)
    app.state.drain.begin()  # admission refuses from now on
    wire.send(_create(input="x", max_output_tokens=2))
    refused = await wire.recv()
    assert refused["status"] == 503 and refused["error"]["code"] == "overloaded"
    assert refused["error"]["headers"]["retry-after"].isdigit()
    assert engine.requests == []
    await wire.disconnect()


async def test_a_warm_up_is_planned_not_run_and_continued_from() -> None:
    engine = FakeEngine()
    wire = Wire(_app(engine), WS)
    wire.send(_create(input="warm", instructions="sys", generate=False))
    warm = await _turn(wire)
    assert [e["type"] for e in warm] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert warm[-1]["response"]["output"] == [] and engine.requests == []
    # The Codex CLI's first turn after its warm-up: the warm-up's id, no new input.
    wire.send(_create(input=[], previous_response_id=warm[-1]["response"]["id"]))
    turn = await _turn(wire)
    assert turn[-1]["type"] in TERMINAL[:2]
    prompt = "".join(chr(t) for t in engine.requests[0].prompt_token_ids or ())
    assert prompt.startswith("[user]warm\n")  # instructions are not carried over
    await wire.disconnect()


async def test_closing_the_socket_cancels_its_response() -> None:
    engine = FakeEngine(step_delay=0.01)
    app = _app(engine)
    wire = Wire(app, WS)
    wire.send(_create(input="long", max_output_tokens=400), _create(input="next"))
    for _ in range(5):
        await wire.recv()
    assert engine.running
    await wire.disconnect()
    assert engine.running == set() and len(engine.requests) == 1
    assert app.state.admission.in_flight == 0


async def test_the_drains_goodbye_is_an_error_event_then_1001() -> None:
    engine = FakeEngine()
    app = _app(engine)
    wire = Wire(app, WS)
    wire.send(_create(input="x", max_output_tokens=2))
    await _turn(wire)
    drain = asyncio.create_task(app.state.drain.run(engine.abort))
    goodbye = await wire.recv()
    assert goodbye["status"] == 503 and goodbye["error"]["code"] == "overloaded"
    assert "retry-after" in goodbye["error"]["headers"]
    assert await wire.frame() == 1001
    await wire.ended()
    await asyncio.wait_for(drain, 5)


def test_the_handshake_takes_the_same_key_as_http() -> None:
    app = _app(FakeEngine(), api_key="sekret")
    with TestClient(app) as client:
        with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(WS):
            pass
        assert denied.value.status_code == 401
        assert denied.value.json()["error"]["code"] == "invalid_api_key"
        headers = {"Authorization": "Bearer sekret"}
        with client.websocket_connect(WS, headers=headers) as ws:
            ws.send_json(_create(input="x", max_output_tokens=2))
            events = [ws.receive_json()]
            while events[-1]["type"] not in TERMINAL:
                events.append(ws.receive_json())
        with client.websocket_connect(f"{WS}?token=sekret") as ws:
            ws.send_json(_create(input="x", generate=False))
            assert ws.receive_json()["type"] == "response.created"
