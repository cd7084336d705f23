"""Anthropic Messages response bodies and stream events, as pydantic models: what
/openapi.json documents for /v1/messages and /v1/messages/count_tokens. Documentation
only: the server encodes its answers directly (`app.protocols.anthropic`), and tests
hold them to the anthropic SDK's own types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class AnthropicErrorDetail(BaseModel):
    type: Literal[
        "invalid_request_error",
        "authentication_error",
        "not_found_error",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    ]
    message: str


class AnthropicErrorResponse(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


class AnthropicUsage(BaseModel):
    input_tokens: int  # the prompt's tokens the prefix cache did not hold
    output_tokens: int
    cache_read_input_tokens: int  # the prompt's tokens the prefix cache held
    cache_creation_input_tokens: int  # always 0: vLLM's prefix cache fills itself


class AnthropicTextOut(BaseModel):
    type: Literal["text"]
    text: str


class AnthropicToolUseOut(BaseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: Any  # the call's arguments (an object, matching input_schema when forced)


class AnthropicThinkingOut(BaseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


ContentOut = Annotated[
    AnthropicTextOut | AnthropicToolUseOut | AnthropicThinkingOut, Field(discriminator="type")
]

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicMessageOut(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentOut]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage


class AnthropicCountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicMessageStart(BaseModel):
    type: Literal["message_start"]
    message: AnthropicMessageOut


class AnthropicContentBlockStart(BaseModel):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentOut


class AnthropicTextDelta(BaseModel):
    type: Literal["text_delta"]
    text: str


class AnthropicInputJsonDelta(BaseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class AnthropicThinkingDelta(BaseModel):
    type: Literal["thinking_delta"]
    thinking: str


class AnthropicContentBlockDelta(BaseModel):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[
        AnthropicTextDelta | AnthropicInputJsonDelta | AnthropicThinkingDelta,
        Field(discriminator="type"),
    ]


class AnthropicContentBlockStop(BaseModel):
    type: Literal["content_block_stop"]
    index: int


class AnthropicStopDelta(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class AnthropicMessageDelta(BaseModel):
    type: Literal["message_delta"]
    delta: AnthropicStopDelta
    usage: AnthropicUsage


class AnthropicMessageStop(BaseModel):
    type: Literal["message_stop"]


class AnthropicPing(BaseModel):
    type: Literal["ping"]


STREAM_EVENTS: tuple[type[BaseModel], ...] = (
    AnthropicMessageStart,
    AnthropicContentBlockStart,
    AnthropicContentBlockDelta,
    AnthropicContentBlockStop,
    AnthropicMessageDelta,
    AnthropicMessageStop,
    AnthropicPing,
    AnthropicErrorResponse,
)
