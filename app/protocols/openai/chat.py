"""POST /v1/chat/completions: a body -> the conversation core's plan
(`app.protocols.conversation`) -> `chat.completion` bodies and `chat.completion.chunk`s.

This module is the translation both ways and nothing else: `conversation(body, ...)`
maps Chat's messages (text and `image_url` parts, assistant `tool_calls`, `tool`
answers), tools, `response_format` / `structured_outputs`, sampling fields and template
switches onto a neutral `Conversation`; `ChatExchange` encodes each choice's `ChoiceOutput`
as OpenAI orders a stream: per choice a first chunk with the assistant role, content and
`tool_calls` deltas, then the finish reason (with the last delta); `finish_reason:
tool_calls` when calls were made (`stop` for a named tool choice). With a reasoning
parser (the engine's `--reasoning-parser`), a choice's reasoning comes as vLLM writes
it: `reasoning` beside `content` in the message and in the deltas.
"""

from __future__ import annotations

from typing import Any

from app.engine.base import (
    ChatMessage,
    EngineInfo,
    ImagePart,
    SamplingOptions,
    TextPart,
    TokenEvent,
    Tokenizer,
)
from app.engine.models import ServedModel
from app.errors import InvalidRequest
from app.protocols.conversation.bound import PromptBound
from app.protocols.conversation.images import PromptImages
from app.protocols.conversation.output import ChoiceOutput, Finish
from app.protocols.conversation.plan import Conversation, plan_conversation
from app.protocols.exchange import Event
from app.protocols.openai.choices import ChoicesExchange
from app.protocols.openai.logprobs import chat_logprobs
from app.protocols.openai.sampling import reject_unsupported, sampling_fields
from app.protocols.openai.structured import request_constraint, request_logit_bias
from app.protocols.openai.tools import (
    call_body,
    delta_body,
    history_calls,
    tool_choice,
    tool_specs,
)
from schemas.openai import ChatCompletionRequest, TokenizeChatRequest
from schemas.openai import ChatMessage as ChatMessageBody


def _message(index: int, message: ChatMessageBody, images: PromptImages) -> ChatMessage:
    parts: list[TextPart | ImagePart] = []
    if isinstance(message.content, str):
        parts.append(TextPart(message.content))
    elif message.content is not None:
        for i, part in enumerate(message.content):
            if part.type == "text":
                parts.append(TextPart(part.text))
            else:
                where = f"messages.{index}.content.{i}.image_url"
                parts.append(ImagePart(images.read_url(part.image_url.url, where)))
    return ChatMessage(
        role=message.role,
        parts=tuple(parts),
        tool_calls=history_calls(index, message.tool_calls or ()),
        tool_call_id=message.tool_call_id,
        name=message.name,
        reasoning=message.reasoning,
    )


def _messages(
    body: ChatCompletionRequest | TokenizeChatRequest, info: EngineInfo
) -> list[ChatMessage]:
    images = PromptImages(info)
    return [_message(i, m, images) for i, m in enumerate(body.messages)]


def template_kwargs(body: ChatCompletionRequest | TokenizeChatRequest) -> dict[str, Any]:
    """The body's template kwargs, its own `chat_template` (vLLM's field) among them, where
    vLLM's renderer reads it and the conversation's plan refuses it unless trusted."""
    kwargs = dict(body.chat_template_kwargs or {})
    if body.chat_template is not None:
        kwargs["chat_template"] = body.chat_template
    return kwargs


def prompt_bound(body: ChatCompletionRequest | TokenizeChatRequest) -> int:
    """Admission's bound of the prompt's tokens, as every chat-shaped API counts it
    (`app.protocols.conversation.bound`)."""
    bound = PromptBound()
    for message in body.messages:
        bound.text(message.text())
        bound.text(message.reasoning)
        for call in message.tool_calls or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                bound.call(function.get("name"), function.get("arguments"))
    for tool in body.tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            bound.tool(
                function.get("name"), function.get("description"), function.get("parameters")
            )
    return bound.tokens


def conversation(
    body: ChatCompletionRequest, info: EngineInfo, *, request_id: str, lora_name: str | None
) -> Conversation:
    """`body` as the conversation core takes it. Blocking (it decodes images)."""
    reject_unsupported(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    if body.max_completion_tokens is not None:
        max_tokens, max_name = body.max_completion_tokens, "max_completion_tokens"
    else:
        max_tokens, max_name = body.max_tokens, "max_tokens"
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return Conversation(
        request_id=request_id,
        messages=_messages(body, info),
        sampling=sampling_fields(
            body,
            info.sampling_defaults,
            max_tokens=0,
            logprobs=logprobs,
            logit_bias=request_logit_bias(body),
        ),
        max_tokens=max_tokens,
        fields={"prompt": "messages", "max_tokens": max_name, "logprobs": "top_logprobs"},
        tools=tool_specs(body.tools),
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        constraint=request_constraint(body),
        n=body.n,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        template_kwargs=template_kwargs(body),
        lora_name=lora_name,
        priority=body.priority,
    )


def tokenize_conversation(body: TokenizeChatRequest, info: EngineInfo) -> Conversation:
    """A /tokenize body with `messages`: the conversation `vllm serve` would render for
    it (tools and template switches included). Blocking (it decodes images)."""
    return Conversation(
        request_id="tokenize",
        messages=_messages(body, info),
        sampling=SamplingOptions(),
        max_tokens=None,
        fields={"prompt": "messages"},
        tools=tool_specs(body.tools),
        tool_choice="none",
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        template_kwargs=template_kwargs(body),
    )


class ChatExchange(ChoicesExchange):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(
        self,
        body: ChatCompletionRequest,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        response_id: str,
        created: int,
        served: ServedModel,
    ) -> None:
        """Plans the call (blocking: build it off the event loop)."""
        super().__init__(
            body, info, tokenizer, response_id=response_id, created=created, served=served
        )
        call = conversation(body, info, request_id=response_id, lora_name=self.lora_name)
        plan = plan_conversation(call, info, tokenizer)
        self._set_plans([(0, request) for request in plan.requests])
        self._named = plan.named
        new_parser = plan.new_parser
        self._outputs = [
            ChoiceOutput(new_parser() if new_parser is not None else None) for _ in plan.requests
        ]
        self._want_logprobs = body.logprobs
        self._contents: dict[int, list[dict[str, Any]]] = {}
        # With add_generation_prompt off and echo on, the client continues its own last
        # (assistant) message; the echo prefixes that message's text, as vLLM does.
        self._echo = (
            body.messages[-1].text() if body.echo and body.messages[-1].role == "assistant" else ""
        )

    def _logprobs(self, event: TokenEvent) -> list[dict[str, Any]] | None:
        if not self._want_logprobs:
            return None
        return chat_logprobs(event.token_ids, event.logprobs or (), self.tokenizer.token_to_str)

    def _finish_reason(self, index: int) -> Finish | None:
        finish = self._outputs[index].finish(self.states[index].finish_reason)
        return "stop" if finish == "tool_calls" and self._named else finish

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        """The chunks for one event: the role chunk before a choice's first delta."""
        state = self._account(index, event)
        out: list[Event] = []
        if not state.started:
            state.started = True
            role = {
                "index": index,
                "delta": {"role": "assistant", "content": self._echo},
                "logprobs": None,
                "finish_reason": None,
            }
            out.append((None, self._envelope([role], chunk=True)))
        if not event.text and event.finish_reason is None and not event.token_ids:
            return out
        logprobs = self._logprobs(event) if self._want_logprobs else None
        output = self._outputs[index]
        if output.parser is None:  # the common case, once per token: no parsing to do
            delta: dict[str, Any] = {"content": event.text} if event.text else {}
        else:
            parsed = output.delta(event)
            delta = {"content": parsed.text} if parsed.text else {}
            if parsed.reasoning:
                delta["reasoning"] = parsed.reasoning
            if parsed.tool_calls:
                delta["tool_calls"] = [delta_body(d) for d in parsed.tool_calls]
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": (
                self._finish_reason(index) if state.finish_reason is not None else None
            ),
            "stop_reason": state.stop_reason,
        }
        out.append((None, self._envelope([choice], chunk=True)))
        return out

    def feed(self, index: int, event: TokenEvent) -> None:
        state = self._account(index, event)
        output = self._outputs[index]
        if not state.started:
            state.started = True
        output.add(event)
        logprobs = self._logprobs(event)
        if logprobs is not None:
            self._contents.setdefault(index, []).extend(logprobs)

    def _message(self, index: int) -> dict[str, Any]:
        parsed = self._outputs[index].result()
        content = self._echo + parsed.content if parsed.content is not None else None
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if parsed.reasoning is not None:
            message["reasoning"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [call_body(call) for call in parsed.tool_calls]
        return message

    def response(self) -> dict[str, Any]:
        choices = []
        for i, state in enumerate(self.states):
            message = self._message(i)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": (
                        {"content": self._contents.get(i, [])} if self._want_logprobs else None
                    ),
                    "finish_reason": self._finish_reason(i),
                    "stop_reason": state.stop_reason,
                }
            )
        return self._envelope(choices, chunk=False)
