"""POST /v1/responses' body -> the conversation core's `Conversation`.

What the Responses API adds to a chat call is read here and nowhere else:

- the conversation is the stored context of `previous_response_id` (its history, its
  input and its output, `StoredResponse.context()`) or the items of `conversation` (the
  Conversations API's; the two exclusive, and an input item's id not one the
  conversation holds), then this body's `input`; the
  previous response's `instructions` are not carried over (OpenAI's rule), this body's
  go first as a system message;
- a last input item that is an assistant message is continued, not answered (as `vllm
  serve` does: the template gets `continue_final_message`); a `function_call_output`
  answers a `function_call` that comes before it, or the call is refused;
- `text.format` (`text`, `json_object`, `json_schema`) is the output constraint (vLLM's
  `structured_outputs` extra when the format is text); `include:
  ["message.output_text.logprobs"]` asks for logprobs, `top_logprobs` for alternatives;
- sampling with OpenAI's defaults and the extras `vllm serve` takes, every error naming
  the Responses field (`max_output_tokens`, `top_logprobs`, `input`).

`truncation: "auto"` is applied by the exchange (it needs the rendered length): the oldest
items of the conversation are dropped until it fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from app.engine.base import ChatMessage, EngineInfo, SamplingDefaults, SamplingOptions, TextPart
from app.engine.constraints import (
    Constraint,
    json_constraint,
    logit_bias_pairs,
    parse_constraint,
)
from app.errors import InvalidRequest
from app.protocols.conversation.bound import PromptBound
from app.protocols.conversation.plan import Conversation
from app.protocols.openai.responses.items import Item, bound_item, messages
from app.protocols.openai.responses.tools import tool_choice, tool_specs
from app.protocols.openai.sampling import sampling_fields
from schemas.openai_responses import ResponsesRequest

LOGPROBS = "message.output_text.logprobs"
# What OpenAI lets `include` name. Only logprobs mean anything here: the others concern
# hosted tools, images fetched by URL or encrypted reasoning, none of which this server
# has, so asking for them changes nothing (the Codex CLI asks for encrypted reasoning).
INCLUDABLE = (
    LOGPROBS,
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
)


def prompt_bound(body: ResponsesRequest) -> int:
    """Admission's bound of this body's prompt tokens, as every chat-shaped API counts it
    (`app.protocols.conversation.bound`); the stored turns it continues are counted once
    read, after admission."""
    bound = PromptBound()
    bound.text(body.instructions)
    if isinstance(body.input, str):
        bound.text(body.input)
    else:
        for item in body.input or ():
            bound_item(bound, item)
    for tool in body.tools or ():
        if isinstance(tool, dict):
            bound.tool(tool.get("name"), tool.get("description"), tool.get("parameters"))
    return bound.tokens


FIELDS = {"prompt": "input", "max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}
MAX_METADATA = 16


@dataclass(frozen=True, slots=True)
class Translated:
    """A body read: the conversation to plan, and how many leading messages `truncation:
    "auto"` may drop (the instructions are never dropped)."""

    conversation: Conversation
    first_droppable: int
    truncate: bool
    namespaces: Mapping[str, str]  # a tool's namespace, for the tools that are in one


def _check(body: ResponsesRequest) -> None:
    if body.prompt is not None:
        raise InvalidRequest("stored prompts are not served here", param="prompt")
    if body.conversation is not None and body.previous_response_id is not None:
        raise InvalidRequest(
            "conversation and previous_response_id cannot both be given", param="conversation"
        )
    if body.background and not body.store:
        raise InvalidRequest(
            "background responses must be stored (store: true)", param="background"
        )
    for i, name in enumerate(body.include or ()):
        if name not in INCLUDABLE:
            raise InvalidRequest(
                f"include.{i}: {name!r} is not one of {', '.join(INCLUDABLE)}", param="include"
            )
    check_metadata(body.metadata)


def check_metadata(metadata: Mapping[str, str] | None) -> None:
    """OpenAI's bound on `metadata` (a response's, a conversation's)."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA:
        raise InvalidRequest(f"metadata holds at most {MAX_METADATA} pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise InvalidRequest(
                "metadata keys are at most 64 characters, values at most 512",
                param="metadata",
            )


def _answers_calls(items: Sequence[Item], where: Callable[[int], str]) -> None:
    """Each `function_call_output` answers a `function_call` before it (OpenAI's rule: an
    output of no call is a 400, not a turn the model is asked to make sense of)."""
    calls: set[str] = set()
    for i, item in enumerate(items):
        if item["type"] == "function_call":
            calls.add(item["call_id"])
        elif item["type"] == "function_call_output" and item["call_id"] not in calls:
            param = where(i) if where(i) == "previous_response_id" else f"{where(i)}.call_id"
            raise InvalidRequest(
                f"{param}: no function_call with call_id {item['call_id']!r} comes before "
                "this function_call_output",
                param=param,
            )


def constraint(body: ResponsesRequest) -> Constraint | None:
    form = body.text.format if body.text is not None else None
    if form is not None and form.type == "json_object":
        return Constraint("json_object", None, "text.format")
    if form is not None and form.type == "json_schema":
        if form.schema_ is None:
            raise InvalidRequest(
                "text.format json_schema needs 'schema'", param="text.format.schema"
            )
        return json_constraint(form.schema_, "text.format.schema")
    if body.structured_outputs is not None:
        return parse_constraint(body.structured_outputs, "structured_outputs")
    return None


def sampling(body: ResponsesRequest, defaults: SamplingDefaults) -> SamplingOptions:
    """The body's sampling with `defaults` where it is silent, as every OpenAI API here
    reads it (checked later, by the plan)."""
    logprobs = None
    if LOGPROBS in (body.include or ()):
        logprobs = body.top_logprobs or 0
    elif body.top_logprobs:
        raise InvalidRequest(f"top_logprobs needs include: [{LOGPROBS!r}]", param="top_logprobs")
    return sampling_fields(
        body,
        defaults,
        max_tokens=0,  # the plan sets it: max_output_tokens, else the rest of the context
        logprobs=logprobs,
        logit_bias=logit_bias_pairs(body.logit_bias or {}, "logit_bias"),
    )


def translate(
    body: ResponsesRequest,
    context: Sequence[Item],
    input_items: Sequence[Item],
    info: EngineInfo,
    *,
    request_id: str,
    lora_name: str | None,
) -> Translated:
    """`body` with its stored `context` (empty without previous_response_id) and its
    `input_items` (`items.read_input`) as a conversation. Blocking (images)."""
    _check(body)
    if not context and not input_items:
        raise InvalidRequest("input is required (a string or a list of items)", param="input")
    if body.conversation is not None:  # an id is held once in a conversation
        held = {item["id"] for item in context}
        for i, item in enumerate(input_items):
            if item["id"] in held:
                raise InvalidRequest(
                    f"input.{i}.id: the conversation already holds {item['id']!r}",
                    param=f"input.{i}.id",
                )
    shift = len(context)

    def where(i: int) -> str:
        return f"input.{i - shift}" if i >= shift else "previous_response_id"

    _answers_calls([*context, *input_items], where)
    chat = messages([*context, *input_items], info, where)
    head = [ChatMessage("system", (TextPart(body.instructions),))] if body.instructions else []
    last = input_items[-1] if input_items else None
    continues = last is not None and last["type"] == "message" and last["role"] == "assistant"
    tools = tool_specs(body.tools)
    conversation = Conversation(
        request_id=request_id,
        messages=[*head, *chat],
        sampling=sampling(body, info.sampling_defaults),
        max_tokens=body.max_output_tokens,
        fields=FIELDS,
        tools=tools.specs,
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        constraint=constraint(body),
        add_generation_prompt=not continues,
        continue_final_message=continues,
        template_kwargs=body.chat_template_kwargs or {},
        lora_name=lora_name,
        priority=body.priority,
    )
    return Translated(conversation, len(head), body.truncation == "auto", tools.namespaces)
