"""POST /v1/chat/completions: messages -> the model's chat template -> engine requests ->
`chat.completion` bodies and `chat.completion.chunk`s.

Streams follow OpenAI's order per choice: a first chunk with the assistant role, content
deltas, then the finish reason (with the last delta). Tools and structured output are not
served here and are refused rather than ignored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.constraints import validate_constraints
from app.errors import InvalidRequest
from app.protocols.openai.choices import ChoicesCore, check_context
from app.protocols.openai.logprobs import chat_logprobs
from app.protocols.openai.sampling import reject_unsupported, sampling_options
from app.protocols.openai.structured import request_constraint, request_logit_bias
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
        if body.tools:
            raise InvalidRequest("tools are not supported by this server", param="tools")
        if body.top_logprobs is not None and not body.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not info.has_chat_template:
            raise InvalidRequest("This model has no chat template", param="messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        # With add_generation_prompt off and echo on, the client continues its own last
        # (assistant) message; the echo prefixes that message's text, as vLLM does.
        self._echo = (
            body.messages[-1].text() if body.echo and body.messages[-1].role == "assistant" else ""
        )
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt
        )
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = requested if requested is not None else info.max_model_len - len(ids)
        check_context(len(ids), max_tokens, info)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        self._want_logprobs = body.logprobs
        self._contents: dict[int, list[dict[str, Any]]] = {}
        constraint, bias = request_constraint(body), request_logit_bias(body)
        for choice in range(body.n):
            options = sampling_options(
                body, info, max_tokens=max_tokens, logprobs=logprobs, choice=choice
            )
            options = replace(options, constraint=constraint, logit_bias=bias)
            if choice == 0:
                validate_constraints(options, info)
            self._add_plan(
                0,
                GenerationRequest(
                    request_id=f"{response_id}-{choice}",
                    prompt_token_ids=ids,
                    sampling=options,
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
        choice = {
            "index": index,
            "delta": {"content": event.text} if event.text else {},
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": state.finish_reason,
            "stop_reason": state.stop_reason,
        }
        out.append(self._envelope([choice], chunk=True))
        return out

    def feed(self, index: int, event: TokenEvent) -> None:
        state = self._account(index, event)
        if not state.started:
            state.started = True
            state.text.append(self._echo)
        state.text.append(event.text)
        logprobs = self._logprobs(event)
        if logprobs is not None:
            self._contents.setdefault(index, []).extend(logprobs)

    def response(self) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": "".join(state.text)},
                "logprobs": (
                    {"content": self._contents.get(i, [])} if self._want_logprobs else None
                ),
                "finish_reason": state.finish_reason,
                "stop_reason": state.stop_reason,
            }
            for i, state in enumerate(self.states)
        ]
        return self._envelope(choices, chunk=False)
