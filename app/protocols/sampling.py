"""Sampling rules every protocol shares beyond the limits (`app.engine.validation`)."""

from __future__ import annotations

from dataclasses import replace

from app.engine.base import EngineInfo, SamplingOptions
from app.engine.validation import SEED_MAX, SEED_MIN


def for_choice(options: SamplingOptions, choice: int) -> SamplingOptions:
    """Choice `choice`'s options. With a seed, choice i samples with seed+i (as vLLM does
    for n > 1), so choices differ yet the whole response is reproducible; the sum wraps
    within the seed's range."""
    if options.seed is None or choice == 0:
        return options
    seed = (options.seed + choice - SEED_MIN) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN
    return replace(options, seed=seed)


def output_limit(requested: int | None, info: EngineInfo, prompt_tokens: int) -> int:
    """A request's output limit: as asked, else the model's default (its generation
    config's `max_new_tokens`) within the rest of the context, else the rest of the
    context, as `vllm serve` bounds it."""
    if requested is not None:
        return requested
    room = info.max_model_len - prompt_tokens
    default = info.sampling_defaults.max_tokens
    return room if default is None else min(room, default)
