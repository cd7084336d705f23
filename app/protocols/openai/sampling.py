"""OpenAI sampling fields -> neutral `SamplingOptions`, with the checks that need the model.

Defaults are OpenAI's (temperature 1, top_p 1) unless the request says otherwise. Options
vLLM has but the OpenAI API does not (top_k, min_p, ...) keep vLLM's meaning.
"""

from __future__ import annotations

from app.engine.base import EngineInfo, SamplingOptions
from app.errors import InvalidRequest
from schemas.openai import SamplingFields


def reject_unsupported(body: SamplingFields) -> None:
    """Fail loudly on parameters we would otherwise silently ignore."""
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in stops):
        raise InvalidRequest("stop strings must not be empty", param="stop")
    return stops


def sampling_options(
    body: SamplingFields,
    info: EngineInfo,
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    choice: int = 0,
) -> SamplingOptions:
    """Options for choice `choice` of `body`. With a seed, choice i samples with seed+i
    (as vLLM does for n > 1), so choices differ yet the whole response is reproducible."""
    if body.stop_token_ids and any(t < 0 or t >= info.vocab_size for t in body.stop_token_ids):
        raise InvalidRequest(
            f"stop_token_ids must be in [0, {info.vocab_size})", param="stop_token_ids"
        )
    top_k = body.top_k if body.top_k is not None else 0
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=body.temperature if body.temperature is not None else 1.0,
        top_p=body.top_p if body.top_p is not None else 1.0,
        top_k=0 if top_k == -1 else top_k,
        min_p=body.min_p or 0.0,
        seed=body.seed + choice if body.seed is not None else None,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=body.repetition_penalty or 1.0,
        stop=_stops(body.stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        include_stop_str_in_output=body.include_stop_str_in_output,
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=body.skip_special_tokens,
    )


def check_max_tokens(requested: int | None, prompt_len: int, info: EngineInfo) -> int:
    """The max_tokens to use: the requested one, or what is left of the context."""
    if requested is not None:
        return requested
    return max(info.max_model_len - prompt_len, 0)
