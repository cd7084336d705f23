"""The one validation of what a generation asks of the engine: sampling options and the
prompt's fit. Every protocol core calls it; the engine calls it again as a safety net.

Limits are the ones `vllm serve` (vLLM 0.32's `SamplingParams` and OpenAI server) accepts,
so nothing it takes is refused and nothing it would raise on gets through:

    seed                 an integer in [-2**63, 2**63)  (-1: none, as in vLLM)
    temperature          [0, 2]; 0 is greedy
    n                    the samples drawn with these options: 1 when greedy (vLLM's
                         "n must be 1 when using greedy sampling"; they would be copies)
    top_p                (0, 1]
    top_k                -1 or 0 (every token), or >= 1; a value >= the vocabulary size
                         also means every token (vLLM clamps it the same way)
    min_p                [0, 1]
    presence_penalty     [-2, 2]
    frequency_penalty    [-2, 2]
    repetition_penalty   finite and > 0
    max_tokens           >= 1, and at most the context; 0 (prefill only, the prompt is
                         scored) only where the caller says it means that
    min_tokens           [0, max_tokens]
    stop                 each string non-empty
    stop_token_ids       each in [0, vocab_size)
    logprobs             -1 (every token) or [0, max_logprobs]
    prompt_logprobs      likewise
    logit_bias, constraint   `validate_constraints`: ids in the
                         vocabulary, biases in [-100, 100], and a constraint the engine's
                         structured-output backend compiles

and a prompt is at least one token, each in [0, vocab_size), with prompt + max_tokens
within `max_model_len` (a prefill-only request still takes one position: vLLM samples a
token to score a prompt). Bad values raise `InvalidRequest`; a prompt that does not fit
raises `ContextLengthExceeded` (gRPC RESOURCE_EXHAUSTED, as Salience's spec says of
context overflow; 400 over HTTP).

Messages and `param` name the client's own field: each caller passes `fields`, a mapping
from the neutral names above (and `prompt`) to what its protocol calls them; a name it
leaves out is used as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from app.engine.base import EngineInfo, SamplingOptions
from app.engine.constraints import KINDS, MAX_BIAS, check_shape
from app.errors import ContextLengthExceeded, InvalidRequest

Fields = Mapping[str, str]
NEUTRAL: Fields = {}

SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
MAX_TEMPERATURE = 2.0
MAX_PENALTY = 2.0


def _name(fields: Fields, neutral: str) -> str:
    return fields.get(neutral, neutral)


def _invalid(fields: Fields, neutral: str, rule: str, value: object) -> InvalidRequest:
    name = _name(fields, neutral)
    return InvalidRequest(f"{name} must be {rule}, got {value!r}", param=name)


def validate_sampling(
    options: SamplingOptions,
    info: EngineInfo,
    fields: Fields = NEUTRAL,
    *,
    prefill_only: bool = False,
    n: int = 1,
    compile_constraint: bool = True,
) -> SamplingOptions:
    """`options` checked against the engine's limits, normalised (top_k -1 or past the
    vocabulary -> 0; logprobs -1 -> the vocabulary size). `prefill_only`: max_tokens 0
    is allowed and means the prompt is only scored. `n`: how many samples the caller
    draws with these options (one engine request each). `compile_constraint`: parse the
    constraint and ask the engine's backend to compile it (blocking, as long as the
    spec: off the event loop); False where a core has done so already (the engine's
    safety net, on the loop)."""
    o = options
    if o.seed is not None and not SEED_MIN <= o.seed <= SEED_MAX:
        raise _invalid(fields, "seed", "an integer in [-2**63, 2**63)", o.seed)
    if not 0.0 <= o.temperature <= MAX_TEMPERATURE:  # NaN fails every comparison
        raise _invalid(fields, "temperature", f"in [0, {MAX_TEMPERATURE:g}]", o.temperature)
    # vLLM's SamplingParams treats only 0 as greedy (it raises (0, 0.01) to 0.01).
    if n > 1 and o.temperature == 0.0:
        name = _name(fields, "n")
        raise InvalidRequest(
            f"{name} must be 1 when using greedy sampling (temperature 0), got {n}", param=name
        )
    if not 0.0 < o.top_p <= 1.0:
        raise _invalid(fields, "top_p", "in (0, 1]", o.top_p)
    if o.top_k < -1:
        raise _invalid(fields, "top_k", "-1 or 0 (every token), or at least 1", o.top_k)
    if not 0.0 <= o.min_p <= 1.0:
        raise _invalid(fields, "min_p", "in [0, 1]", o.min_p)
    for neutral, value in (
        ("presence_penalty", o.presence_penalty),
        ("frequency_penalty", o.frequency_penalty),
    ):
        if not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise _invalid(fields, neutral, f"in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]", value)
    if not (math.isfinite(o.repetition_penalty) and o.repetition_penalty > 0.0):
        raise _invalid(fields, "repetition_penalty", "a finite number > 0", o.repetition_penalty)
    lowest = 0 if prefill_only else 1
    if o.max_tokens < lowest:
        raise _invalid(fields, "max_tokens", f"at least {lowest}", o.max_tokens)
    if o.max_tokens > info.max_model_len:
        name = _name(fields, "max_tokens")
        raise ContextLengthExceeded(
            f"{name} {o.max_tokens} cannot fit: this model's maximum context length is "
            f"{info.max_model_len} tokens. Please reduce {name}.",
            param=name,
            code="context_length_exceeded",
        )
    if not 0 <= o.min_tokens <= o.max_tokens:
        raise _invalid(fields, "min_tokens", f"in [0, max_tokens={o.max_tokens}]", o.min_tokens)
    if any(not s for s in o.stop):
        name = _name(fields, "stop")
        raise InvalidRequest(f"{name} must not contain an empty string", param=name)
    check_token_ids(o.stop_token_ids, info, _name(fields, "stop_token_ids"))
    logprobs = _logprobs(o.logprobs, info, fields, "logprobs")
    prompt_logprobs = _logprobs(o.prompt_logprobs, info, fields, "prompt_logprobs")
    validate_constraints(
        o, info, bias_param=_name(fields, "logit_bias"), compile_constraint=compile_constraint
    )
    top_k = 0 if o.top_k == -1 or o.top_k >= info.vocab_size else o.top_k
    if (top_k, logprobs, prompt_logprobs) == (o.top_k, o.logprobs, o.prompt_logprobs):
        return o
    return replace(o, top_k=top_k, logprobs=logprobs, prompt_logprobs=prompt_logprobs)


def _logprobs(value: int | None, info: EngineInfo, fields: Fields, neutral: str) -> int | None:
    if value is None:
        return None
    count = info.vocab_size if value == -1 else value
    if not 0 <= count <= info.max_logprobs:
        raise _invalid(fields, neutral, f"-1 (every token) or in [0, {info.max_logprobs}]", value)
    return count


def check_token_ids(ids: Sequence[int], info: EngineInfo, name: str) -> None:
    """Every id in [0, vocab_size); the first one outside is named by its index."""
    vocab = info.vocab_size
    if not ids or (min(ids) >= 0 and max(ids) < vocab):  # C-speed on the common path
        return
    index, bad = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab)
    raise InvalidRequest(f"{name}[{index}] is {bad}; token ids must be in [0, {vocab})", param=name)


def check_fit(
    prompt_len: int,
    max_tokens: int,
    info: EngineInfo,
    fields: Fields = NEUTRAL,
    *,
    stored_only: bool = False,
) -> None:
    """A prompt of `prompt_len` tokens with `max_tokens` to generate (0: prefill only, which
    still takes one position) fits the context. `stored_only`: the tokens are only kept
    (a Salience session's no-op Generate), not run, so they may fill the whole context and
    may be none."""
    limit = info.max_model_len
    if stored_only:
        if prompt_len <= limit:
            return
        output = 0
    else:
        if prompt_len == 0:
            name = _name(fields, "prompt")
            raise InvalidRequest(f"{name} holds no tokens; there is nothing to run", param=name)
        output = max(max_tokens, 1)
        if prompt_len + output <= limit:
            return
    prompt, out = _name(fields, "prompt"), _name(fields, "max_tokens")
    raise ContextLengthExceeded(
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_len + output} tokens ({prompt_len} in {prompt}, {output} for the "
        f"completion). Please reduce the length of {prompt} or {out}.",
        param=out if prompt_len < limit else prompt,
        code="context_length_exceeded",
    )


def check_prompt(
    ids: Sequence[int], max_tokens: int, info: EngineInfo, fields: Fields = NEUTRAL
) -> None:
    """The prompt-fit check: token ids in the vocabulary, non-empty, and room for
    `max_tokens` more (see `check_fit`)."""
    check_token_ids(ids, info, _name(fields, "prompt"))
    check_fit(len(ids), max_tokens, info, fields)


def validate_constraints(
    options: SamplingOptions,
    info: EngineInfo,
    *,
    bias_param: str = "logit_bias",
    compile_constraint: bool = True,
) -> None:
    """The one check of `options.constraint` and `options.logit_bias` against the served
    model; raises `InvalidRequest` naming the client's field. `compile_constraint`: as
    `validate_sampling` says."""
    for token, value in options.logit_bias:
        if not 0 <= token < info.vocab_size:
            raise InvalidRequest(
                f"{bias_param} token ids must be in [0, {info.vocab_size}), not {token}",
                param=bias_param,
            )
        if math.isnan(value) or not -MAX_BIAS <= value <= MAX_BIAS:
            raise InvalidRequest(
                f"{bias_param} values must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}]", param=bias_param
            )
    constraint = options.constraint
    if constraint is None:
        return
    if constraint.kind not in KINDS:
        raise InvalidRequest(
            f"unknown constraint kind {constraint.kind!r}; one of {', '.join(KINDS)}",
            param=constraint.param,
        )
    if not compile_constraint:
        return
    check_shape(constraint)
    if info.check_constraint is None:
        raise InvalidRequest(
            "this server's engine does not support constrained decoding", param=constraint.param
        )
    info.check_constraint(constraint)
