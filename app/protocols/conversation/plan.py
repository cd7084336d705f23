"""A conversation -> ONE `ChatPlan`: the prompt's token ids, the engine requests (one per
choice), and how each choice's text is read back (the tool-call parser).

`Conversation` is what every chat-shaped API translates its body onto: neutral messages
(`app.engine.base.ChatMessage`: text, images, tool calls, tool results, system and
developer instructions), neutral tools (`app.engine.tools.ToolSpec`, `ToolChoice`), what
the output must match (`Constraint`), and sampling (`SamplingOptions`, not yet
validated), with the API's own names for its fields so that every error names the
client's field. `plan_conversation` is the one place these become engine requests:

1. the tools are planned by the engine's tool support (which forces `required` and
   named choices with a constraint, may combine an `auto` choice with a response
   format, as `vllm serve` does, and gives the parser that reads calls and, with a
   reasoning parser, reasoning back out of each choice's text); a forced call is never
   cut by the client's stop strings or stop tokens (they could only cut the call);
2. the messages are templated by the model's chat template (`Tokenizer.apply_chat_template`,
   token for token what `vllm serve` renders), and each image's block is widened to the
   pad tokens its vision encoder makes;
3. the prompt must fit the context with the requested output (`max_tokens` None: the
   rest of the context); the sampling options are checked against the shared limits
   (`app.engine.validation`) with the constraint in force;
4. one `GenerationRequest` per choice, choice i seeded with seed + i.

It is blocking (templating, tokenizing, compiling a constraint's grammar, decoding
images happen in steps 1-3): the transport calls it off the event loop. It raises
`app.errors` for the client's mistakes, before any engine request exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from app.engine.base import (
    ChatMessage,
    ChatPrompt,
    EngineInfo,
    GenerationRequest,
    ImagePart,
    PromptImage,
    SamplingOptions,
    Tokenizer,
)
from app.engine.constraints import Constraint
from app.engine.tools import (
    NamedTool,
    ToolCallParser,
    ToolChoice,
    ToolFields,
    ToolPlan,
    ToolSpec,
)
from app.engine.validation import Fields, check_prompt, validate_sampling
from app.errors import InvalidRequest
from app.protocols.conversation.images import expand_image_blocks
from app.protocols.sampling import for_choice, output_limit


@dataclass(frozen=True, slots=True)
class Conversation:
    """One chat-shaped call, in no API's shape. `fields` maps the neutral names
    (`prompt`, `max_tokens`, `logprobs`, ... as `app.engine.validation` knows them) to
    the API's; `prompt` names the messages."""

    request_id: str
    messages: Sequence[ChatMessage]
    sampling: SamplingOptions
    max_tokens: int | None  # None: up to the end of the context
    fields: Fields
    tools: Sequence[ToolSpec] = ()
    tool_choice: ToolChoice | None = None  # None: the default ("auto" with tools)
    parallel_tool_calls: bool | None = None
    tool_fields: ToolFields = field(default_factory=ToolFields)
    constraint: Constraint | None = None
    n: int = 1
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, object] = field(default_factory=dict)
    lora_name: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """What a conversation runs as. `requests[i]` is choice i's; `new_parser()` gives a
    choice its tool-call parser (None: the text is the answer); `named` says the tool
    choice forced one named call."""

    prompt_token_ids: Sequence[int]
    requests: tuple[GenerationRequest, ...]
    new_parser: Callable[[], ToolCallParser] | None = field(default=None, compare=False)
    named: bool = False


def _field(fields: Fields, neutral: str) -> str:
    return fields.get(neutral, neutral)


@dataclass(frozen=True, slots=True)
class TemplatedConversation:
    """A conversation's prompt: its token ids (image blocks widened), its images in
    prompt order, and the tool plan it was rendered with (None: no tools)."""

    prompt_token_ids: list[int]
    images: tuple[PromptImage, ...]
    tool_plan: ToolPlan | None


# What one conversation may hold, so that no build holds the one prompt thread for long:
# the template walks every message and tool, and the tool parser plans every tool. OpenAI
# takes at most 128 tools; 10,000 messages is far past any agent's session (they compact
# long before), at well under a second of templating.
MAX_MESSAGES = 10_000
MAX_TOOLS = 128

# vLLM's words (its serving layer's `_validate_chat_template`), so clients see one message.
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


def template_conversation(
    call: Conversation, info: EngineInfo, tokenizer: Tokenizer
) -> TemplatedConversation:
    """Steps 1 and 2 of the plan: the tools planned and the prompt rendered (what
    /tokenize answers for a conversation). A request's own chat template (in its
    template kwargs, where every API puts it) is refused first, unless the server
    trusts them (`EngineInfo.trust_request_chat_template`): vLLM's renderer would run it."""
    if call.template_kwargs.get("chat_template") is not None and (
        not info.trust_request_chat_template
    ):
        raise InvalidRequest(UNTRUSTED_TEMPLATE)
    messages_field = _field(call.fields, "prompt")
    if len(call.messages) > MAX_MESSAGES:
        raise InvalidRequest(
            f"{messages_field} holds {len(call.messages)} messages; at most {MAX_MESSAGES}",
            param=messages_field,
        )
    if len(call.tools) > MAX_TOOLS:
        raise InvalidRequest(
            f"{call.tool_fields.tools} holds {len(call.tools)} tools; at most {MAX_TOOLS}",
            param=call.tool_fields.tools,
        )
    if not info.has_chat_template:
        raise InvalidRequest("This model has no chat template", param=messages_field)
    if not call.messages:
        raise InvalidRequest(f"{messages_field} must not be empty", param=messages_field)
    if (call.tools or call.tool_choice not in (None, "none")) and info.tools is None:
        raise InvalidRequest("this server's engine takes no tools", param=call.tool_fields.tools)
    if call.tool_choice not in (None, "none") and not call.tools:
        raise InvalidRequest(
            f"{call.tool_fields.tool_choice} needs {call.tool_fields.tools}",
            param=call.tool_fields.tool_choice,
        )
    tool_plan = None
    if info.tools is not None:
        tool_plan = info.tools.plan(
            call.tools,
            call.tool_choice,
            call.parallel_tool_calls,
            call.tool_fields,
            call.constraint,
            call.template_kwargs,
        )
    prompt = ChatPrompt(
        messages=tuple(call.messages),
        tools=tool_plan.template_tools if tool_plan is not None else None,
        add_generation_prompt=call.add_generation_prompt,
        continue_final_message=call.continue_final_message,
        template_kwargs=call.template_kwargs,
    )
    ids = tokenizer.apply_chat_template(prompt)
    ids, images = _with_images(ids, call.messages, info, messages_field)
    return TemplatedConversation(ids, images, tool_plan)


def plan_conversation(call: Conversation, info: EngineInfo, tokenizer: Tokenizer) -> ChatPlan:
    templated = template_conversation(call, info, tokenizer)
    ids, images, tool_plan = templated.prompt_token_ids, templated.images, templated.tool_plan
    max_tokens = output_limit(call.max_tokens, info, len(ids))
    check_prompt(ids, max_tokens, info, call.fields)
    options = replace(call.sampling, max_tokens=max_tokens, constraint=call.constraint)
    if tool_plan is not None:
        if tool_plan.constraint is not None:
            options = replace(options, constraint=tool_plan.constraint)
            if call.tool_choice == "required" or isinstance(call.tool_choice, NamedTool):
                # The forced calls are the whole answer: a stop string or token could only
                # cut one, and the answer would finish without the call it promised.
                options = replace(options, stop=(), stop_token_ids=())
        if tool_plan.skip_special_tokens is not None:
            options = replace(options, skip_special_tokens=tool_plan.skip_special_tokens)
    options = validate_sampling(options, info, call.fields, n=call.n)
    requests = tuple(
        GenerationRequest(
            request_id=f"{call.request_id}-{choice}",
            prompt_token_ids=ids,
            sampling=for_choice(options, choice),
            lora_name=call.lora_name,
            priority=call.priority,
            images=images,
        )
        for choice in range(call.n)
    )
    return ChatPlan(
        prompt_token_ids=ids,
        requests=requests,
        new_parser=tool_plan.new_parser if tool_plan is not None else None,
        named=isinstance(call.tool_choice, NamedTool),
    )


def _with_images(
    ids: list[int], messages: Sequence[ChatMessage], info: EngineInfo, param: str
) -> tuple[list[int], tuple[PromptImage, ...]]:
    images = [part.image for m in messages for part in m.parts if isinstance(part, ImagePart)]
    if not images:
        return ids, ()
    return expand_image_blocks(ids, images, info.require_vision(param), param)
