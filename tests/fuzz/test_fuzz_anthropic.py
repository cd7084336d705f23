"""Fuzz Anthropic's Messages routes on the live server (real vLLM): /v1/messages (whole and
streamed) and /v1/messages/count_tokens, with seeded mutations of valid bodies (every
block kind, tools and tool choices, system blocks), hostile leaves and garbage.

Every answer must be a success of the route's own shape or an Anthropic error body
(`{"type": "error", "error": {"type", "message"}}`) with a 4xx, 503 or 529 status; a
stream must be named events ending with `message_stop`, or with an `error` event. Never
FastAPI's `{"detail": ...}`, OpenAI's shape, another 5xx or a reset connection. The
valid seeds ask for at most 4 tokens so that accepted inputs finish fast.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.fuzz.corpus import DEFAULT_INPUTS
from tests.fuzz.harness import JsonRoutes, judge_status, post_corpus, verdict

pytestmark = pytest.mark.e2e

MODEL = "tiny"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
TOOL = {
    "name": "get_weather",
    "description": "The weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HISTORY = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "redacted_thinking", "data": "x"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "12 C"},
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "is_error": True,
                "content": [{"type": "text", "text": "x"}],
            },
            {"type": "text", "text": "Thanks."},
        ],
    },
]

SEEDS: dict[str, list[dict[str, Any]]] = {
    "/v1/messages": [
        {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": MODEL,
            "max_tokens": 3,
            "stream": True,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": HISTORY,
            "tools": [TOOL],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "stop_sequences": ["\n"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "metadata": {"user_id": "u"},
        },
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "def"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        {
            "model": MODEL,
            "max_tokens": 2,
            "stream": True,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                        {
                            "type": "image",
                            "source": {"type": "url", "url": f"data:image/png;base64,{PNG}"},
                        },
                    ],
                },
                {"role": "system", "content": "inline"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "any"},
        },
    ],
    "/v1/messages/count_tokens": [
        {"model": MODEL, "messages": HISTORY, "tools": [TOOL], "system": "s"},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": "none"},
        },
    ],
}
ROUTE_WEIGHTS = {"/v1/messages": 75, "/v1/messages/count_tokens": 25}
KINDS = (
    "invalid_request_error",
    "authentication_error",
    "not_found_error",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
)


ROUTES = JsonRoutes("anthropic", SEEDS, ROUTE_WEIGHTS)


def error_shape(body: Any) -> str | None:
    """Why `body` is not an Anthropic error body, or None."""
    if not isinstance(body, dict) or body.get("type") != "error":
        return "not {'type': 'error', ...}"
    error = body.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return "error.message is not a string"
    if error.get("type") not in KINDS:
        return f"error.type {error.get('type')!r} is not Anthropic's"
    return None


def _stream_shape(text: str) -> str | None:
    names = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if set(lines) != {"event", "data"}:
            return f"an event that is not event + data: {block[:100]!r}"
        data = json.loads(lines["data"])
        if data.get("type") != lines["event"]:
            return "an event named apart from its data's type"
        if lines["event"] == "error" and (reason := error_shape(data)):
            return f"an error event: {reason}"
        names.append(lines["event"])
    if not names or names[-1] not in ("message_stop", "error"):
        return f"the stream ends with {names[-1:]}"
    if names[-1] == "message_stop" and names[:2] != ["message_start", "ping"]:
        return "a stream that does not open with message_start and ping"
    return None


def success_shape(route: str, response: httpx.Response) -> str | None:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        if route != "/v1/messages":
            return "a stream on a route that does not stream"
        return _stream_shape(response.text)
    body = response.json()
    if route == "/v1/messages/count_tokens":
        ok = isinstance(body, dict) and isinstance(body.get("input_tokens"), int)
    else:
        ok = (
            isinstance(body, dict)
            and body.get("type") == "message"
            and isinstance(body.get("content"), list)
            and body["content"]
            and body.get("stop_reason") in ("end_turn", "max_tokens", "stop_sequence", "tool_use")
        )
    return None if ok else "not the route's success body"


def judge(route: str, response: httpx.Response) -> str | None:
    return judge_status(response, lambda: success_shape(route, response), error_shape, (503, 529))


async def test_anthropic_http_corpus(live_server: LiveServer) -> None:
    headers = {"anthropic-version": "2023-06-01"}
    offences = await post_corpus(live_server, ROUTES, judge, headers)
    verdict(live_server, "Anthropic HTTP", offences)


def test_corpus_is_seeded_and_varied() -> None:
    """The same index gives the same input; the corpus covers every route."""
    assert ROUTES.make_input(17) == ROUTES.make_input(17)
    assert {ROUTES.make_input(i)[0] for i in range(DEFAULT_INPUTS)} == set(ROUTE_WEIGHTS)
