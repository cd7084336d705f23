"""What every exchange that runs engine requests counts, in one place: each request's output
tokens and finish, the prompt tokens of each distinct prompt (the `n` choices of one
prompt share it, and its cached part), and the usage they add up to.

`Accounting.account(index, event)` is called with every `TokenEvent` of request `index`,
in order, streamed or not; the numbers are the engine's (its events' token ids, its
prompt ids on the first event, its cached-token count), never re-derived from text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.base import FinishReason, TokenEvent


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those the prefix cache held

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class RequestState:
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that matched
    started: bool = False  # the exchange's own flag: it has answered this request's first event


class Accounting:
    def __init__(self, prompt_of: Sequence[int]) -> None:
        """`prompt_of[i]` is the prompt request `i` continues."""
        self._prompt_of = tuple(prompt_of)
        self.states = [RequestState() for _ in self._prompt_of]
        self._prompt_tokens: dict[int, int] = {}
        self._cached_tokens: dict[int, int] = {}

    def account(self, index: int, event: TokenEvent) -> RequestState:
        state = self.states[index]
        if event.prompt_token_ids is not None:
            prompt = self._prompt_of[index]
            self._prompt_tokens[prompt] = len(event.prompt_token_ids)
            # Choices of one prompt are one prefill to the client; the first one's count.
            self._cached_tokens.setdefault(prompt, event.num_cached_tokens)
        state.completion_tokens += len(event.token_ids)
        if event.finish_reason is not None:
            state.finish_reason = event.finish_reason
            state.stop_reason = event.stop_reason
        return state

    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=sum(self._prompt_tokens.values()),
            completion_tokens=sum(state.completion_tokens for state in self.states),
            cached_tokens=sum(self._cached_tokens.values()),
        )
