"""Admission's bound of a chat-shaped body's prompt tokens (`app.protocols.conversation.bound`),
one rule for Chat, Responses and Messages: never below the prompt the call then builds
(here on the fake engine, whose template writes every message's text, one token a
character), whatever the body holds (tool calls and results, reasoning, a compaction's
summary); and a piece the APIs share (a tool, a call) counted the same by each. Fails if
an API's listing skips a piece its prompt holds (the Responses listing once skipped
compaction summaries) or counts a tool in a shape of its own."""

from __future__ import annotations

from typing import Any

import httpx

from app.config import Settings
from app.main import create_app
from app.protocols.anthropic.messages import admission_bound
from app.protocols.openai.chat import prompt_bound as chat_bound
from app.protocols.openai.responses.items import compaction_item
from app.protocols.openai.responses.request import prompt_bound as responses_bound
from schemas.anthropic import AnthropicMessagesRequest
from schemas.openai import ChatCompletionRequest
from schemas.openai_responses import ResponsesRequest
from tests.fake_engine import FakeEngine

SUMMARY = "the user asked for a long story about a lighthouse keeper " * 8
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Zürich"]}}}
ARGUMENTS = '{"city": "Bern"}'


def _chat(tools: bool = True) -> dict[str, Any]:
    return {
        "model": "fake",
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning": "the tool knows",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": ARGUMENTS},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 degrees"},
        ],
        **(
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "weather",
                            "description": "today's weather",
                            "parameters": PARAMETERS,
                        },
                    }
                ]
            }
            if tools
            else {}
        ),
    }


def _responses(tools: bool = True) -> dict[str, Any]:
    return {
        "model": "fake",
        "max_output_tokens": 1,
        "store": False,
        "instructions": "be brief",
        "input": [
            compaction_item(SUMMARY),
            {"type": "message", "role": "user", "content": "weather?"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "the tool knows"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": ARGUMENTS},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 degrees"},
        ],
        **(
            {
                "tools": [
                    {
                        "type": "function",
                        "name": "weather",
                        "description": "today's weather",
                        "parameters": PARAMETERS,
                    }
                ]
            }
            if tools
            else {}
        ),
    }


def _messages(tools: bool = True) -> dict[str, Any]:
    return {
        "model": "fake",
        "max_tokens": 1,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "the tool knows", "signature": "s"},
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "weather",
                        "input": {"city": "Bern"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "sunny, 21 degrees"}
                ],
            },
        ],
        **(
            {
                "tools": [
                    {
                        "name": "weather",
                        "description": "today's weather",
                        "input_schema": PARAMETERS,
                    }
                ]
            }
            if tools
            else {}
        ),
    }


async def _prompt_tokens(path: str, body: dict[str, Any]) -> int:
    """The prompt the call built on the fake engine: its token count."""
    engine = FakeEngine(max_model_len=4096)
    app = create_app(Settings(model="fake"), engine=engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
        answer = await client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    [request] = engine.requests
    assert request.prompt_token_ids is not None
    return len(request.prompt_token_ids)


async def test_the_bound_holds_every_piece_of_the_prompt_built() -> None:
    chat = await _prompt_tokens("/v1/chat/completions", _chat(tools=False))
    assert chat_bound(ChatCompletionRequest.model_validate(_chat(tools=False))) >= chat
    responses = await _prompt_tokens("/v1/responses", _responses(tools=False))
    assert responses > len(SUMMARY)  # the summary is in the prompt
    bound = responses_bound(ResponsesRequest.model_validate(_responses(tools=False)))
    assert bound >= responses
    messages = await _prompt_tokens("/v1/messages", _messages(tools=False))
    assert (
        admission_bound(AnthropicMessagesRequest.model_validate(_messages(tools=False))) >= messages
    )


def test_a_tool_counts_the_same_in_every_api() -> None:
    def added(bound: Any, model: Any, body: Any) -> int:
        return int(
            bound(model.model_validate(body())) - bound(model.model_validate(body(tools=False)))
        )

    chat = added(chat_bound, ChatCompletionRequest, _chat)
    responses = added(responses_bound, ResponsesRequest, _responses)
    messages = added(admission_bound, AnthropicMessagesRequest, _messages)
    assert chat == responses == messages > len("today's weather")


def test_a_call_counts_the_same_in_every_api() -> None:
    """The call `weather(city=Bern)`: Messages gives its arguments as an object, which
    its translation writes as the JSON text Chat and Responses carry."""

    def without_call(body: dict[str, Any], api: str) -> dict[str, Any]:
        if api == "chat":
            body["messages"][2]["tool_calls"] = []
        elif api == "responses":
            body["input"] = [i for i in body["input"] if i.get("type") != "function_call"]
        else:
            body["messages"][1]["content"] = body["messages"][1]["content"][:1]
        return body

    chat = chat_bound(ChatCompletionRequest.model_validate(_chat())) - chat_bound(
        ChatCompletionRequest.model_validate(without_call(_chat(), "chat"))
    )
    responses = responses_bound(ResponsesRequest.model_validate(_responses())) - responses_bound(
        ResponsesRequest.model_validate(without_call(_responses(), "responses"))
    )
    messages = admission_bound(
        AnthropicMessagesRequest.model_validate(_messages())
    ) - admission_bound(
        AnthropicMessagesRequest.model_validate(without_call(_messages(), "messages"))
    )
    assert chat == responses == messages


def test_a_body_the_translation_refuses_is_still_bounded() -> None:
    """Listing never raises: a malformed tool or call is refused after admission."""
    body = _chat()
    body["tools"] = [{"type": "function", "function": "not an object"}, {}]
    body["messages"][2]["tool_calls"] = [
        {"function": None},
        {"function": {"arguments": {"n": 10**30}}},
    ]
    assert chat_bound(ChatCompletionRequest.model_validate(body)) > 0
    item = {"type": "compaction", "encrypted_content": "made elsewhere"}
    responses = _responses()
    responses["input"] = [item, {"role": "user", "content": 5}]
    responses["tools"] = [{"type": "function"}]
    assert responses_bound(ResponsesRequest.model_validate(responses)) > 0
