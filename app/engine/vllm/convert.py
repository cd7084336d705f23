"""vLLM's `RequestOutput` deltas -> neutral `TokenEvent`s, one converter per request.

Logprobs become `TokenLogprob`s (the sampled token's, with the top-k alternatives best
first); prompt logprobs that arrive with prefill chunks are held until the first event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm.outputs import RequestOutput

from app.engine.base import FinishReason, SamplingOptions, TokenEvent, TokenLogprob
from app.errors import InvalidRequest


def token_logprob(token_id: int, position: Mapping[int, Any], k: int) -> TokenLogprob:
    """vLLM's logprobs of one position (its `Logprob`s by token id) as the seam's: the
    token's own, and the top `k` by rank, best first."""
    chosen = position.get(token_id)
    top = {
        tid: lp.logprob
        for tid, lp in sorted(position.items(), key=lambda item: item[1].rank or 0)
        if lp.rank is not None and lp.rank <= k
    }
    return TokenLogprob(
        token_id=token_id,
        logprob=chosen.logprob if chosen is not None else float("-inf"),
        rank=chosen.rank if chosen is not None else None,
        top=top,
    )


def finish_of(reason: str | None) -> FinishReason | None:
    """vLLM's finish reason as the engine seam's: anything but a stop or the length
    (an abort, an error) ends the request as aborted."""
    if reason is None:
        return None
    if reason == "stop":
        return "stop"
    return "length" if reason == "length" else "abort"


def check_expansion(prompt_ids: list[int], expanded: Sequence[int] | None) -> None:
    """vLLM expanded the request's images itself; it must have rebuilt its exact tokens."""
    if expanded is not None and list(expanded) != prompt_ids:
        raise InvalidRequest(
            f"The engine expanded the images into a prompt of {len(expanded)} tokens, "
            f"not the {len(prompt_ids)} of the request: an image's block does not hold "
            "the number of pad tokens the engine makes of it",
            param="images",
        )


def prompt_only(readouts: Mapping[int, bytes] | None, length: int) -> dict[int, bytes] | None:
    """A prefill-only request sampled one token it will not return: keep the prompt's
    positions only."""
    if readouts is None:
        return None
    return {p: v for p, v in readouts.items() if p < length}


class EventConverter:
    """Turns one request's `RequestOutput` deltas into `TokenEvent`s."""

    def __init__(self, prompt_ids: list[int], options: SamplingOptions) -> None:
        self._prompt_ids = prompt_ids
        self._k = options.logprobs
        self._prompt_k = options.prompt_logprobs
        self._first = True
        self._pending_prompt_logprobs: list[TokenLogprob | None] = []

    def _prompt_logprobs(self, output: RequestOutput) -> None:
        if output.prompt_logprobs is None or self._prompt_k is None:
            return
        start = len(self._pending_prompt_logprobs)
        for offset, position in enumerate(output.prompt_logprobs):
            if position is None:
                self._pending_prompt_logprobs.append(None)
                continue
            token_id = self._prompt_ids[start + offset]
            self._pending_prompt_logprobs.append(token_logprob(token_id, position, self._prompt_k))

    def convert(self, output: RequestOutput) -> TokenEvent | None:
        self._prompt_logprobs(output)
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        if not token_ids and not output.finished:
            return None  # a prefill chunk: hold its prompt logprobs for the first event
        logprobs = None
        if self._k is not None and completion.logprobs is not None:
            logprobs = [
                token_logprob(tid, position, self._k)
                for tid, position in zip(token_ids, completion.logprobs, strict=False)
            ]
        first = self._first
        self._first = False
        finish = finish_of(completion.finish_reason) if output.finished else None
        return TokenEvent(
            token_ids=token_ids,
            text=completion.text,
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=completion.stop_reason if output.finished else None,
            prompt_token_ids=self._prompt_ids if first else None,
            prompt_logprobs=(
                self._pending_prompt_logprobs if first and self._prompt_k is not None else None
            ),
            num_cached_tokens=int(output.num_cached_tokens or 0) if first else 0,
        )
