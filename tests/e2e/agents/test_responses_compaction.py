"""POST /v1/responses/compact through the openai SDK's `responses.compact`, unchanged: a
window compacted from `input` or from a stored chain (`previous_response_id`), held to
the Open Responses spec's `CompactResource`, continues a new chain over HTTP; a
compaction item this server did not make, or a chain it does not know, is refused in
OpenAI's shape. (Over the WebSocket: the suite's "WebSocket Compact New Chain".)

On the agent CLIs' server, whose tiny model ends its turns: the summary is written to
the model's end of turn, as a chat model writes it, not to the end of the context.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import EasyInputMessageParam, ResponseInputItemParam

from tests.conftest import LiveServer
from tests.open_responses import schema_errors
from tests.response_items import text_of

pytestmark = pytest.mark.e2e


def _client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)


def _user(text: str) -> EasyInputMessageParam:
    return {"type": "message", "role": "user", "content": text}


def test_a_compacted_window_starts_a_new_chain(long_server: LiveServer) -> None:
    client = _client(long_server)
    conversation: list[ResponseInputItemParam] = [
        _user("Remember the code word: slate."),
        {"type": "message", "role": "assistant", "content": "OK."},
        _user("Compress this conversation for later."),
    ]
    answered = client.responses.with_raw_response.compact(
        model=long_server.model, input=conversation
    )
    window, raw = answered.parse(), answered.http_response.json()
    assert schema_errors("CompactResource", raw) == [], raw
    assert window.object == "response.compaction" and window.usage.output_tokens >= 1
    *kept, compaction = raw["output"]
    assert [item["content"][0]["text"] for item in kept] == [
        "Remember the code word: slate.",
        "Compress this conversation for later.",
    ]
    assert compaction["type"] == "compaction" and compaction["encrypted_content"]
    # The compacted window as the server sent it, JSON: an input the client sends back.
    follow: list[Any] = [*raw["output"], _user("Continue from here.")]
    answer = client.responses.create(model=long_server.model, input=follow)
    assert answer.status == "completed" and answer.previous_response_id is None
    # The summary reached the model: without the compaction item the prompt is shorter.
    without: list[Any] = [*kept, _user("Continue from here.")]
    shorter = client.responses.create(model=long_server.model, input=without, max_output_tokens=1)
    assert answer.usage is not None and shorter.usage is not None
    assert answer.usage.input_tokens > shorter.usage.input_tokens
    listed = client.responses.input_items.list(answer.id, order="asc")
    assert [item.type for item in listed.data] == ["message", "message", "compaction", "message"]


def test_a_stored_chain_compacts_from_its_previous_response_id(long_server: LiveServer) -> None:
    client = _client(long_server)
    first = client.responses.create(model=long_server.model, input="My name is Alice.")
    answered = client.responses.with_raw_response.compact(
        model=long_server.model, previous_response_id=first.id, input="And yours?"
    )
    window, raw = answered.parse(), answered.http_response.json()
    texts = [text_of(item) for item in window.output if item.type == "message"]
    assert texts == ["My name is Alice.", "And yours?"]
    assert window.output[-1].type == "compaction"
    answer = client.responses.create(
        model=long_server.model, input=[*raw["output"], _user("Go on.")]
    )
    assert answer.status == "completed"


def test_what_cannot_be_compacted_is_refused(long_server: LiveServer) -> None:
    url = f"{long_server.base_url}/v1/responses"
    cases = [
        ("/compact", {"input": "hi"}, 400, "model"),
        ("/compact", {"model": long_server.model, "previous_response_id": "resp_gone"}, 404,
         "previous_response_id"),
        ("", {"model": long_server.model, "input": [
            {"type": "compaction", "encrypted_content": "gAAAA-from-elsewhere"}]}, 400,
         "input.0.encrypted_content"),
    ]  # fmt: skip
    for path, body, status, param in cases:
        answer = httpx.post(url + path, json=body, timeout=60)
        assert answer.status_code == status, answer.text
        assert answer.json()["error"]["param"] == param
