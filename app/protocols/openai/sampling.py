"""OpenAI sampling fields -> neutral `SamplingOptions`, validated by `app.engine.validation`.

This module keeps only what is OpenAI's: the defaults (a field the request leaves out takes
the model's default, `EngineInfo.sampling_defaults`: temperature 1, top_p 1 unless the
model's generation config says otherwise, as `vllm serve` reads it; options vLLM has and
the OpenAI API does not, such as top_k and min_p, keep vLLM's meaning) and the names of
the fields that errors point at. Every limit is the shared one.
"""

from __future__ import annotations

from app.engine.base import EngineInfo, SamplingDefaults, SamplingOptions
from app.engine.constraints import Constraint
from app.engine.validation import Fields, validate_sampling
from app.errors import InvalidRequest
from schemas.openai import SamplingFields, VllmSampling


def reject_unsupported(body: SamplingFields) -> None:
    """Fail loudly on parameters we would otherwise silently ignore."""
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
    # vllm serve refuses it too (an empty object passes there, and here).
    if body.stream_options is not None and body.stream_options.model_fields_set and not body.stream:
        raise InvalidRequest(
            "stream_options can only be set when stream is true", param="stream_options"
        )


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _default(value: float | None, default: float) -> float:
    return value if value is not None else default


def sampling_fields(
    body: VllmSampling,
    defaults: SamplingDefaults,
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    constraint: Constraint | None = None,
    logit_bias: tuple[tuple[int, float], ...] = (),
) -> SamplingOptions:
    """`body`'s sampling fields with `defaults` where it is silent, not yet checked (the
    caller, or the conversation plan, validates them once the rest is known)."""
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=_default(body.temperature, defaults.temperature),
        top_p=_default(body.top_p, defaults.top_p),
        top_k=body.top_k if body.top_k is not None else defaults.top_k,
        min_p=_default(body.min_p, defaults.min_p),
        seed=body.seed,
        presence_penalty=_default(body.presence_penalty, defaults.presence_penalty),
        frequency_penalty=_default(body.frequency_penalty, defaults.frequency_penalty),
        repetition_penalty=_default(body.repetition_penalty, defaults.repetition_penalty),
        stop=_stops(body.stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        include_stop_str_in_output=body.include_stop_str_in_output,
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=body.skip_special_tokens,
        constraint=constraint,
        logit_bias=logit_bias,
    )


def sampling_options(
    body: SamplingFields,
    info: EngineInfo,
    fields: Fields,
    *,
    max_tokens: int,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    prefill_only: bool = False,
    constraint: Constraint | None = None,
    logit_bias: tuple[tuple[int, float], ...] = (),
) -> SamplingOptions:
    """The validated options of `body`'s first choice (`app.protocols.sampling.for_choice`
    gives the others). `fields` names the request's fields for the neutral ones that
    differ (max_tokens, logprobs, prompt)."""
    options = sampling_fields(
        body,
        info.sampling_defaults,
        max_tokens=max_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        constraint=constraint,
        logit_bias=logit_bias,
    )
    return validate_sampling(options, info, fields, prefill_only=prefill_only, n=body.n)
