"""Anthropic Messages request bodies as pydantic models: the wire contract of
/v1/messages and /v1/messages/count_tokens.

Fields follow Anthropic's API reference and the anthropic SDK's request types. What
the server cannot serve is refused by type here (a content block, image source, tool
or tool choice of another `type` is a 400 naming the field); what changes nothing for a
self-hosted model is accepted and ignored: `cache_control` (the prefix cache works
without being asked), `metadata`, `citations`, a thinking block's `signature`, and
unknown fields (Claude Code sends beta fields such as `context_management` and
`output_config`). Messages may have the role `system` besides `user` and `assistant`:
Claude Code sends its mid-conversation instructions that way, as `vllm serve` accepts.

Types are checked here; the sampling limits are the ones every protocol shares
(`app.engine.validation`), and the translation to a conversation
(`app.protocols.anthropic.messages`) checks the rules that span fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


CacheControl = dict[str, Any] | None


class AnthropicTextBlock(_Body):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None


class AnthropicBase64Source(_Body):
    type: Literal["base64"]
    media_type: str
    data: str


class AnthropicUrlSource(_Body):
    type: Literal["url"]
    url: str  # inline only: data:<mime>;base64,<data> (the server fetches nothing)


ImageSource = Annotated[AnthropicBase64Source | AnthropicUrlSource, Field(discriminator="type")]


class AnthropicImageBlock(_Body):
    type: Literal["image"]
    source: ImageSource
    cache_control: CacheControl = None


class AnthropicToolUseBlock(_Body):
    """A call the assistant made, given back in the history."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


ToolResultPart = Annotated[AnthropicTextBlock | AnthropicImageBlock, Field(discriminator="type")]


class AnthropicToolResultBlock(_Body):
    """The answer to a call, in a user message."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None


class AnthropicThinkingBlock(_Body):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class AnthropicRedactedThinkingBlock(_Body):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    AnthropicTextBlock
    | AnthropicImageBlock
    | AnthropicToolUseBlock
    | AnthropicToolResultBlock
    | AnthropicThinkingBlock
    | AnthropicRedactedThinkingBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(_Body):
    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]


class AnthropicTool(_Body):
    """A client tool. Anthropic's server tools (`web_search_...`, `bash_...`, ...) have
    another `type` and are refused: nothing here runs them."""

    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: CacheControl = None


class AnthropicToolChoiceAuto(_Body):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class AnthropicToolChoiceAny(_Body):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class AnthropicToolChoiceTool(_Body):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class AnthropicToolChoiceNone(_Body):
    type: Literal["none"]


ToolChoice = Annotated[
    AnthropicToolChoiceAuto
    | AnthropicToolChoiceAny
    | AnthropicToolChoiceTool
    | AnthropicToolChoiceNone,
    Field(discriminator="type"),
]


class AnthropicThinkingEnabled(_Body):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1024)]


class AnthropicThinkingDisabled(_Body):
    type: Literal["disabled"]


class AnthropicThinkingAdaptive(_Body):
    type: Literal["adaptive"]


Thinking = Annotated[
    AnthropicThinkingEnabled | AnthropicThinkingDisabled | AnthropicThinkingAdaptive,
    Field(discriminator="type"),
]


class _Conversation(_Body):
    """What a Messages call and its token count share: the prompt."""

    model: Annotated[str, Field(min_length=1)]
    messages: list[AnthropicMessage]
    system: str | list[AnthropicTextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class AnthropicMessagesRequest(_Conversation):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None


class AnthropicCountTokensRequest(_Conversation):
    pass
