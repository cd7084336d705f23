"""POST /v1/chat/completions: messages -> the model's chat template -> engine requests ->
`chat.completion` bodies and `chat.completion.chunk`s.

Streams follow OpenAI's order per choice: a first chunk with the assistant role, content
deltas, then the finish reason (with the last delta). With tools, each choice's text goes
through the engine's tool-call parser (`app.protocols.openai.tools`): content and
`tool_calls` deltas, and `finish_reason: tool_calls` when calls were made.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.tools import ToolCallParser
from app.engine.validation import check_prompt
from app.errors import InvalidRequest
from app.protocols.openai.choices import ChoicesCore
from app.protocols.openai.logprobs import chat_logprobs
from app.protocols.openai.sampling import for_choice, reject_unsupported, sampling_options
from app.protocols.openai.structured import request_constraint, request_logit_bias
from app.protocols.openai.tools import (
    call_body,
    delta_body,
    is_named,
    template_message,
    tool_plan,
)
from schemas.openai import ChatCompletionRequest


class ChatCore(ChoicesCore):
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
        model: str,
    ) -> None:
        super().__init__(
            body, info, tokenizer, response_id=response_id, created=created, model=model
        )
        reject_unsupported(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not info.has_chat_template:
            raise InvalidRequest("This model has no chat template", param="messages")
        messages = [template_message(i, m) for i, m in enumerate(body.messages)]
        plan = tool_plan(body, info)
        self._named = is_named(body)
        self._parsers: dict[int, ToolCallParser] = {}
        self._called: set[int] = set()  # choices that streamed a tool call
        self._token_ids: dict[int, list[int]] = {}
        # With add_generation_prompt off and echo on, the client continues its own last
        # (assistant) message; the echo prefixes that message's text, as vLLM does.
        self._echo = (
            body.messages[-1].text() if body.echo and body.messages[-1].role == "assistant" else ""
        )
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, tools=body.tools
        )
        if body.max_completion_tokens is not None:
            requested, name = body.max_completion_tokens, "max_completion_tokens"
        else:
            requested, name = body.max_tokens, "max_tokens"
        fields = {"prompt": "messages", "max_tokens": name, "logprobs": "top_logprobs"}
        max_tokens = requested if requested is not None else info.max_model_len - len(ids)
        check_prompt(ids, max_tokens, info, fields)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        constraint = request_constraint(body)
        if plan is not None and plan.constraint is not None:
            constraint = plan.constraint  # a forced call overrides response_format
        options = sampling_options(
            body,
            info,
            fields,
            max_tokens=max_tokens,
            logprobs=logprobs,
            constraint=constraint,
            logit_bias=request_logit_bias(body),
        )
        if plan is not None and plan.skip_special_tokens is not None:
            options = replace(options, skip_special_tokens=plan.skip_special_tokens)
        self._want_logprobs = body.logprobs
        self._contents: dict[int, list[dict[str, Any]]] = {}
        for choice in range(body.n):
            if plan is not None and plan.new_parser is not None:
                self._parsers[choice] = plan.new_parser()
            self._add_plan(
                0,
                GenerationRequest(
                    request_id=f"{response_id}-{choice}",
                    prompt_token_ids=ids,
                    sampling=for_choice(options, choice),
                    lora_name=self.lora_name,
                    priority=body.priority,
                ),
            )

    def _logprobs(self, event: TokenEvent) -> list[dict[str, Any]] | None:
        if not self._want_logprobs:
            return None
        return chat_logprobs(event.token_ids, event.logprobs or (), self.tokenizer.token_to_str)

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        """The chunks for one event: the role chunk before a choice's first delta."""
        state = self._account(index, event)
        out = []
        if not state.started:
            state.started = True
            role = {
                "index": index,
                "delta": {"role": "assistant", "content": self._echo},
                "logprobs": None,
                "finish_reason": None,
            }
            out.append(self._envelope([role], chunk=True))
        if not event.text and event.finish_reason is None and not event.token_ids:
            return out
        logprobs = self._logprobs(event)
        delta: dict[str, Any] = {"content": event.text} if event.text else {}
        parser = self._parsers.get(index)
        if parser is not None:
            parsed = parser.feed(
                event.text,
                event.token_ids,
                prompt_token_ids=event.prompt_token_ids,
                finished=event.finish_reason is not None,
            )
            delta = {"content": parsed.content} if parsed.content else {}
            if parsed.tool_calls:
                self._called.add(index)
                delta["tool_calls"] = [delta_body(d) for d in parsed.tool_calls]
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": self._finish_reason(index),
            "stop_reason": state.stop_reason,
        }
        out.append(self._envelope([choice], chunk=True))
        return out

    def _finish_reason(self, index: int) -> str | None:
        reason = self.states[index].finish_reason
        if reason == "stop" and index in self._called and not self._named:
            return "tool_calls"
        return reason

    def feed(self, index: int, event: TokenEvent) -> None:
        state = self._account(index, event)
        if not state.started:
            state.started = True
            state.text.append(self._echo)
        state.text.append(event.text)
        self._token_ids.setdefault(index, []).extend(event.token_ids)
        logprobs = self._logprobs(event)
        if logprobs is not None:
            self._contents.setdefault(index, []).extend(logprobs)

    def _message(self, index: int) -> dict[str, Any]:
        text = "".join(self.states[index].text)
        parser = self._parsers.get(index)
        if parser is None:
            return {"role": "assistant", "content": text}
        parsed = parser.parse(text, self._token_ids.get(index, []))
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            self._called.add(index)
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
