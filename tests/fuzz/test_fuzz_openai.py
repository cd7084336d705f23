"""Fuzz the OpenAI HTTP routes on the live server (real vLLM): completions, chat, tokenize,
detokenize and the LoRA admin routes, with seeded mutations of valid bodies, hostile
leaves and garbage.

Every answer must be a success of the route's own shape or an OpenAI error body
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx or 503 status: never
FastAPI's `{"detail": ...}`, never another 5xx, never a reset connection. The valid seeds
ask for at most 4 tokens so that accepted inputs finish fast; the LoRA seeds name no
adapter directory, so nothing is ever loaded or unloaded for real.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.fuzz.corpus import DEFAULT_INPUTS
from tests.fuzz.harness import (
    JsonRoutes,
    judge_status,
    openai_error_shape,
    post_corpus,
    sse_events,
    verdict,
)

pytestmark = pytest.mark.e2e

MODEL, LORA = "tiny", "tiny-lora"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]

SEEDS: dict[str, list[dict[str, Any]]] = {
    "/v1/completions": [
        {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0},
        {
            "model": MODEL,
            "prompt": [1, 2, 3],
            "max_tokens": 3,
            "logprobs": 2,
            "echo": True,
            "stop": ["\n"],
            "seed": 7,
        },
        {
            "model": MODEL,
            "prompt": ["a", "b"],
            "max_tokens": 2,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {
            "model": LORA,
            "prompt": "x",
            "max_tokens": 2,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.1,
            "presence_penalty": 0.5,
            "frequency_penalty": 0.5,
            "repetition_penalty": 1.1,
            "stop_token_ids": [5],
            "ignore_eos": True,
            "min_tokens": 1,
        },
    ],
    "/v1/chat/completions": [
        {"model": MODEL, "messages": CHAT, "max_tokens": 4},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 4,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {
            "model": LORA,
            "messages": CHAT,
            "max_tokens": 3,
            "n": 2,
            "seed": 1,
            "temperature": 0.5,
            "stop": "x",
        },
    ],
    "/tokenize": [
        {"model": MODEL, "prompt": "hello", "add_special_tokens": True},
        {"model": MODEL, "messages": CHAT, "add_generation_prompt": True},
    ],
    "/detokenize": [{"model": MODEL, "tokens": [1, 2, 3]}],
    "/v1/load_lora_adapter": [{"lora_name": "fuzz-lora", "lora_path": "/nonexistent/fuzz-lora"}],
    "/v1/unload_lora_adapter": [{"lora_name": "fuzz-lora"}],
}
ROUTE_WEIGHTS = {
    "/v1/completions": 30,
    "/v1/chat/completions": 30,
    "/tokenize": 12,
    "/detokenize": 10,
    "/v1/load_lora_adapter": 9,
    "/v1/unload_lora_adapter": 9,
}


ROUTES = JsonRoutes("openai", SEEDS, ROUTE_WEIGHTS)


def success_shape(route: str, response: httpx.Response) -> str | None:
    """Why a 200 answer is not the route's success shape, or None."""
    if route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        return None if response.text.startswith("Success") else "not 'Success: ...'"
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        if route not in ("/v1/completions", "/v1/chat/completions"):
            return "a stream on a route that does not stream"
        events = [data for _, data in sse_events(response.text)]
        if not events or events[-1] != "[DONE]":
            return "the stream does not end with data: [DONE]"
        kind = "text_completion" if route == "/v1/completions" else "chat.completion.chunk"
        for event in events[:-1]:
            chunk = json.loads(event)
            if "error" in chunk:
                if reason := openai_error_shape(chunk):
                    return f"an error chunk: {reason}"
            elif chunk.get("object") != kind:
                return f"a chunk that is not a {kind}"
        return None
    body = response.json()
    if not isinstance(body, dict):
        return "not a JSON object"
    if route == "/tokenize":
        ok = isinstance(body.get("tokens"), list) and isinstance(body.get("count"), int)
    elif route == "/detokenize":
        ok = isinstance(body.get("prompt"), str)
    else:
        kind = "text_completion" if route == "/v1/completions" else "chat.completion"
        ok = body.get("object") == kind and isinstance(body.get("choices"), list)
    return None if ok else "not the route's success body"


def judge(route: str, response: httpx.Response) -> str | None:
    return judge_status(response, lambda: success_shape(route, response), openai_error_shape)


async def test_openai_http_corpus(live_server: LiveServer) -> None:
    offences = await post_corpus(live_server, ROUTES, judge)
    verdict(live_server, "OpenAI HTTP", offences)


def test_corpus_is_seeded_and_varied() -> None:
    """The same index gives the same input; CI's corpus covers every route."""
    assert ROUTES.make_input(17) == ROUTES.make_input(17)
    routes = {ROUTES.make_input(i)[0] for i in range(DEFAULT_INPUTS)}
    assert routes == set(ROUTE_WEIGHTS)
