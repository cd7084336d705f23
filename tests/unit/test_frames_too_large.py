"""A websocket message over the size limit (uvicorn's 16 MiB) is answered in the socket's
own protocol before the close 1009 the websockets library sends (it was a bare close):
Salience's error frame, Evergreen's ABORT RESOURCE_EXHAUSTED, the Responses API's error
event; over the fake engine on the uvicorn `switchboard serve` runs."""

from __future__ import annotations

import contextlib
import json

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import served_as_switchboard

OVER = b"x" * (16 * 1024 * 1024 + 1)


async def _answer_then_close(url: str, big: str | bytes) -> str | bytes:
    """What the server sends after `big`, and that the close is 1009."""
    ws = await websockets.connect(url, max_size=None)
    try:
        with contextlib.suppress(ConnectionClosed):  # the server may end it mid-send
            await ws.send(big)
        answer = await ws.recv()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    finally:
        with contextlib.suppress(Exception):  # the library's own close of a closed socket
            await ws.close()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    return answer


async def test_salience_answers_its_error_in_the_last_calls_encoding() -> None:
    with served_as_switchboard(FakeEngine()) as port:
        url = f"ws://127.0.0.1:{port}/salience/ws"
        answer = await _answer_then_close(url, OVER.decode())
    frame = json.loads(answer)
    assert frame["error"]["code"] == "RESOURCE_EXHAUSTED"
    assert "over this server's limit of 16777216 bytes" in frame["error"]["message"]


async def test_evergreen_aborts_resource_exhausted_in_its_encoding() -> None:
    with served_as_switchboard(FakeEngine()) as port:
        url = f"ws://127.0.0.1:{port}/evergreen/ws"
        text = await _answer_then_close(url, OVER.decode())
        binary = await _answer_then_close(url, OVER)
    for answer in (text, binary):  # no frame came first: the encoding is still JSON's
        assert isinstance(answer, str), answer
        [action] = json.loads(answer)["actions"]
        assert action["name"] == "ABORT", answer
        assert action["configs"][0]["value"]["code"] == "RESOURCE_EXHAUSTED", answer


async def test_the_responses_websocket_sends_its_error_event() -> None:
    with served_as_switchboard(FakeEngine()) as port:
        url = f"ws://127.0.0.1:{port}/v1/responses"
        answer = await _answer_then_close(url, OVER.decode())
    event = json.loads(answer)
    assert event["type"] == "error" and event["error"]["code"] == "request_too_large"
    assert "limit of 16777216 bytes" in event["error"]["message"]
