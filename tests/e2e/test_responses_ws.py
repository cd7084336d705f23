"""The Responses API's websocket mode on the live server (real vLLM), through the openai
SDK's own client for it (`client.responses.connect()`, unchanged): a conversation of
turns on one connection, each continuing the last with `previous_response_id` and only
its new input (`store: false`: from the connection's own responses), each turn the same
events as its SSE stream over HTTP; and an error event that leaves the connection usable.

How these fail: a frame the SDK cannot parse into its event types; a turn that does not
see the turns before it (its prompt's tokens are counted against `/tokenize` of the whole
conversation); a websocket turn whose events differ from the same request streamed over
HTTP (greedy: the same tokens).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
TOKENS = 6


def _until_terminal(connection: Any) -> list[Any]:
    events = []
    for event in connection:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError("the connection closed before the response ended")


def _sse(live: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = httpx.post(f"{live.base_url}/v1/responses", json={**body, "stream": True}, timeout=120)
    return [
        json.loads(line.removeprefix("data: "))
        for line in answer.text.splitlines()
        if line.startswith("data: ")
    ]


def _tokens(live: LiveServer, messages: list[dict[str, str]]) -> int:
    answer = httpx.post(
        f"{live.base_url}/tokenize", json={"model": live.model, "messages": messages}
    )
    return int(answer.json()["count"])


def test_a_conversation_on_one_connection(live_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
    sampling: dict[str, Any] = {"max_output_tokens": TOKENS, "temperature": 0}
    messages: list[dict[str, str]] = []
    with client.responses.connect() as connection:
        previous: str | None = None
        for turn, text in enumerate(("one", "two", "three")):
            extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
            connection.response.create(
                model=live_server.model, input=text, store=False, **sampling, **extra
            )
            events = _until_terminal(connection)
            final = events[-1]
            assert final.type == "response.incomplete", final
            response = final.response
            assert [e.sequence_number for e in events] == list(range(len(events)))
            said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert said == response.output_text
            messages += [{"role": "user", "content": text}]
            assert response.usage is not None
            assert response.usage.input_tokens == _tokens(live_server, messages), turn
            messages += [{"role": "assistant", "content": said}]
            if turn == 0:
                body = {"model": live_server.model, "input": text, "store": False, **sampling}
                streamed = _sse(live_server, body)
                framed = [e.model_dump(exclude_none=True) for e in events]
                assert [e["type"] for e in framed] == [e["type"] for e in streamed]
                assert [e.get("delta") for e in framed] == [e.get("delta") for e in streamed]
            previous = response.id
        # An error is an event; the connection goes on.
        connection.response.create(
            model=live_server.model, input="x", previous_response_id="resp_no"
        )
        error = connection.recv()
        assert error.type == "error"
        assert error.error.code == "previous_response_not_found"
        connection.response.create(
            model=live_server.model, input="four", previous_response_id=previous, **sampling
        )
        assert _until_terminal(connection)[-1].type == "response.incomplete"
