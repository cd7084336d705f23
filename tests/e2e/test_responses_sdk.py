"""The Responses API through the `openai` SDK, unchanged, against the live server (real
vLLM, tiny model): create, the stream helpers (every event type), parse, forced strict
tools, the function_call_output round trip, previous_response_id, retrieve and replay,
input_items, delete, unknown ids and models.

How these fail: the SDK's own stream accumulator raises on an event out of order or an
item id that changes between the stream and the final response; the checks below
compare the streamed deltas with the final text and arguments, the prompt the server
rendered with what the chat route renders for the same conversation (`/tokenize`), and
the arguments with their schemas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import BaseModel, Field

from tests.conftest import LiveServer
from tests.error_bodies import body_of
from tests.response_items import role_of, text_of

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "get_time", "parameters": TIME, "strict": True},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
EVERY_EVENT = {
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
}


class Inner(BaseModel):
    ok: bool
    kind: Literal["x", "y"]


class Thing(BaseModel):
    colour: Literal["red", "green", "blue"]
    code: str = Field(pattern=r"^[a-z]{2}-[0-9]{2}$")
    inner: Inner


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0)


def _chat_prompt_tokens(
    live_server: LiveServer, messages: list[dict[str, Any]], **extra: Any
) -> int:
    body = {"model": live_server.model, "messages": messages, **extra}
    answer = httpx.post(f"{live_server.base_url}/tokenize", json=body, timeout=60)
    return int(answer.json()["count"])


def test_create_is_the_chat_answer_for_the_same_conversation(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    """Greedy: the same prompt the chat route renders, and the same text."""
    response = client.responses.create(
        model=live_server.model,
        instructions="be brief",
        input="hi there",
        max_output_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ]
    chat = client.chat.completions.create(
        model=live_server.model,
        messages=messages,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == chat.choices[0].message.content
    usage = response.usage
    assert usage is not None and usage.output_tokens == 8
    assert usage.input_tokens == _chat_prompt_tokens(live_server, messages)
    assert usage.total_tokens == usage.input_tokens + 8
    assert usage.input_tokens_details.cached_tokens >= 0


def test_stream_sends_every_event_and_adds_up(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    with client.responses.stream(
        model=live_server.model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "count"}]}],
        max_output_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    # Cut by max_output_tokens: the stream ends as OpenAI ends it then, with
    # response.incomplete (the SDK's get_final_response() wants response.completed).
    last = events[-1]
    assert last.type == "response.incomplete", last
    final = last.response
    assert set(kinds) >= EVERY_EVENT
    assert kinds[0] == "response.created" and kinds[1] == "response.in_progress"
    assert kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2
    text = "".join(e.delta for e in deltas)
    assert text == final.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == text
    (message,) = final.output
    assert {e.item_id for e in deltas} == {done.item_id} == {message.id}
    whole = client.responses.create(
        model=live_server.model,
        input="count",
        max_output_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.output_text == text


def test_a_completed_stream_ends_with_response_completed(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    with client.responses.stream(
        model=live_server.model,
        input="hi",
        max_output_tokens=200,
        text={
            "format": {
                "type": "json_schema",
                "name": "thing",
                "schema": Thing.model_json_schema(),
                "strict": True,
            }
        },
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed"
    assert final.status == "completed"
    Thing.model_validate_json(final.output_text)


def test_parse_returns_a_parsed_pydantic_object(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    for seed in range(3):
        parsed = client.responses.parse(
            model=live_server.model,
            input="Describe a thing as JSON.",
            text_format=Thing,
            max_output_tokens=200,
            extra_body={"seed": seed},
        )
        assert isinstance(parsed.output_parsed, Thing), parsed.output_text


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [("required", tuple(SCHEMAS)), ({"type": "function", "name": "get_time"}, ("get_time",))],
)
def test_forced_strict_tools_validate(
    client: openai.OpenAI,
    live_server: LiveServer,
    tool_choice: Any,
    names: tuple[str, ...],
) -> None:
    for seed in range(3):
        response = client.responses.create(
            model=live_server.model,
            input="What is the weather in Paris?",
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_output_tokens=200,
            extra_body={"seed": seed},
        )
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1, response.output
        assert calls[0].name in names and calls[0].call_id
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])
        assert response.status == "completed"


def test_a_streamed_call_adds_up_through_the_sdk_helpers(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    with client.responses.stream(
        model=live_server.model,
        input="Weather?",
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
        extra_body={"seed": 7},
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    calls = [item for item in final.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == calls[0].arguments
    assert {done.item_id} == {c.id for c in calls}
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_auto_reads_a_hermes_call_as_a_function_call_item(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    """The model's own `<tool_call>` text becomes a function_call item, never output_text
    (vllm serve leaks it into the text). A regex steers the random model to write it."""
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}'
    text = f"<tool_call>\n{call}\n</tool_call>"
    regex = "".join("\\" + c if c in ".{}[]()*+?|^$\\" else c for c in "Sure. " + text)
    kwargs: dict[str, Any] = dict(
        model=live_server.model,
        input="Weather in Oslo?",
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}],
        tool_choice="auto",
        max_output_tokens=300,
        extra_body={"structured_outputs": {"regex": regex}},
    )
    response = client.responses.create(**kwargs)
    kinds = [item.type for item in response.output]
    assert kinds == ["message", "function_call"], response.output
    assert response.output_text.strip() == "Sure."
    call, streamed_call = response.output[1], None
    assert call.type == "function_call", call
    assert json.loads(call.arguments) == {"city": "Oslo", "unit": "c"}
    with client.responses.stream(**kwargs) as stream:
        list(stream)
        streamed = stream.get_final_response()
    assert [item.type for item in streamed.output] == kinds
    assert streamed.output_text == response.output_text
    streamed_call = streamed.output[1]
    assert streamed_call.type == "function_call" and streamed_call.arguments == call.arguments


def test_function_call_output_round_trip(client: openai.OpenAI, live_server: LiveServer) -> None:
    first = client.responses.create(
        model=live_server.model,
        input="What is the weather in Paris?",
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
        extra_body={"seed": 1},
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    answer: FunctionCallOutput = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": "sunny, 21",
    }
    # Continued from the stored response ...
    second = client.responses.create(
        model=live_server.model,
        previous_response_id=first.id,
        input=[answer],
        tools=TOOLS,
        max_output_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    # ... and with the whole conversation sent again, unstored: the same prompt.
    again = client.responses.create(
        model=live_server.model,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            answer,
        ],
        tools=TOOLS,
        max_output_tokens=6,
        temperature=0,
        store=False,
        extra_body={"ignore_eos": True},
    )
    assert second.usage is not None and again.usage is not None
    assert second.usage.input_tokens == again.usage.input_tokens
    assert second.output_text == again.output_text
    chat_tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "parameters": t["parameters"], "strict": True},
        }
        for t in TOOLS
    ]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21"},
    ]
    assert second.usage.input_tokens == _chat_prompt_tokens(live_server, messages, tools=chat_tools)
    items = client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["function_call_output"]


def test_previous_response_id_continues_the_conversation(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    first = client.responses.create(
        model=live_server.model,
        instructions="not carried over",
        input="one",
        max_output_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    second = client.responses.create(
        model=live_server.model,
        previous_response_id=first.id,
        input="two",
        max_output_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert second.previous_response_id == first.id
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "two"},
    ]
    assert second.usage is not None
    assert second.usage.input_tokens == _chat_prompt_tokens(live_server, messages)
    # A third turn carries both earlier turns.
    third = client.responses.create(
        model=live_server.model, previous_response_id=second.id, input="three", max_output_tokens=2
    )
    messages += [
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "three"},
    ]
    assert third.usage is not None
    assert third.usage.input_tokens == _chat_prompt_tokens(live_server, messages)


def test_retrieve_replay_input_items_and_delete(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    created = client.responses.create(
        model=live_server.model,
        input=[
            {"role": "developer", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "user", "content": [{"type": "input_text", "text": "c"}]},
        ],
        max_output_tokens=6,
        metadata={"k": "v"},
    )
    got = client.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()
    assert got.metadata == {"k": "v"}
    # Replayed as a stream: the same items, the same text.
    events = list(client.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        created.output_text
    )
    last = events[-1]  # completed, or incomplete where max_output_tokens cut it
    assert isinstance(last, ResponseCompletedEvent | ResponseIncompleteEvent), last
    assert last.response.output == created.output
    later = list(client.responses.retrieve(created.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in later] == list(range(4, len(events)))
    # input_items: newest first by default, paginated.
    page = client.responses.input_items.list(created.id, limit=2)
    texts = [text_of(item) for item in page.data]
    assert texts == ["c", "b"] and page.has_more
    # The page's `last_id` (not in the SDK's type: kept as an extra field) is the cursor.
    last_id = (page.model_extra or {})["last_id"]
    rest = client.responses.input_items.list(created.id, after=last_id, limit=2)
    assert [text_of(item) for item in rest.data] == ["a"] and not rest.has_more
    ascending = client.responses.input_items.list(created.id, order="asc")
    assert [role_of(item) for item in ascending.data] == ["developer", "user", "user"]
    assert all(item.id for item in ascending.data)
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_unstored_responses_are_not_kept(client: openai.OpenAI, live_server: LiveServer) -> None:
    response = client.responses.create(
        model=live_server.model, input="x", max_output_tokens=2, store=False
    )
    assert (response.model_extra or {})["store"] is False  # not in the SDK's type
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_logprobs_are_included_when_asked(client: openai.OpenAI, live_server: LiveServer) -> None:
    response = client.responses.create(
        model=live_server.model,
        input="x",
        max_output_tokens=4,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    message = response.output[0]
    assert message.type == "message" and message.content[0].type == "output_text"
    logprobs = message.content[0].logprobs
    assert logprobs is not None and len(logprobs) == 4
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in logprobs)
    assert "".join(lp.token for lp in logprobs) == response.output_text


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c, m: c.responses.create(model="no-such-model", input="x"), "model"),
        (
            lambda c, m: c.responses.create(model=m, input="x", previous_response_id="resp_nope"),
            "previous_response_id",
        ),
        (lambda c, m: c.responses.retrieve("resp_nope"), "response_id"),
        (lambda c, m: c.responses.input_items.list("resp_nope"), "response_id"),
        (lambda c, m: c.responses.cancel("resp_nope"), "response_id"),
    ],
)
def test_unknown_models_and_ids_are_404(
    client: openai.OpenAI,
    live_server: LiveServer,
    call: Callable[[openai.OpenAI, str], object],
    param: str,
) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        call(client, live_server.model)
    assert body_of(raised.value)["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 5000}, "max_output_tokens"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{"}]}, "input.0.call_id"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"background": True, "store": False}, "background"),
        ({"include": ["everything"]}, "include"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    live_server: LiveServer, extra: dict[str, Any], param: str
) -> None:
    body = {"model": live_server.model, "input": "x", "max_output_tokens": 4, **extra}
    answer = httpx.post(f"{live_server.base_url}/v1/responses", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
