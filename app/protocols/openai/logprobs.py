"""Logprobs in the two OpenAI shapes: Completions' parallel lists (tokens, token_logprobs,
top_logprobs, text_offset) and Chat's list of per-token objects.

JSON has no -inf; like vLLM, a logprob of -inf is written as -9999.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from app.engine.base import TokenLogprob

TokenText = Callable[[int], str]
_FLOOR = -9999.0


def _clamp(value: float) -> float:
    return _FLOOR if math.isinf(value) or math.isnan(value) else max(value, _FLOOR)


class CompletionLogprobs:
    """Accumulates the Completions shape; `take()` returns what was added since the last
    call (a stream chunk's worth), with `text_offset` counted from the choice's start."""

    def __init__(self, token_text: TokenText, start_offset: int = 0) -> None:
        self._token_text = token_text
        self._offset = start_offset
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, entry: TokenLogprob | None) -> None:
        text = self._token_text(token_id)
        self.tokens.append(text)
        self.text_offset.append(self._offset)
        self._offset += len(text)
        if entry is None:
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
            return
        self.token_logprobs.append(_clamp(entry.logprob))
        top = {self._token_text(t): _clamp(lp) for t, lp in entry.top.items()}
        # OpenAI's top_logprobs always include the sampled token.
        top.setdefault(text, _clamp(entry.logprob))
        self.top_logprobs.append(top)

    def add_all(
        self, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None] | None
    ) -> None:
        for i, token_id in enumerate(token_ids):
            self.add(token_id, entries[i] if entries is not None else None)

    def take(self) -> dict[str, Any]:
        body = {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }
        self._reset()
        return body


def chat_logprobs(
    token_ids: Sequence[int], entries: Sequence[TokenLogprob], token_text: TokenText
) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` entries for these tokens."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": _clamp(logprob), "bytes": list(text.encode())}

    content = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        top: Mapping[int, float] = entry.top
        content.append(
            {
                **item(token_id, entry.logprob),
                "top_logprobs": [item(t, lp) for t, lp in top.items()],
            }
        )
    return content
