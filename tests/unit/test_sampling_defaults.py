"""The model's sampling defaults (its generation_config.json, as vLLM reads it) where an
OpenAI- or Anthropic-shaped request is silent, as `vllm serve` applies them: a request's
value, else the model's, else the API's."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.engine.base import SamplingDefaults, SamplingOptions
from app.engine.models import ServedModel
from app.engine.vllm.params import model_sampling_defaults
from app.protocols.anthropic.messages import conversation
from app.protocols.conversation.plan import plan_conversation
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange
from app.protocols.openai.responses.request import sampling as responses_sampling
from schemas.anthropic import AnthropicMessagesRequest
from schemas.openai import ChatCompletionRequest, CompletionRequest
from schemas.openai_responses import ResponsesRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import FakeEngine

ENGINE = FakeEngine(max_model_len=64)
MODEL = SamplingDefaults(
    temperature=0.7, top_p=0.8, top_k=20, min_p=0.05, repetition_penalty=1.05, max_tokens=7
)
INFO = replace(ENGINE.info, sampling_defaults=MODEL)
ARGS: dict[str, Any] = {"response_id": "r-1", "created": 1, "served": ServedModel("fake", None)}


def _model_of(options: SamplingOptions) -> tuple[float, float, int, float, float]:
    return (
        options.temperature,
        options.top_p,
        options.top_k,
        options.min_p,
        options.repetition_penalty,
    )


MODELS = (0.7, 0.8, 20, 0.05, 1.05)


def test_vllm_reads_the_models_generation_config(tmp_path: Path) -> None:
    from vllm.config import ModelConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model_path(), model, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((model / "generation_config.json").read_text())
    config.update(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    config["max_new_tokens"] = 7
    (model / "generation_config.json").write_text(json.dumps(config))
    assert model_sampling_defaults(ModelConfig(model=str(model))) == replace(MODEL, min_p=0.0)
    # `--generation-config vllm`: the APIs' own defaults.
    neutral = ModelConfig(model=str(model), generation_config="vllm")
    assert model_sampling_defaults(neutral) == SamplingDefaults()
    # The tiny model sets none.
    assert model_sampling_defaults(ModelConfig(model=str(tiny_model_path()))) == (
        SamplingDefaults()
    )


def test_completions_and_chat_take_the_models_defaults_where_silent() -> None:
    body = CompletionRequest.model_validate({"prompt": "ab"})
    options = CompletionExchange(body, INFO, ENGINE.tokenizer, **ARGS).plans[0].request.sampling
    # Completions' own max_tokens default (16, OpenAI's) is a value: only a null leaves
    # the limit to the model, as in `vllm serve`.
    assert (_model_of(options), options.max_tokens) == (MODELS, 16)
    body = CompletionRequest.model_validate({"prompt": "ab", "max_tokens": None})
    options = CompletionExchange(body, INFO, ENGINE.tokenizer, **ARGS).plans[0].request.sampling
    assert options.max_tokens == 7
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "a"}]})
    options = ChatExchange(chat, INFO, ENGINE.tokenizer, **ARGS).plans[0].request.sampling
    assert (_model_of(options), options.max_tokens) == (MODELS, 7)


def test_a_requests_own_values_win() -> None:
    given = {"temperature": 0.2, "top_p": 0.5, "top_k": 3, "min_p": 0.0}
    given |= {"repetition_penalty": 1.0, "max_tokens": 30}
    body = CompletionRequest.model_validate({"prompt": "ab", **given})
    options = CompletionExchange(body, INFO, ENGINE.tokenizer, **ARGS).plans[0].request.sampling
    assert (_model_of(options), options.max_tokens) == ((0.2, 0.5, 3, 0.0, 1.0), 30)


def test_the_models_output_limit_stays_within_the_context() -> None:
    info = replace(INFO, sampling_defaults=replace(MODEL, max_tokens=1000))
    body = CompletionRequest.model_validate({"prompt": [[1, 2, 3, 4]], "max_tokens": None})
    options = CompletionExchange(body, info, ENGINE.tokenizer, **ARGS).plans[0].request.sampling
    assert options.max_tokens == 60


def test_responses_takes_them() -> None:
    options = responses_sampling(ResponsesRequest.model_validate({"input": "a"}), MODEL)
    assert _model_of(options) == MODELS
    given = ResponsesRequest.model_validate({"input": "a", "temperature": 0.0})
    assert responses_sampling(given, MODEL).temperature == 0.0


@pytest.mark.parametrize("temperature", [None, 0.3])
def test_messages_take_them(temperature: float | None) -> None:
    body = AnthropicMessagesRequest.model_validate(
        {
            "model": "fake",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "a"}],
            **({"temperature": temperature} if temperature is not None else {}),
        }
    )
    call = conversation(body, INFO, request_id="m-1", lora_name=None)
    options = plan_conversation(call, INFO, ENGINE.tokenizer).requests[0].sampling
    expected = MODELS if temperature is None else (temperature, *MODELS[1:])
    # Anthropic's max_tokens is required: the model's limit never applies.
    assert (_model_of(options), options.max_tokens) == (expected, 5)
