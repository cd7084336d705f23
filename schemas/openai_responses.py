"""The OpenAI Responses API as pydantic models: the request body of POST /v1/responses
(validated here: types only), and the response objects, items and stream events that
/openapi.json documents.

Request: fields as OpenAI names them plus the sampling extras `vllm serve` accepts on its
Responses route (top_k, min_p, seed, penalties, stop, ignore_eos, priority, ...). Unknown
fields are ignored, as vLLM does. `input` items and `tools` are kept as JSON objects here
and read by hand in `app.protocols.openai.responses.items` and `.tools`, so that an error
names the exact item and field (`input.2.call_id`) rather than a pydantic union's every
branch; their documented schemas are attached below.

Responses and events: documentation only. The cores build their answers as dicts (no
model on the per-token path) and the tests hold the two together. Objects stay open
(extra keys allowed), as OpenAI's own are.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from schemas.openai import VllmSampling


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {
        "type": {"enum": ["input_text", "output_text"]},
        "text": {"type": "string"},
    },
}
_IMAGE_PART = {
    "type": "object",
    "required": ["type", "image_url"],
    "properties": {
        "type": {"const": "input_image"},
        "image_url": {"type": "string", "description": "data:<mime>;base64,<data> only"},
        "detail": {"enum": ["low", "high", "auto"]},
    },
}
_ITEM_SCHEMA: dict[str, Any] = {
    "description": "An input item: a message (`type` may be omitted), a function call the "
    "model made, its output, or a reasoning item given back.",
    "oneOf": [
        {
            "type": "object",
            "title": "message",
            "required": ["role", "content"],
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["user", "assistant", "system", "developer"]},
                "content": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}},
                    ]
                },
            },
        },
        {
            "type": "object",
            "title": "function_call",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"const": "function_call"},
                "id": {"type": "string"},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string"},
            },
        },
        {
            "type": "object",
            "title": "function_call_output",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},
                "output": {"anyOf": [{"type": "string"}, {"type": "array"}]},
            },
        },
        {
            "type": "object",
            "title": "reasoning",
            "required": ["type"],
            "properties": {"type": {"const": "reasoning"}, "content": {"type": "array"}},
        },
    ],
}
_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A function tool (the only kind served).",
    "required": ["type", "name"],
    "properties": {
        "type": {"const": "function"},
        "name": {"type": "string"},
        "description": {"type": ["string", "null"]},
        "parameters": {"type": ["object", "null"]},
        "strict": {"type": ["boolean", "null"]},
    },
}

InputItem = Annotated[dict[str, Any], WithJsonSchema(_ITEM_SCHEMA)]
ToolParam = Annotated[dict[str, Any], WithJsonSchema(_TOOL_SCHEMA)]


class ResponsesTextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponsesTextConfig(_Body):
    format: ResponsesTextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(VllmSampling):
    """POST /v1/responses: the sampling fields (with `vllm serve`'s extras) as every
    OpenAI API here takes them, and the Responses API's own."""

    model: str | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    tools: list[ToolParam] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesTextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # echoed: vLLM's prefix cache needs no key
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    reasoning: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    # Refused when set: this server has no stored prompts.
    prompt: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None  # an id, or {"id": ...}
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class CompactRequest(_Body):
    """POST /v1/responses/compact: the conversation to compact (the stored one of
    `previous_response_id`, then `input`), and the model that writes its summary."""

    model: str
    input: str | list[InputItem] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    prompt_cache_key: str | None = None  # taken, as on POST /v1/responses: nothing to key
    # An extra (OpenAI's compact takes none): the summary's bound; none, the context's end.
    max_output_tokens: int | None = None


# -- what the server answers (documentation) ---------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ResponsesTopLogprob(_Open):
    token: str
    logprob: float
    bytes: list[int]


class ResponsesLogprob(ResponsesTopLogprob):
    top_logprobs: list[ResponsesTopLogprob]


class ResponsesOutputText(_Open):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]]
    logprobs: list[ResponsesLogprob] | None = None


class ResponsesOutputMessage(_Open):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponsesOutputText]


class ResponsesFunctionCall(_Open):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ResponsesReasoningText(_Open):
    type: Literal["reasoning_text"]
    text: str


class ResponsesReasoning(_Open):
    type: Literal["reasoning"]
    id: str
    summary: list[dict[str, Any]]
    content: list[ResponsesReasoningText] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


ResponsesOutputItem = Annotated[
    ResponsesOutputMessage | ResponsesFunctionCall | ResponsesReasoning, Field(discriminator="type")
]


class ResponsesInputTokensDetails(_Open):
    cached_tokens: int


class ResponsesOutputTokensDetails(_Open):
    reasoning_tokens: int


class ResponseUsage(_Open):
    input_tokens: int
    input_tokens_details: ResponsesInputTokensDetails
    output_tokens: int
    output_tokens_details: ResponsesOutputTokensDetails
    total_tokens: int


class ResponseErrorBody(_Open):
    code: str
    message: str


class ResponsesIncompleteDetails(_Open):
    reason: str


class ResponseObject(_Open):
    """A response object: POST /v1/responses, GET /v1/responses/{id}, and inside the
    lifecycle events of a stream."""

    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    model: str
    output: list[ResponsesOutputItem]
    error: ResponseErrorBody | None
    incomplete_details: ResponsesIncompleteDetails | None
    instructions: str | None
    metadata: dict[str, str] | None
    parallel_tool_calls: bool
    temperature: float | None
    top_p: float | None
    presence_penalty: float
    frequency_penalty: float
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    max_output_tokens: int | None
    previous_response_id: str | None
    store: bool
    background: bool
    text: dict[str, Any]
    truncation: str
    usage: ResponseUsage | None
    user: str | None
    safety_identifier: str | None
    prompt_cache_key: str | None


class ResponsesCompaction(_Open):
    type: Literal["compaction"]
    id: str
    encrypted_content: str


class CompactedResponse(_Open):
    """POST /v1/responses/compact: the conversation's user messages as they were, then
    one `compaction` item standing for the rest (give them back as `input`)."""

    id: str
    object: Literal["response.compaction"]
    created_at: int
    output: list[dict[str, Any]]
    usage: ResponseUsage


class ResponsesDeleted(_Open):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class ResponsesInputItemList(_Open):
    """GET /v1/responses/{id}/input_items: the items the response was given as `input`
    (each with an id), a page at a time."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class _Event(_Open):
    sequence_number: int


class ResponsesLifecycleEvent(_Event):
    type: Literal[
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: ResponseObject


class ResponsesItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: ResponsesOutputItem


class ResponsesContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: ResponsesOutputText | ResponsesReasoningText


class ResponsesTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta", "response.reasoning_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[ResponsesLogprob] | None = None


class ResponsesTextDoneEvent(_Event):
    type: Literal["response.output_text.done", "response.reasoning_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[ResponsesLogprob] | None = None


class ResponsesArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str


class ResponsesArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    name: str
    arguments: str


class ResponsesErrorEvent(_Event):
    """An error after the stream started (then `response.failed`)."""

    type: Literal["error"]
    code: str | None
    message: str
    param: str | None
    error: dict[str, Any]  # the same with the error's `type` (the Open Responses spec's shape)


STREAM_EVENTS: tuple[type[BaseModel], ...] = (
    ResponsesLifecycleEvent,
    ResponsesItemEvent,
    ResponsesContentPartEvent,
    ResponsesTextDeltaEvent,
    ResponsesTextDoneEvent,
    ResponsesArgumentsDeltaEvent,
    ResponsesArgumentsDoneEvent,
    ResponsesErrorEvent,
)
