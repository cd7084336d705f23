"""The GraphPipe inference core, synchronously: which input, its validation, the config,
the engine requests it plans, and the output tensors it assembles from engine events."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from app.engine.base import EngineInfo, SamplingOptions, TokenEvent, TokenLogprob
from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocols.graphpipe.config import InferConfig, parse_config
from app.protocols.graphpipe.decode import InferCall
from app.protocols.graphpipe.inference import InferExchange, admission_units
from app.protocols.graphpipe.model import describe
from tests.fake_engine import FakeTokenizer

INFO = EngineInfo(
    model_name="base",
    model_path="/m",
    max_model_len=64,
    vocab_size=100,
    eos_token_ids=(0,),
    has_chat_template=False,
    max_loras=1,
)


def strings(*values: bytes) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def call(
    *inputs: np.ndarray,
    input_names: tuple[str, ...] = (),
    output_names: tuple[str, ...] = (),
    config: dict[str, Any] | bytes = b"",
) -> InferCall:
    raw = config if isinstance(config, bytes) else json.dumps(config).encode()
    return InferCall(raw, input_names, inputs, output_names)


class Bytes(FakeTokenizer):
    """The fake's tokenizer with one id per UTF-8 byte, in the vocabulary of 100 (the
    exchange's only use of a tokenizer is `encode`)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b % 100 for b in text.encode()]


def exchange(c: InferCall, lora: str | None = None) -> InferExchange:
    return InferExchange(c, INFO, Bytes(), request_id="r", lora_name=lora)


def refused(c: InferCall) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as raised:
        exchange(c)
    return raised.value


# Inputs


def test_a_string_batch_becomes_one_tokenized_request_per_prompt() -> None:
    plan = exchange(call(strings(b"hello", "é".encode())), lora="adapter")
    assert [(r.request_id, r.prompt_text, r.prompt_token_ids) for r in plan.requests] == [
        ("r-0", None, [4, 1, 8, 8, 11]),
        ("r-1", None, [95, 69]),
    ]
    assert all(r.lora_name == "adapter" for r in plan.requests)
    assert plan.requests[0].sampling == SamplingOptions()  # max_tokens 16, temperature 1


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_padded_id_rows_become_token_prompts(dtype: type) -> None:
    ids: np.ndarray = np.array([[5, 6, 7], [8, -1, -1], [9, 10, -1]], dtype=dtype)
    plan = exchange(call(ids))
    assert [list(r.prompt_token_ids or ()) for r in plan.requests] == [[5, 6, 7], [8], [9, 10]]
    assert all(r.prompt_text is None for r in plan.requests)


def test_input_names_pick_the_input() -> None:
    plan = exchange(call(np.array([[1, 2]]), input_names=("prompt_ids",)))
    assert list(plan.requests[0].prompt_token_ids or ()) == [1, 2]


@pytest.mark.parametrize(
    ("c", "message"),
    [
        (call(), "no input tensor"),
        (call(strings(b"a"), input_names=("prompt", "x")), "2 names for 1 input tensors"),
        (call(strings(b"a"), input_names=("image",)), "Unknown input `image`"),
        (call(strings(b"a"), np.array([[1]])), "exactly one input tensor"),
        (call(np.array([[1]]), input_names=("prompt",)), "`prompt` must be a String tensor"),
        (call(strings(b"a"), input_names=("prompt_ids",)), "Int64 or Int32 tensor; got String"),
        (call(np.array([[1.0]])), "Int64 or Int32 tensor; got Float64"),
        (call(np.array([[1]], dtype=np.uint8)), "Int64 or Int32 tensor; got Uint8"),
        (call(strings(b"a", b"b").reshape(1, 2)), "shape [n] with n >= 1; got [1, 2]"),
        (call(strings()), "shape [n] with n >= 1; got [0]"),
        (call(strings(b"ok", b"\xff")), "prompt[1] is not valid UTF-8"),
        (call(np.array([1, 2])), "shape [n, m] with n, m >= 1; got [2]"),
        (call(np.zeros((2, 0), np.int64)), "got [2, 0]"),
        (call(np.array([[1, -1, 2]])), "prompt_ids[0] has padding (-1) at 1 before a token id"),
        (call(np.array([[1], [-2]])), "prompt_ids[1][0] is -2; token ids must be in [0, 100)"),
        (call(np.array([[1, 100]])), "prompt_ids[0][1] is 100"),
        (call(np.array([[1], [-1]])), "prompt_ids[1] has no token ids"),
        (call(strings(b"a"), output_names=("text", "pixels")), "Unknown output `pixels`"),
    ],
)
def test_bad_inputs_and_outputs_are_refused_by_name(c: InferCall, message: str) -> None:
    assert message in refused(c).message


def test_id_prompts_that_cannot_fit_the_context_are_refused_before_any_request() -> None:
    ids = np.array([[1] * 60, [1, -1] + [-1] * 58])
    with pytest.raises(ContextLengthExceeded, match=r"60 in prompt_ids\[0\], 5 for the completion"):
        exchange(call(ids, config={"max_tokens": 5}))
    assert len(exchange(call(ids, config={"max_tokens": 4})).requests) == 2


def test_text_prompts_that_cannot_fit_the_context_are_refused_by_name() -> None:
    with pytest.raises(ContextLengthExceeded, match=r"61 in prompt\[1\]"):
        exchange(call(strings(b"a", b"b" * 61), config={"max_tokens": 4}))


def test_admission_units_are_read_from_the_input_alone() -> None:
    assert admission_units(call(strings(b"hello", "é".encode()))) == [5 + 8, 2 + 8]
    ids = np.array([[5, 6, 7], [8, -1, -1]], dtype=np.int32)
    assert admission_units(call(ids)) == [3, 1]
    with pytest.raises(InvalidRequest, match="has no token ids"):
        admission_units(call(np.array([[1], [-1]])))


# Config


def test_config_maps_onto_sampling_options() -> None:
    plan = exchange(
        call(
            strings(b"a"),
            output_names=("logprobs",),
            config={
                "max_tokens": 7,
                "temperature": 0,
                "top_p": 0.5,
                "top_k": -1,
                "seed": 3,
                "stop": "\n",
            },
        )
    )
    assert plan.requests[0].sampling == SamplingOptions(
        max_tokens=7, temperature=0.0, top_p=0.5, top_k=0, seed=3, stop=("\n",), logprobs=0
    )


def test_an_empty_config_means_every_default() -> None:
    assert parse_config(b"") == parse_config(b"  ") == parse_config(b"{}") == InferConfig()


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 65}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 2.0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": False}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"logprobs": 1}, "logprobs"),
        ({"temprature": 1}, "temprature"),
    ],
)
def test_an_invalid_config_names_the_field(config: dict[str, Any], field: str) -> None:
    error = refused(call(strings(b"a"), config=config))
    assert error.param == f"config.{field}"
    assert error.message.startswith(f"config.{field} ")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "config is not valid JSON"),
        (b"\xff\xfe", "config is not valid JSON"),
        (b'{"temperature": NaN}', "config.temperature must be a number; got NaN"),
        (b"[1, 2]", "config must be a JSON object of sampling parameters"),
        # Deeper than the stdlib parser's stack: a RecursionError, once a 500 (fuzz #5701).
        (b'{"max_tokens": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "config is not valid JSON"),
    ],
)
def test_a_config_that_is_not_a_json_object_is_refused(raw: bytes, message: str) -> None:
    assert message in refused(call(strings(b"a"), config=raw)).message


# Outputs


def _event(ids: list[int], text: str, finish: bool = False) -> TokenEvent:
    logprobs = [TokenLogprob(t, -t / 10, 1, {}) for t in ids]
    return TokenEvent(ids, text, logprobs, "length" if finish else None)


def test_outputs_are_padded_arrays_in_the_order_asked() -> None:
    plan = exchange(call(strings(b"a", b"b"), output_names=("logprobs", "text", "token_ids")))
    plan.feed(1, _event([4], "d"))
    plan.feed(0, _event([1, 2], "xy"))
    plan.feed(1, _event([5, 6], "ef"))
    plan.feed(0, _event([3], "z", finish=True))
    plan.feed(1, _event([], "", finish=True))
    logprobs, text, token_ids = plan.outputs()
    assert text.tolist() == [b"xyz", b"def"]
    assert token_ids.dtype == np.int64
    assert token_ids.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert logprobs.dtype == np.float32
    np.testing.assert_allclose(logprobs, [[-0.1, -0.2, -0.3], [-0.4, -0.5, -0.6]], rtol=1e-6)


def test_short_rows_are_padded_with_minus_one_and_nan() -> None:
    plan = exchange(call(strings(b"a", b"b"), output_names=("token_ids", "logprobs")))
    plan.feed(0, _event([7, 8], "", finish=True))
    plan.feed(1, _event([9], "", finish=True))
    token_ids, logprobs = plan.outputs()
    assert token_ids.tolist() == [[7, 8], [9, -1]]
    assert math.isnan(logprobs[1, 1]) and not math.isnan(logprobs[1, 0])


def test_default_outputs_are_text_then_logprobs_when_the_config_asks() -> None:
    assert exchange(call(strings(b"a"))).output_names == ("text",)
    with_logprobs = exchange(call(strings(b"a"), config={"logprobs": True}))
    assert with_logprobs.output_names == ("text", "logprobs")
    assert with_logprobs.requests[0].sampling.logprobs == 0
    assert exchange(call(strings(b"a"))).requests[0].sampling.logprobs is None


# Metadata


def test_metadata_declares_the_model_as_the_issue_defines_it() -> None:
    meta = describe("base", "1.2", INFO).to_json()
    io = [(i["name"], i["type"], i["shape"]) for i in meta["inputs"]]
    assert io == [("prompt", "String", [-1]), ("prompt_ids", "Int64", [-1, -1])]
    io = [(o["name"], o["type"], o["shape"]) for o in meta["outputs"]]
    assert io == [
        ("text", "String", [-1]),
        ("token_ids", "Int64", [-1, -1]),
        ("logprobs", "Float32", [-1, -1]),
    ]
    assert meta["name"] == "base" and meta["version"] == "1.2" and meta["server"] == "switchboard"
    assert "Language model `base`" in meta["description"]
    for field in ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logprobs"):
        assert field in meta["description"]
    adapter = describe("mine", "1.2", INFO).to_json()
    assert "LoRA adapter `mine` of the language model `base`" in adapter["description"]
