"""The shared validation: every limit at its bounds and just past them, the normalising
rules, and the prompt-fit check. The limits are vLLM 0.32's (`SamplingParams._verify_args`
and its OpenAI server); `test_vllm_accepts_what_we_accept` holds us to them."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from app.engine.base import EngineInfo, SamplingOptions
from app.engine.validation import (
    check_fit,
    check_prompt,
    check_token_ids,
    validate_sampling,
)
from app.errors import ContextLengthExceeded, InvalidRequest

INFO = EngineInfo(
    model_name="m",
    model_path="/m",
    max_model_len=64,
    vocab_size=100,
    eos_token_ids=(0,),
    has_chat_template=False,
    max_loras=0,
    max_logprobs=20,
)
NAN = math.nan
INF = math.inf

# (field, values accepted, values refused): the bounds themselves, and just past them.
LIMITS: list[tuple[str, list[Any], list[Any]]] = [
    ("seed", [None, -(2**63), -1, 0, 2**63 - 1], [-(2**63) - 1, 2**63]),
    ("temperature", [0.0, 1e-9, 2.0], [-1e-9, 2.0 + 1e-9, NAN, INF]),
    ("top_p", [1e-9, 1.0], [0.0, -0.1, 1.0 + 1e-9, NAN]),
    ("top_k", [-1, 0, 1, 99, 100, 2**70], [-2, -(2**63)]),
    ("min_p", [0.0, 1.0], [-1e-9, 1.0 + 1e-9, NAN]),
    ("presence_penalty", [-2.0, 0.0, 2.0], [-2.0 - 1e-9, 2.0 + 1e-9, NAN]),
    ("frequency_penalty", [-2.0, 2.0], [-2.0 - 1e-9, 2.0 + 1e-9, -INF]),
    ("repetition_penalty", [1e-9, 1.0, 1e9], [0.0, -1.0, INF, NAN]),
    ("max_tokens", [1, 64], [0, -1]),
    ("logprobs", [None, 0, 20], [21, -2]),
    ("prompt_logprobs", [None, 0, 20], [21, -2]),
    ("stop", [(), ("a",), ("\n", "x")], [("",), ("a", "")]),
    ("stop_token_ids", [(), (0,), (99,)], [(100,), (-1,), (5, 100)]),
]


def _options(field: str, value: Any) -> SamplingOptions:
    return replace(SamplingOptions(max_tokens=16), **{field: value})


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, ok, _ in LIMITS for v in ok], ids=repr)
def test_values_at_the_bounds_are_accepted(field: str, value: Any) -> None:
    validate_sampling(_options(field, value), INFO)


@pytest.mark.parametrize(
    ("field", "value"), [(f, v) for f, _, bad in LIMITS for v in bad], ids=repr
)
def test_values_past_the_bounds_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_sampling(_options(field, value), INFO)
    assert refused.value.param == field
    assert refused.value.message.startswith(field)


def test_errors_name_the_callers_field() -> None:
    fields = {"temperature": "config.temperature", "max_tokens": "max_completion_tokens"}
    with pytest.raises(InvalidRequest) as refused:
        validate_sampling(_options("temperature", 3.0), INFO, fields)
    assert refused.value.param == "config.temperature"
    assert refused.value.message == "config.temperature must be in [0, 2], got 3.0"
    with pytest.raises(InvalidRequest, match=r"^max_completion_tokens must be at least 1"):
        validate_sampling(_options("max_tokens", 0), INFO, fields)


def test_max_tokens_zero_only_where_it_means_prefill_only() -> None:
    assert validate_sampling(_options("max_tokens", 0), INFO, prefill_only=True).max_tokens == 0
    with pytest.raises(InvalidRequest):
        validate_sampling(_options("max_tokens", -1), INFO, prefill_only=True)


def test_max_tokens_past_the_context_cannot_fit() -> None:
    with pytest.raises(ContextLengthExceeded) as refused:
        validate_sampling(_options("max_tokens", 65), INFO)
    assert refused.value.grpc_status == "RESOURCE_EXHAUSTED"
    assert refused.value.http_status == 400
    assert refused.value.code == "context_length_exceeded"


def test_min_tokens_is_bounded_by_max_tokens() -> None:
    validate_sampling(SamplingOptions(max_tokens=5, min_tokens=5), INFO)
    validate_sampling(SamplingOptions(max_tokens=0, min_tokens=0), INFO, prefill_only=True)
    for bad in (-1, 6):
        with pytest.raises(InvalidRequest, match=r"^min_tokens"):
            validate_sampling(SamplingOptions(max_tokens=5, min_tokens=bad), INFO)


def test_normalised_values() -> None:
    assert validate_sampling(_options("top_k", -1), INFO).top_k == 0
    assert validate_sampling(_options("top_k", 100), INFO).top_k == 0  # the whole vocabulary
    assert validate_sampling(_options("top_k", 99), INFO).top_k == 99
    # -1 logprobs: every token, if the server allows that many.
    with pytest.raises(InvalidRequest, match=r"^logprobs must be -1 \(every token\) or in"):
        validate_sampling(_options("logprobs", -1), INFO)
    every = replace(INFO, max_logprobs=INFO.vocab_size)
    options = validate_sampling(replace(_options("logprobs", -1), prompt_logprobs=-1), every)
    assert (options.logprobs, options.prompt_logprobs) == (100, 100)
    untouched = SamplingOptions(top_k=5, logprobs=3)
    assert validate_sampling(untouched, INFO) is untouched


def test_token_ids_name_the_first_one_outside_the_vocabulary() -> None:
    check_token_ids([], INFO, "prompt")
    check_token_ids([0, 99], INFO, "prompt")
    for ids, message in (
        ([5, 100, 101], "prompt[1] is 100; token ids must be in [0, 100)"),
        ([-1], "prompt[0] is -1; token ids must be in [0, 100)"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            check_token_ids(ids, INFO, "prompt")
        assert refused.value.message == message and refused.value.param == "prompt"


def test_prompt_fit_at_and_past_the_context() -> None:
    check_fit(63, 1, INFO)
    check_fit(1, 63, INFO)
    check_fit(63, 0, INFO)  # prefill only: one position for the token vLLM samples
    for prompt_len, max_tokens, param in ((63, 2, "max_tokens"), (64, 0, "prompt")):
        with pytest.raises(ContextLengthExceeded) as refused:
            check_fit(prompt_len, max_tokens, INFO)
        assert refused.value.param == param
        assert refused.value.code == "context_length_exceeded"
        assert "maximum context length is 64 tokens" in refused.value.message
    with pytest.raises(InvalidRequest, match=r"^messages holds no tokens") as empty:
        check_fit(0, 1, INFO, {"prompt": "messages"})
    assert not isinstance(empty.value, ContextLengthExceeded)


def test_tokens_only_stored_may_fill_the_context_or_be_none() -> None:
    check_fit(0, 0, INFO, stored_only=True)
    check_fit(64, 0, INFO, stored_only=True)
    with pytest.raises(ContextLengthExceeded):
        check_fit(65, 0, INFO, stored_only=True)


def test_check_prompt_is_vocabulary_then_fit() -> None:
    check_prompt([1, 2], 62, INFO)
    with pytest.raises(InvalidRequest, match=r"^prompt_ids\[0\]\[1\] is 100"):
        check_prompt([1, 100], 1, INFO, {"prompt": "prompt_ids[0]"})
    with pytest.raises(ContextLengthExceeded, match=r"2 in prompt_ids\[0\], 63 for"):
        check_prompt([1, 2], 63, INFO, {"prompt": "prompt_ids[0]"})


def test_vllm_accepts_what_we_accept_and_refuses_what_we_refuse() -> None:
    """Our limits against vLLM's own `SamplingParams`: every value accepted here is
    accepted there, and each refused value that vLLM checks itself raises there."""
    sampling_params = pytest.importorskip("vllm.sampling_params")
    from vllm.exceptions import VLLMValidationError

    fields = {"seed", "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"}
    fields |= {"repetition_penalty", "max_tokens", "stop"}

    def vllm(field: str, value: Any) -> object:
        # vLLM takes lists where we hold tuples.
        return sampling_params.SamplingParams(**{field: list(value) if field == "stop" else value})

    for field, accepted, refused in LIMITS:
        if field not in fields:
            continue
        for value in accepted:
            vllm(field, getattr(validate_sampling(_options(field, value), INFO), field))
        for value in refused:
            if field == "seed":
                continue  # vLLM's server bounds it (int64), not SamplingParams
            with pytest.raises(VLLMValidationError):
                vllm(field, value)


def test_n_above_one_is_refused_when_greedy_as_vllm_refuses_it() -> None:
    """vLLM's `SamplingParams._verify_greedy_sampling`: n > 1 only when sampling (the
    choices of a greedy request would be copies). Only temperature 0 is greedy there."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    greedy = SamplingOptions(max_tokens=4, temperature=0.0)
    validate_sampling(greedy, INFO, n=1)
    with pytest.raises(InvalidRequest) as refused:
        validate_sampling(greedy, INFO, {"n": "config.n"}, n=2)
    assert refused.value.param == "config.n"
    assert refused.value.message == (
        "config.n must be 1 when using greedy sampling (temperature 0), got 2"
    )
    with pytest.raises(VLLMValidationError, match="n must be 1 when using greedy sampling"):
        SamplingParams(n=2, temperature=0.0)
    for temperature in (1e-9, 0.5):  # vLLM raises (0, 0.01) to 0.01: sampling, not greedy
        validate_sampling(replace(greedy, temperature=temperature), INFO, n=2)
        SamplingParams(n=2, temperature=temperature)
