"""Neutral `SamplingOptions` -> vLLM's `SamplingParams` (always streamed as deltas), and
the model's own sampling defaults as vLLM reads them."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from app.engine.base import SamplingDefaults, SamplingOptions
from app.engine.vllm.errors import map_engine_errors
from app.engine.vllm.structured import structured_outputs

# vLLM clamps a logit bias to [-100, 100]; -100 is the customary ban.
_BANNED = -100.0


def sampling_params(
    options: SamplingOptions,
    extra_args: dict[str, Any] | None = None,
    banned_token_ids: frozenset[int] = frozenset(),
) -> SamplingParams:
    """Neutral options -> vLLM's SamplingParams (streamed as deltas)."""
    with map_engine_errors():
        return SamplingParams(
            n=1,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            min_p=options.min_p,
            seed=options.seed,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
            repetition_penalty=options.repetition_penalty,
            stop=list(options.stop) or None,
            stop_token_ids=list(options.stop_token_ids) or None,
            include_stop_str_in_output=options.include_stop_str_in_output,
            ignore_eos=options.ignore_eos,
            min_tokens=options.min_tokens,
            logprobs=options.logprobs,
            prompt_logprobs=options.prompt_logprobs,
            skip_special_tokens=options.skip_special_tokens,
            detokenize=options.detokenize or bool(options.stop),
            output_kind=RequestOutputKind.DELTA,
            extra_args=extra_args,
            logit_bias={**dict(options.logit_bias), **dict.fromkeys(banned_token_ids, _BANNED)}
            or None,
            structured_outputs=structured_outputs(options.constraint),
        )


def model_sampling_defaults(model_config: Any) -> SamplingDefaults:
    """The APIs' defaults with the model's over them: what vLLM reads of the model's
    generation_config.json (`--generation-config`, `--override-generation-config`; its
    `max_new_tokens` as `max_tokens`), as `vllm serve` takes them."""
    found = dict(model_config.get_diff_sampling_param())
    if found.get("top_k", 0) < 0:  # vLLM's "all tokens"; 0 here
        found["top_k"] = 0
    names = {f.name for f in fields(SamplingDefaults)}
    return SamplingDefaults(**{name: value for name, value in found.items() if name in names})
