"""A Messages body -> the conversation core's `Conversation` (`app.protocols.conversation`).

The translation, block by block:

- `system` (a string or text blocks) -> one leading system message, each block a text
  part (the chat template joins parts as it joins a Chat message's); a message of role
  `system` (Claude Code's mid-conversation instructions) -> a system message in place;
- a user message's text and image blocks -> a user message; each `tool_result` block
  -> a `tool` message answering its `tool_use_id` (its text and images; `is_error` has
  no place in a chat template and is accepted only), in the order the blocks come;
- an assistant message's text -> its content, `tool_use` blocks -> its calls (the input
  as JSON text), `thinking` blocks -> its reasoning, `redacted_thinking` dropped (opaque,
  another model's);
- a conversation that ends with an assistant message is continued, not answered
  (Anthropic's prefill: the reply continues that message's text);
- `tools` -> neutral tool specs; `tool_choice` auto/any/tool/none -> "auto"/"required"/
  a named tool/"none"; `disable_parallel_tool_use` -> no parallel calls. Under `any` and
  `tool` a tool is strict unless it says otherwise, so the forced call's input matches
  its `input_schema` (the engine's constrained decoding), as Anthropic promises;
- `thinking` -> the chat template's `enable_thinking` (what reasoning models' templates
  read; others ignore it); what the model thinks comes back as thinking blocks when the
  server has a reasoning parser, and not at all otherwise;
- `stop_sequences`, `temperature`, `top_p`, `top_k` -> sampling, Anthropic's defaults
  (temperature 1, no top_p or top_k cut), held to the limits every protocol shares.

A system text block that is Claude Code's billing header (`x-anthropic-billing-header:
...`, a line its API bills by, with a value that changes from request to request) is
left out: at the very start of the prompt it would defeat the prefix cache on every turn
of a conversation whose prompt is ~20k tokens, and it tells the model nothing.

Every error names the client's field (`messages.2.content.0.source`, `tools`,
`stop_sequences`, ...). Blocking (images are decoded): call it where the plan is built.
"""

from __future__ import annotations

import json
from dataclasses import replace

from app.engine.base import ChatMessage, EngineInfo, ImagePart, SamplingOptions, TextPart
from app.engine.tools import NamedTool, ToolCall, ToolChoice, ToolFields, ToolSpec
from app.engine.validation import Fields
from app.errors import InvalidRequest
from app.protocols.conversation.bound import PromptBound
from app.protocols.conversation.images import PromptImages
from app.protocols.conversation.plan import Conversation
from schemas.anthropic import (
    AnthropicBase64Source,
    AnthropicCountTokensRequest,
    AnthropicImageBlock,
    AnthropicMessage,
    AnthropicMessagesRequest,
    AnthropicRedactedThinkingBlock,
    AnthropicTextBlock,
    AnthropicThinkingBlock,
    AnthropicThinkingDisabled,
    AnthropicThinkingEnabled,
    AnthropicToolChoiceAny,
    AnthropicToolChoiceNone,
    AnthropicToolChoiceTool,
    AnthropicToolResultBlock,
    AnthropicToolUseBlock,
)

FIELDS: Fields = {"prompt": "messages", "stop": "stop_sequences"}
TOOL_FIELDS = ToolFields(tools="tools", tool_choice="tool_choice")
BILLING_HEADER = "x-anthropic-billing-header:"

Part = TextPart | ImagePart


def _image(block: AnthropicImageBlock, images: PromptImages, where: str) -> ImagePart:
    source = block.source
    if isinstance(source, AnthropicBase64Source):
        return ImagePart(images.read(source.data, source.media_type, f"{where}.source"))
    return ImagePart(images.read_url(source.url, f"{where}.source.url"))


def _texts(blocks: str | list[AnthropicTextBlock]) -> tuple[TextPart, ...]:
    """System text, without Claude Code's billing header."""
    if isinstance(blocks, str):
        return () if blocks.startswith(BILLING_HEADER) else (TextPart(blocks),)
    return tuple(TextPart(b.text) for b in blocks if not b.text.startswith(BILLING_HEADER))


def _tool_result(block: AnthropicToolResultBlock, images: PromptImages, where: str) -> ChatMessage:
    parts: list[Part] = []
    if isinstance(block.content, str):
        parts.append(TextPart(block.content))
    for i, item in enumerate(block.content if isinstance(block.content, list) else ()):
        if isinstance(item, AnthropicTextBlock):
            parts.append(TextPart(item.text))
        else:
            parts.append(_image(item, images, f"{where}.content.{i}"))
    if not parts:  # a tool that answered nothing: the template still needs a string
        parts.append(TextPart(""))
    return ChatMessage("tool", tuple(parts), tool_call_id=block.tool_use_id)


def _misplaced(where: str, kind: str, role: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: a {kind} block cannot be in a {role} message", param=where)


def _user(index: int, message: AnthropicMessage, images: PromptImages) -> list[ChatMessage]:
    """A user message: its tool results as tool messages, the rest as user messages, in
    the order the blocks come."""
    if isinstance(message.content, str):
        return [ChatMessage("user", (TextPart(message.content),))]
    out: list[ChatMessage] = []
    parts: list[Part] = []
    for i, block in enumerate(message.content):
        where = f"messages.{index}.content.{i}"
        if isinstance(block, AnthropicTextBlock):
            parts.append(TextPart(block.text))
        elif isinstance(block, AnthropicImageBlock):
            parts.append(_image(block, images, where))
        elif isinstance(block, AnthropicToolResultBlock):
            if parts:
                out.append(ChatMessage("user", tuple(parts)))
                parts = []
            out.append(_tool_result(block, images, where))
        else:
            raise _misplaced(where, block.type, "user")
    if parts:
        out.append(ChatMessage("user", tuple(parts)))
    return out


def _assistant(index: int, message: AnthropicMessage) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage("assistant", (TextPart(message.content),))
    parts: list[Part] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for i, block in enumerate(message.content):
        if isinstance(block, AnthropicTextBlock):
            parts.append(TextPart(block.text))
        elif isinstance(block, AnthropicToolUseBlock):
            calls.append(ToolCall(block.id, block.name, json.dumps(block.input)))
        elif isinstance(block, AnthropicThinkingBlock):
            reasoning.append(block.thinking)
        elif not isinstance(block, AnthropicRedactedThinkingBlock):
            raise _misplaced(f"messages.{index}.content.{i}", block.type, "assistant")
    return ChatMessage(
        "assistant",
        tuple(parts),
        tool_calls=tuple(calls),
        reasoning="".join(reasoning) if reasoning else None,
    )


def _system(index: int, message: AnthropicMessage) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage("system", _texts(message.content))
    texts = []
    for i, block in enumerate(message.content):
        if not isinstance(block, AnthropicTextBlock):
            raise _misplaced(f"messages.{index}.content.{i}", block.type, "system")
        texts.append(block)
    return ChatMessage("system", _texts(texts))


def chat_messages(
    body: AnthropicMessagesRequest | AnthropicCountTokensRequest, info: EngineInfo
) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    images = PromptImages(info)
    if body.system is not None and (system := _texts(body.system)):
        out.append(ChatMessage("system", system))
    for index, message in enumerate(body.messages):
        if message.role == "user":
            out.extend(_user(index, message, images))
        elif message.role == "assistant":
            out.append(_assistant(index, message))
        elif (inline := _system(index, message)).parts:
            out.append(inline)
    return out


def _tool_choice(body: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> ToolChoice | None:
    choice = body.tool_choice
    if choice is None:
        return None
    if isinstance(choice, AnthropicToolChoiceAny):
        return "required"
    if isinstance(choice, AnthropicToolChoiceTool):
        return NamedTool(choice.name)
    if isinstance(choice, AnthropicToolChoiceNone):
        return "none"
    return "auto"


def _tools(
    body: AnthropicMessagesRequest | AnthropicCountTokensRequest, forced: bool
) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            tool.name,
            tool.description,
            tool.input_schema,
            tool.strict if tool.strict is not None else (True if forced else None),
        )
        for tool in body.tools or ()
    )


def _continues(body: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> bool:
    """The conversation ends with an assistant message, which the reply continues."""
    last = body.messages[-1] if body.messages else None
    if last is None or last.role != "assistant":
        return False
    if not isinstance(last.content, str) and any(
        isinstance(block, AnthropicToolUseBlock) for block in last.content
    ):
        where = f"messages.{len(body.messages) - 1}"
        raise InvalidRequest(
            f"{where}: the final assistant message has tool_use blocks; their tool_result "
            "blocks must follow in a user message",
            param=where,
        )
    return True


def conversation(
    body: AnthropicMessagesRequest | AnthropicCountTokensRequest,
    info: EngineInfo,
    *,
    request_id: str,
    lora_name: str | None,
) -> Conversation:
    """`body` as the conversation core takes it (a count_tokens body: its prompt only).
    Blocking (it decodes images)."""
    choice = _tool_choice(body)
    template_kwargs: dict[str, object] = {}
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = not isinstance(
            body.thinking, AnthropicThinkingDisabled
        )
    continues = _continues(body)
    call = Conversation(
        request_id=request_id,
        messages=chat_messages(body, info),
        sampling=SamplingOptions(),
        max_tokens=None,
        fields=FIELDS,
        tools=_tools(body, forced=choice == "required" or isinstance(choice, NamedTool)),
        tool_choice=choice,
        parallel_tool_calls=_parallel(body),
        tool_fields=TOOL_FIELDS,
        add_generation_prompt=not continues,
        continue_final_message=continues,
        template_kwargs=template_kwargs,
        lora_name=lora_name,
    )
    if not isinstance(body, AnthropicMessagesRequest):
        return call
    if (
        isinstance(body.thinking, AnthropicThinkingEnabled)
        and body.thinking.budget_tokens >= body.max_tokens
    ):
        raise InvalidRequest(
            "thinking.budget_tokens must be less than max_tokens", param="thinking.budget_tokens"
        )
    defaults = info.sampling_defaults
    sampling = SamplingOptions(
        temperature=body.temperature if body.temperature is not None else defaults.temperature,
        top_p=body.top_p if body.top_p is not None else defaults.top_p,
        top_k=body.top_k if body.top_k is not None else defaults.top_k,
        min_p=defaults.min_p,
        presence_penalty=defaults.presence_penalty,
        frequency_penalty=defaults.frequency_penalty,
        repetition_penalty=defaults.repetition_penalty,
        stop=tuple(body.stop_sequences or ()),
    )
    return replace(call, sampling=sampling, max_tokens=body.max_tokens)


def _parallel(body: AnthropicMessagesRequest | AnthropicCountTokensRequest) -> bool | None:
    choice = body.tool_choice
    if choice is None or isinstance(choice, AnthropicToolChoiceNone):
        return None
    return False if choice.disable_parallel_tool_use else None


def admission_bound(body: AnthropicMessagesRequest) -> int:
    """Admission's bound of the prompt's tokens, as every chat-shaped API counts it
    (`app.protocols.conversation.bound`)."""
    bound = PromptBound()
    if isinstance(body.system, str):
        bound.text(body.system)
    elif body.system is not None:
        for system in body.system:
            bound.text(system.text)
    for message in body.messages:
        if isinstance(message.content, str):
            bound.text(message.content)
            continue
        for block in message.content:
            if isinstance(block, AnthropicTextBlock):
                bound.text(block.text)
            elif isinstance(block, AnthropicThinkingBlock):
                bound.text(block.thinking)
            elif isinstance(block, AnthropicToolUseBlock):
                bound.call(block.name, block.input)
            elif isinstance(block, AnthropicToolResultBlock):
                if isinstance(block.content, str):
                    bound.text(block.content)
                elif block.content is not None:
                    for part in block.content:
                        if isinstance(part, AnthropicTextBlock):
                            bound.text(part.text)
    for tool in body.tools or ():
        bound.tool(tool.name, tool.description, tool.input_schema)
    return bound.tokens
