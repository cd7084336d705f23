"""Fuzz the Responses API's websocket mode (`ws://.../v1/responses`) on the live server
(real vLLM): each input is one socket, one seeded frame (a mutation of a valid
`response.create`: every input item kind, tools, continuations, warm-ups; hostile leaves,
garbage, a binary frame now and then), then a sentinel `response.create` (a warm-up, no
engine work).

Every frame the server sends must be a JSON object with a string `type`: a response's
stream event, or the spec's `WebSocketErrorEvent` (`status` 4xx or 503, `error.code` and
`error.message` strings); a response that starts must end (`response.completed`,
`.incomplete` or `.failed`) before the next one starts; and the socket must stay usable:
the sentinel completes. The valid seeds ask for at most 4 tokens.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets

from tests.conftest import LiveServer
from tests.fuzz.corpus import json_input, rng
from tests.fuzz.harness import run_corpus, socket_probe, verdict

pytestmark = pytest.mark.e2e

MODEL = "tiny"
CREATE = {"type": "response.create", "model": MODEL}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SEEDS: list[dict[str, Any]] = [
    {**CREATE, "input": "hi", "max_output_tokens": 4, "store": False},
    {**CREATE, "input": "hi", "max_output_tokens": 3, "generate": False, "stream": True},
    {
        **CREATE,
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [TOOL],
        "max_output_tokens": 2,
        "store": False,
    },
    {**CREATE, "input": [], "previous_response_id": "resp_nope", "max_output_tokens": 2},
    {
        **CREATE,
        "input": "json",
        "text": {"format": {"type": "json_object"}},
        "max_output_tokens": 4,
    },
]
SENTINEL_METADATA = {"fuzz": "sentinel"}
SENTINEL = json.dumps(
    {**CREATE, "input": "sentinel", "generate": False, "metadata": SENTINEL_METADATA}
)
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def make_input(index: int) -> bytes | str:
    """Input `index`: a text frame, or now and then the same kind of input as a binary
    frame (JSON the server must read, or refuse, all the same)."""
    r = rng("responses-ws", index)
    data = json_input(r.choice(SEEDS), r)
    return data if index % 7 == 3 else data.decode("utf-8", "replace")


def judge(frame: Any) -> tuple[str, str | None]:
    """(the frame's type, why it left the mode's shape or None)."""
    if not isinstance(frame, str):
        return "", "a binary frame"
    event = json.loads(frame)
    kind = event.get("type") if isinstance(event, dict) else None
    if not isinstance(kind, str):
        return "", "no string type"
    if kind == "error" and "status" in event:
        error = event.get("error")
        status = event["status"]
        if not (isinstance(status, int) and (400 <= status < 500 or status == 503)):
            return kind, f"status {status!r}"
        if not isinstance(error, dict) or not all(
            isinstance(error.get(key), str) for key in ("code", "message")
        ):
            return kind, "error.code or error.message is not a string"
    return kind, None


async def socket_turns(url: str, index: int) -> tuple[Any, str | None]:
    """(the input sent, why the answers left the mode's shape or None)."""
    frame = make_input(index)
    async with websockets.connect(url, max_size=None, open_timeout=30) as ws:
        await ws.send(frame)
        await ws.send(SENTINEL)
        running = False
        try:
            while True:
                raw = await asyncio.wait_for(ws.recv(), timeout=60)
                kind, reason = judge(raw)
                if reason is not None:
                    return frame, reason
                if kind == "response.created":
                    if running:
                        return frame, "a response started before the last one ended"
                    running = True
                elif kind in TERMINAL:
                    running = False
                    if json.loads(raw)["response"].get("metadata") == SENTINEL_METADATA:
                        return frame, None
        except websockets.ConnectionClosed as closed:
            return frame, f"the socket closed: {closed!r}"
        except TimeoutError:
            return frame, "the sentinel did not complete within 60 s"
        except ValueError as exc:
            return frame, f"not JSON: {exc}"


async def test_responses_websocket_corpus(live_server: LiveServer) -> None:
    url = f"{live_server.ws_url}/v1/responses"

    offences = await run_corpus(socket_probe(lambda index: socket_turns(url, index)))
    verdict(live_server, "Responses WebSocket", offences)


def test_corpus_is_seeded() -> None:
    assert make_input(9) == make_input(9)
    assert {type(make_input(i)) for i in range(10)} == {bytes, str}
