"""What Completions and Chat share: one engine request per (prompt, choice), the
checks made before anything reaches the engine, per-choice accounting, usage.

A core is built from a validated body (raising `app.errors` on bad input, so errors
happen before a stream starts; the limits themselves are `app.engine.validation`'s),
exposes `plans` (the engine requests), and is then fed the engine's events per choice
index. Streaming asks `chunk(index, event)` for the chunk to
send; non-streaming calls `feed(index, event)` and finally `response()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.engine.base import EngineInfo, GenerationRequest, TokenEvent, Tokenizer
from schemas.openai import SamplingFields


@dataclass(frozen=True, slots=True)
class ChoicePlan:
    index: int  # the choice's index in the response
    prompt_index: int
    request: GenerationRequest


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    started: bool = False


class ChoicesCore:
    """Bookkeeping common to Completions and Chat cores."""

    object_name: str = ""
    chunk_object_name: str = ""

    def __init__(
        self,
        body: SamplingFields,
        info: EngineInfo,
        tokenizer: Tokenizer,
        *,
        response_id: str,
        created: int,
        model: str,
    ) -> None:
        self.body = body
        self.info = info
        self.tokenizer = tokenizer
        self.response_id = response_id
        self.created = created
        self.model = model
        self.lora_name = None if model == info.model_name else model
        self.plans: list[ChoicePlan] = []
        self.prompt_tokens: dict[int, int] = {}
        self.states: list[ChoiceState] = []
        self.include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def _add_plan(self, prompt_index: int, request: GenerationRequest) -> None:
        self.plans.append(ChoicePlan(len(self.plans), prompt_index, request))
        self.states.append(ChoiceState())

    def _account(self, index: int, event: TokenEvent) -> ChoiceState:
        state = self.states[index]
        if event.prompt_token_ids is not None:
            self.prompt_tokens[self.plans[index].prompt_index] = len(event.prompt_token_ids)
        state.completion_tokens += len(event.token_ids)
        if event.finish_reason is not None:
            state.finish_reason = event.finish_reason
            state.stop_reason = event.stop_reason
        return state

    def usage(self) -> dict[str, int]:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(state.completion_tokens for state in self.states)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": self.chunk_object_name if chunk else self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if not chunk:
            body["usage"] = self.usage()
        elif self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self) -> dict[str, Any] | None:
        """The final chunk of a stream when `stream_options.include_usage` is set."""
        if not self.include_usage:
            return None
        body = self._envelope([], chunk=True)
        body["usage"] = self.usage()
        return body
