"""Fuzz the Responses API on the live server (real vLLM): POST /v1/responses with seeded
mutations of valid bodies (every input item kind, tools, text formats, streams, stored,
unstored and background), hostile leaves and garbage, and the routes that read a stored
response by id.

Every answer must be the route's success shape (a response object, an SSE stream of
named Responses events ending in a terminal event or `error` + `response.failed`, a
deletion, an input-item page) or an OpenAI error body with a 4xx or 503 status: never
FastAPI's `{"detail": ...}`, never another 5xx, never a reset connection, no engine
request left running. The valid seeds ask for at most 4 tokens.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.fuzz.corpus import DEFAULT_INPUTS, Offence, json_input, rng
from tests.fuzz.harness import judge_status, openai_error_shape, run_corpus, verdict

pytestmark = pytest.mark.e2e

MODEL = "tiny"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
SEEDS: list[dict[str, Any]] = [
    {"model": MODEL, "input": "hi", "max_output_tokens": 4},
    {
        "model": MODEL,
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "terse"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
        ],
        "tools": [TOOL],
        "tool_choice": "auto",
        "max_output_tokens": 3,
        "stream": True,
        "store": False,
    },
    {
        "model": MODEL,
        "input": "json please",
        "text": {"format": {"type": "json_schema", "name": "x", "schema": TOOL["parameters"]}},
        "max_output_tokens": 4,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "metadata": {"k": "v"},
        "truncation": "auto",
    },
    {
        "model": MODEL,
        "input": "w",
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
        "max_output_tokens": 4,
        "background": True,
        "stream": True,
    },
    {"model": MODEL, "input": "x", "previous_response_id": "resp_unknown", "max_output_tokens": 2},
]
ID_ROUTES = [
    ("GET", "/v1/responses/{id}"),
    ("GET", "/v1/responses/{id}?stream=true&starting_after=2"),
    ("GET", "/v1/responses/{id}/input_items?limit=1&order=asc"),
    ("POST", "/v1/responses/{id}/cancel"),
    ("DELETE", "/v1/responses/{id}"),
]
# Not the empty id: Starlette redirects `/v1/responses/` (307) as it does every route's
# trailing slash, before any route is matched.
IDS = ["resp_unknown", "%00", "../../etc", "x" * 3000, "resp_\ud800"]
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def make_input(index: int) -> tuple[str, str, bytes | None]:
    r = rng("responses", index)
    if r.random() < 0.85:
        return "POST", "/v1/responses", json_input(r.choice(SEEDS), r)
    method, path = r.choice(ID_ROUTES)
    response_id = r.choice(IDS).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return method, path.replace("{id}", response_id), None


def stream_shape(text: str, first: int) -> str | None:
    """Why `text` is not a Responses stream numbered from `first`, or None."""
    events = [block for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()]
    if not events:
        return "an empty stream"
    kinds = []
    for number, block in enumerate(events, start=first):
        lines = block.split("\n")
        if (
            len(lines) != 2
            or not lines[0].startswith("event: ")
            or not lines[1].startswith("data: ")
        ):
            return f"event {number} is not 'event: <type>' + 'data: <json>'"
        body = json.loads(lines[1].removeprefix("data: "))
        if body.get("type") != lines[0].removeprefix("event: "):
            return f"event {number}: the name is not the body's type"
        if body.get("sequence_number") != number:
            return f"event {number} has sequence_number {body.get('sequence_number')}"
        kinds.append(body["type"])
    if kinds[-1] not in TERMINAL:
        return f"the stream ends with {kinds[-1]}, not a terminal event"
    if kinds[-1] == "response.failed" and kinds[-2:-1] != ["error"]:
        return "response.failed without an error event before it"
    return None


def success_shape(method: str, path: str, response: httpx.Response) -> str | None:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return stream_shape(response.text, 3 if "starting_after=2" in path else 0)
    body = response.json()
    if not isinstance(body, dict):
        return "not a JSON object"
    if method == "DELETE":
        return None if body.get("deleted") is True else "not a deletion"
    if path.split("?")[0].endswith("/input_items"):
        return None if body.get("object") == "list" else "not an input-item list"
    ok = body.get("object") == "response" and isinstance(body.get("output"), list)
    return None if ok else "not a response object"


def judge(method: str, path: str, response: httpx.Response) -> str | None:
    return judge_status(response, lambda: success_shape(method, path, response), openai_error_shape)


async def test_responses_corpus(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=60) as client:

        async def probe(index: int) -> Offence | None:
            method, path, body = make_input(index)
            headers = {"content-type": "application/json"}
            try:
                response = await client.request(method, path, content=body, headers=headers)
            except httpx.TransportError as exc:
                return Offence(index, (method, path, body), f"transport error: {exc!r}")
            reason = judge(method, path, response)
            if reason is None:
                return None
            return Offence(index, (method, path, body), f"{reason}: {response.text[:300]!r}")

        offences = await run_corpus(probe)
    verdict(live_server, "Responses", offences)


def test_corpus_is_seeded_and_varied() -> None:
    assert make_input(17) == make_input(17)
    kinds = {make_input(i)[:2] for i in range(DEFAULT_INPUTS)}
    assert ("POST", "/v1/responses") in kinds
    assert len({method for method, _ in kinds}) == 3
