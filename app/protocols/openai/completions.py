"""POST /v1/completions: prompts (text, token ids, or batches of either) -> engine requests
-> `text_completion` bodies and chunks.

`echo` prepends the prompt (and, with `logprobs`, the prompt's logprobs, the first being
None) to each choice; `max_tokens: 0` with `echo` scores a prompt without generating.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from app.engine.models import ServedModel
from app.engine.validation import NEUTRAL, Fields, check_prompt
from app.errors import InvalidRequest
from app.protocols.exchange import Event
from app.protocols.openai.choices import ChoicesExchange
from app.protocols.openai.logprobs import CompletionLogprobs
from app.protocols.openai.sampling import reject_unsupported, sampling_options
from app.protocols.openai.structured import request_constraint, request_logit_bias
from app.protocols.sampling import for_choice, output_limit
from schemas.openai import CompletionRequest


def _prompts(body: CompletionRequest, tokenizer: Tokenizer) -> list[tuple[list[int], str | None]]:
    """Each prompt as token ids, with its text when the client sent text."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return [(tokenizer.encode(prompt, body.add_special_tokens), prompt)]
    if not prompt:
        raise InvalidRequest("The prompt is empty", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return [(tokenizer.encode(p, body.add_special_tokens), p) for p in prompt]
    if all(isinstance(p, int) for p in prompt):
        return [(list(prompt), None)]
    if all(isinstance(p, list) for p in prompt):
        return [(list(p), None) for p in prompt]
    raise InvalidRequest("prompt mixes text and token ids", param="prompt")


# Completions name their fields as the neutral validation does.
_FIELDS: Fields = NEUTRAL


class CompletionExchange(ChoicesExchange):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(
        self,
        body: CompletionRequest,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        response_id: str,
        created: int,
        served: ServedModel,
    ) -> None:
        super().__init__(
            body, info, tokenizer, response_id=response_id, created=created, served=served
        )
        self.completion = body
        reject_unsupported(body)
        if body.suffix:
            raise InvalidRequest("suffix is not supported", param="suffix")
        # The prompts as text, for echo only: decoding every token-id prompt cost 2.7% of
        # the frontend's CPU at 64 streams of 64 tokens (profiled).
        self._prompt_texts: list[str] = []
        self._logprobs: list[CompletionLogprobs | None] = []
        self._merged: dict[int, dict[str, list[Any]]] = {}  # non-streamed logprobs per choice
        constraint, bias = request_constraint(body), request_logit_bias(body)
        plans: list[tuple[int, GenerationRequest]] = []
        for prompt_index, (ids, text) in enumerate(_prompts(body, tokenizer)):
            max_tokens = output_limit(body.max_tokens, info, len(ids))
            check_prompt(ids, max_tokens, info, _FIELDS)
            options = sampling_options(
                body,
                info,
                _FIELDS,
                max_tokens=max_tokens,
                logprobs=body.logprobs,
                prompt_logprobs=body.prompt_logprobs,
                # max_tokens 0 with echo scores the prompt, as vLLM serves it.
                prefill_only=body.echo,
                constraint=constraint,
                logit_bias=bias,
            )
            if body.echo and options.logprobs is not None:
                # The echoed prompt carries logprobs too.
                options = replace(
                    options, prompt_logprobs=max(options.prompt_logprobs or 0, options.logprobs)
                )
            if body.echo:
                self._prompt_texts.append(text if text is not None else tokenizer.decode(ids))
            for choice in range(body.n):
                request = GenerationRequest(
                    request_id=f"{response_id}-{prompt_index}-{choice}",
                    prompt_token_ids=ids,
                    sampling=for_choice(options, choice),
                    lora_name=self.lora_name,
                    priority=body.priority,
                )
                plans.append((prompt_index, request))
                self._logprobs.append(
                    CompletionLogprobs(tokenizer.token_to_str)
                    if body.logprobs is not None
                    else None
                )
        self._set_plans(plans)
        self._texts: list[list[str]] = [[] for _ in plans]  # non-streamed text per choice

    def _delta(self, index: int, event: TokenEvent) -> tuple[str, dict[str, Any] | None]:
        state = self._account(index, event)
        text = event.text
        logprobs = self._logprobs[index]
        if not state.started:
            state.started = True
            if self.completion.echo:
                text = self._prompt_texts[self.plans[index].prompt_index] + text
                if logprobs is not None and event.prompt_token_ids is not None:
                    logprobs.add_all(event.prompt_token_ids, event.prompt_logprobs)
        if logprobs is not None:
            logprobs.add_all(event.token_ids, event.logprobs)
        return text, logprobs.take() if logprobs is not None else None

    def events(self, index: int, event: TokenEvent) -> list[Event]:
        text, logprobs = self._delta(index, event)
        state = self.states[index]
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": state.finish_reason,
            "stop_reason": state.stop_reason,
        }
        return [(None, self._envelope([choice], chunk=True))]

    def feed(self, index: int, event: TokenEvent) -> None:
        text, logprobs = self._delta(index, event)
        self._texts[index].append(text)
        if logprobs is not None:
            merged = self._merged.setdefault(index, {k: [] for k in logprobs})
            for key, values in logprobs.items():
                merged[key].extend(values)

    def response(self) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "text": "".join(self._texts[i]),
                "logprobs": self._merged.get(i) if self._logprobs[i] is not None else None,
                "finish_reason": state.finish_reason,
                "stop_reason": state.stop_reason,
            }
            for i, state in enumerate(self.states)
        ]
        return self._envelope(choices, chunk=False)
