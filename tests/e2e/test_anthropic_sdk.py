"""The anthropic SDK, unchanged, against the live server (real vLLM, tiny model): what a
user of `messages.create`, `messages.stream` and `messages.count_tokens` meets.

Greedy decoding is deterministic, so the same conversation sent twice (streamed and
not, or as Anthropic Messages and as OpenAI Chat) must give the same tokens: that is how
these tests hold the translation and the stream to what the SDK builds, not just to "it
answered". A translation that dropped a system block, a turn or a tool result, or a
stream whose deltas did not join into the message, fails an equality here.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import MessageParam, TextBlockParam
from openai import OpenAI
from openai.types.chat import ChatCompletionContentPartTextParam

from tests.conftest import LiveServer
from tests.error_bodies import body_of

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER},
    {
        "name": "add",
        "description": "Adds two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
]
USER: list[MessageParam] = [{"role": "user", "content": "What is the weather in Oslo?"}]
# The SDK's latest releases no longer name Anthropic's sampling fields; the API (and this
# server) still take them in the body.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=live_server.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def openai_client(live_server: LiveServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused") as c:
        yield c


def _streamed(
    client: anthropic.Anthropic, **kwargs: Any
) -> tuple[list[str], anthropic.types.Message]:
    with client.messages.stream(**kwargs) as stream:
        kinds: list[str] = [event.type for event in stream]
        return kinds, stream.get_final_message()


def _text(message: anthropic.types.Message) -> str:
    """The text of a message's first block, which must be text."""
    block = message.content[0]
    assert block.type == "text", block
    return block.text


def _chat_text(text: str) -> ChatCompletionContentPartTextParam:
    return {"type": "text", "text": text}


def _same_message(streamed: anthropic.types.Message, whole: anthropic.types.Message) -> None:
    """The SDK's accumulated stream is the non-streamed message (ids aside, each call's
    being fresh; the prompt's
    tokens as a whole, since a second run may find part of it in the prefix cache)."""
    a, b = streamed.model_dump(), whole.model_dump()
    for message in (a, b):
        message.pop("id")
        for block in message["content"]:
            if block["type"] == "tool_use":
                block["id"] = "(a fresh id per call)"
        usage = message.pop("usage")
        message["prompt"] = usage["input_tokens"] + usage["cache_read_input_tokens"]
        message["output_tokens"] = usage["output_tokens"]
    assert a == b


def test_create(client: anthropic.Anthropic, live_server: LiveServer) -> None:
    message = client.messages.create(
        model=live_server.model, max_tokens=8, messages=USER, metadata={"user_id": "u1"}
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == live_server.model
    assert message.id.startswith("msg_")
    assert message.content[0].type == "text"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 8
    assert message.usage.input_tokens > 0
    assert message.usage.cache_read_input_tokens == 0  # a short prompt fills no cache block
    assert message.usage.cache_creation_input_tokens == 0


def test_stream_equals_create(client: anthropic.Anthropic, live_server: LiveServer) -> None:
    """Every event type reaches the SDK, and its final message is the non-streamed one."""
    request: dict[str, Any] = {
        "model": live_server.model,
        "max_tokens": 24,
        "messages": USER,
        "extra_body": GREEDY,
    }
    kinds, streamed = _streamed(client, **request)
    whole = client.messages.create(**request)
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(kinds)
    assert "text" in kinds  # the SDK's own event per text delta
    _same_message(streamed, whole)
    assert _text(streamed) == _text(whole) != ""


def test_the_same_conversation_as_chat(
    client: anthropic.Anthropic, openai_client: OpenAI, live_server: LiveServer
) -> None:
    """System blocks, a multi-turn history and the reply: the tokens OpenAI Chat gives for
    the same conversation (greedy), and count_tokens is the prompt the reply was made of."""
    system: list[TextBlockParam] = [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in Python."},
    ]
    history: list[Any] = [
        {"role": "user", "content": "Name a module."},
        {"role": "assistant", "content": [{"type": "text", "text": "os"}]},
        {"role": "user", "content": [{"type": "text", "text": "And another?"}]},
    ]
    message = client.messages.create(
        model=live_server.model, max_tokens=16, extra_body=GREEDY, system=system, messages=history
    )
    chat = openai_client.chat.completions.create(
        model=live_server.model,
        max_tokens=16,
        temperature=0,
        messages=[
            {"role": "system", "content": [_chat_text(b["text"]) for b in system]},
            {"role": "user", "content": "Name a module."},
            {"role": "assistant", "content": "os"},
            {"role": "user", "content": "And another?"},
        ],
    )
    assert _text(message) == chat.choices[0].message.content
    assert chat.usage is not None and message.usage.input_tokens == chat.usage.prompt_tokens
    count = client.messages.count_tokens(model=live_server.model, system=system, messages=history)
    assert count.input_tokens == message.usage.input_tokens + (
        message.usage.cache_read_input_tokens or 0
    )
    bare = client.messages.count_tokens(model=live_server.model, messages=history)
    assert bare.input_tokens < count.input_tokens


def test_a_final_assistant_message_is_continued(
    client: anthropic.Anthropic, openai_client: OpenAI, live_server: LiveServer
) -> None:
    """Anthropic's prefill: the reply continues the last assistant message, as Chat's
    `continue_final_message` does."""
    messages: list[Any] = [
        {"role": "user", "content": "Write a function."},
        {"role": "assistant", "content": "def main("},
    ]
    message = client.messages.create(
        model=live_server.model, max_tokens=12, extra_body=GREEDY, messages=messages
    )
    chat = openai_client.chat.completions.create(
        model=live_server.model,
        max_tokens=12,
        temperature=0,
        messages=messages,
        extra_body={"add_generation_prompt": False, "continue_final_message": True},
    )
    assert _text(message) == chat.choices[0].message.content


def test_stop_sequences(client: anthropic.Anthropic, live_server: LiveServer) -> None:
    request: dict[str, Any] = {
        "model": live_server.model,
        "max_tokens": 32,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Count to ten."}],
    }
    free = client.messages.create(**request).content[0].text
    assert len(free) > 6, free
    stop = free[3:6]
    cut = free[: free.index(stop)]
    message = client.messages.create(**request, stop_sequences=["\x00never", stop])
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    assert message.content[0].text == cut
    _, streamed = _streamed(client, **request, stop_sequences=[stop])
    _same_message(streamed, message)


def test_count_tokens_is_the_usage(client: anthropic.Anthropic, live_server: LiveServer) -> None:
    """count_tokens == input_tokens on a fresh prompt; with a prompt the prefix cache
    already holds, == input_tokens + cache_read_input_tokens (Anthropic's total)."""
    text = "A fresh prompt: " + "import os, sys, json; " * 60  # > one 128-token cache block
    request: dict[str, Any] = {
        "model": live_server.model,
        "messages": [{"role": "user", "content": text}],
        "tools": TOOLS,
        "tool_choice": {"type": "none"},
    }
    count = client.messages.count_tokens(**request).input_tokens
    first = client.messages.create(**request, max_tokens=2).usage
    assert first.cache_read_input_tokens == 0
    assert count == first.input_tokens
    again = client.messages.create(**request, max_tokens=2).usage
    assert again.cache_read_input_tokens > 0
    assert count == again.input_tokens + again.cache_read_input_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"]
)
def test_forced_tool_use_validates(
    client: anthropic.Anthropic, live_server: LiveServer, choice: dict[str, Any], stream: bool
) -> None:
    """`any` and a named tool: one tool_use block whose input is an object matching the
    tool's input_schema (forced by constrained decoding), stop_reason tool_use; streamed,
    the input_json_delta fragments join into that input."""
    request: dict[str, Any] = {
        "model": live_server.model,
        "max_tokens": 96,
        "extra_body": GREEDY,
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
    }
    if stream:
        with client.messages.stream(**request) as events:
            fragments: dict[int, str] = {}
            for event in events:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    fragments[event.index] = (
                        fragments.get(event.index, "") + event.delta.partial_json
                    )
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    assert message.stop_reason == "tool_use", message
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1, message.content
    use = uses[0]
    schemas = {tool["name"]: tool["input_schema"] for tool in TOOLS}
    if choice["type"] == "tool":
        assert use.name == "get_weather"
    assert isinstance(use.input, dict)
    jsonschema.validate(use.input, schemas[use.name])
    assert use.id
    if stream:
        index = message.content.index(use)
        assert json.loads(fragments[index]) == use.input
        _same_message(message, client.messages.create(**request))


def test_tool_result_round_trip(
    client: anthropic.Anthropic, live_server: LiveServer, openai_client: OpenAI
) -> None:
    """A tool_use from the model, sent back with its tool_result (a string, then blocks
    with is_error): the server takes the history, and renders it as Chat renders the same
    calls and tool answers (count_tokens == /tokenize of the Chat conversation)."""
    forced = client.messages.create(
        model=live_server.model,
        max_tokens=96,
        extra_body=GREEDY,
        messages=USER,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    use = next(block for block in forced.content if block.type == "tool_use")
    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": [block.model_dump() for block in forced.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "12 degrees"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    reply = client.messages.create(
        model=live_server.model, max_tokens=8, messages=history, tools=TOOLS
    )
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    count = client.messages.count_tokens(model=live_server.model, messages=history, tools=TOOLS)
    assert count.input_tokens == reply.usage.input_tokens + (
        reply.usage.cache_read_input_tokens or 0
    )
    chat_tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in TOOLS
    ]
    chat_messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": use.name, "arguments": json.dumps(use.input)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "12 degrees"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    tokenized = httpx.post(
        f"{live_server.base_url}/tokenize",
        json={"model": live_server.model, "messages": chat_messages, "tools": chat_tools},
        timeout=60,
    ).json()
    assert count.input_tokens == tokenized["count"]
    # A result given as blocks, marked as an error, is taken too.
    history[2]["content"][0] = {
        "type": "tool_result",
        "tool_use_id": use.id,
        "is_error": True,
        "content": [{"type": "text", "text": "no such city"}],
    }
    assert client.messages.create(
        model=live_server.model, max_tokens=4, messages=history, tools=TOOLS
    ).content


def _png(color: tuple[int, int, int]) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), color).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_images_on_the_vision_model(vl_server: LiveServer) -> None:
    """A base64 image and a data: URL image are the same image to the model (same
    prompt, same greedy reply); a URL elsewhere is refused, not fetched."""
    data = _png((200, 30, 30))
    with anthropic.Anthropic(base_url=vl_server.base_url, api_key="unused", max_retries=0) as c:
        as_base64 = {"type": "base64", "media_type": "image/png", "data": data}
        as_url = {"type": "url", "url": f"data:image/png;base64,{data}"}
        replies = []
        for source in (as_base64, as_url):
            content: list[Any] = [
                {"type": "image", "source": source},
                {"type": "text", "text": "Describe."},
            ]
            replies.append(
                c.messages.create(
                    model=vl_server.model,
                    max_tokens=6,
                    extra_body=GREEDY,
                    messages=[{"role": "user", "content": content}],
                )
            )
        assert replies[0].content == replies[1].content
        assert replies[0].usage == replies[1].usage
        text_only = c.messages.count_tokens(
            model=vl_server.model, messages=[{"role": "user", "content": "Describe."}]
        )
        assert replies[0].usage.input_tokens > text_only.input_tokens + 1  # the image's pads
        with pytest.raises(anthropic.BadRequestError) as refused:
            c.messages.create(
                model=vl_server.model,
                max_tokens=4,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "url", "url": "http://127.0.0.1:9/x.png"},
                            }
                        ],
                    }
                ],
            )
        assert body_of(refused.value)["error"]["type"] == "invalid_request_error"
        assert "does not fetch" in refused.value.message


def test_errors_are_anthropic_errors(client: anthropic.Anthropic, live_server: LiveServer) -> None:
    """Each mistake reaches the SDK as its exception class, with Anthropic's body."""
    cases: list[tuple[type[anthropic.APIStatusError], str, dict[str, Any]]] = [
        (anthropic.NotFoundError, "not_found_error", {"model": "no-such-model"}),
        (anthropic.BadRequestError, "invalid_request_error", {"extra_body": {"temperature": 3.0}}),
        (anthropic.BadRequestError, "invalid_request_error", {"max_tokens": 5000}),
        (anthropic.BadRequestError, "invalid_request_error", {"stop_sequences": [""]}),
        (
            anthropic.BadRequestError,
            "invalid_request_error",
            {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
        ),
    ]
    for kind, error_type, change in cases:
        request = {"model": live_server.model, "max_tokens": 4, "messages": USER, **change}
        with pytest.raises(kind) as raised:
            client.messages.create(**request)
        body = raised.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == error_type, body
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=USER)
