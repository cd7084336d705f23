"""The OpenAI core without an engine: request -> plans, events -> bodies and chunks."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.engine.base import TokenEvent, TokenLogprob
from app.engine.models import ServedModel
from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange
from schemas.openai import ChatCompletionRequest, CompletionRequest
from tests.fake_engine import FakeEngine

ENGINE = FakeEngine(max_model_len=64)
ARGS: dict[str, Any] = {"response_id": "cmpl-1", "created": 1, "served": ServedModel("fake", None)}


def completion(**body: object) -> CompletionExchange:
    return CompletionExchange(
        CompletionRequest.model_validate(body), ENGINE.info, ENGINE.tokenizer, **ARGS
    )


def chat(**body: object) -> ChatExchange:
    return ChatExchange(
        ChatCompletionRequest.model_validate(body), ENGINE.info, ENGINE.tokenizer, **ARGS
    )


def lp(token: int, value: float = -1.0, top: dict[int, float] | None = None) -> TokenLogprob:
    return TokenLogprob(token_id=token, logprob=value, rank=1, top=top or {token: value})


def test_plans_one_request_per_prompt_and_choice_with_seed_offsets() -> None:
    exchange = completion(prompt=["ab", "c"], n=2, seed=10, max_tokens=3)
    assert [(p.index, p.prompt_index) for p in exchange.plans] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [p.request.sampling.seed for p in exchange.plans] == [10, 11, 10, 11]
    assert exchange.plans[0].request.prompt_token_ids == [97, 98]
    assert len({p.request.request_id for p in exchange.plans}) == 4


def test_token_prompts_and_default_max_tokens_fill_the_context() -> None:
    exchange = completion(prompt=[[1, 2, 3]], max_tokens=None)
    assert exchange.plans[0].request.prompt_token_ids == [1, 2, 3]
    assert exchange.plans[0].request.sampling.max_tokens == 61


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"prompt": "a" * 60, "max_tokens": 10}, ContextLengthExceeded, "max_tokens"),
        ({"prompt": [[1, 999]]}, InvalidRequest, "prompt"),
        ({"prompt": []}, InvalidRequest, "prompt"),
        ({"prompt": "a", "suffix": "b"}, InvalidRequest, "suffix"),
        ({"prompt": "a", "logit_bias": {"256": 2.0}}, InvalidRequest, "logit_bias"),
        ({"prompt": "a", "stop": [""]}, InvalidRequest, "stop"),
        ({"prompt": "a", "max_tokens": 0}, InvalidRequest, "max_tokens"),
    ],
)
def test_bad_completion_requests(
    body: dict[str, object], error: type[InvalidRequest], param: str
) -> None:
    with pytest.raises(error) as caught:
        completion(**body)
    assert caught.value.param == param


def test_completion_response_with_echo_and_logprobs() -> None:
    exchange = completion(prompt="ab", max_tokens=2, echo=True, logprobs=1)
    assert exchange.plans[0].request.sampling.prompt_logprobs == 1
    exchange.feed(
        0,
        TokenEvent(
            token_ids=[99],
            text="c",
            logprobs=[lp(99, -0.5, {99: -0.5})],
            prompt_token_ids=[97, 98],
            prompt_logprobs=[None, lp(98, -2.0, {97: -1.0})],
        ),
    )
    exchange.feed(
        0,
        TokenEvent(
            token_ids=[100], text="d", logprobs=[lp(100, -math.inf)], finish_reason="length"
        ),
    )
    body = exchange.response()
    choice = body["choices"][0]
    assert choice["text"] == "abcd"
    assert choice["finish_reason"] == "length"
    assert choice["logprobs"] == {
        "tokens": ["a", "b", "c", "d"],
        "token_logprobs": [None, -2.0, -0.5, -9999.0],
        "top_logprobs": [None, {"a": -1.0, "b": -2.0}, {"c": -0.5}, {"d": -9999.0}],
        "text_offset": [0, 1, 2, 3],
    }
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


def test_completion_chunks_and_usage_chunk() -> None:
    exchange = completion(
        prompt="ab", max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    first = exchange.chunks(0, TokenEvent(token_ids=[99], text="c", prompt_token_ids=[97, 98]))
    last = exchange.chunks(0, TokenEvent(token_ids=[100], text="d", finish_reason="length"))
    assert first[0]["choices"][0] == {
        "index": 0,
        "text": "c",
        "logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
    }
    assert first[0]["usage"] is None
    assert last[0]["choices"][0]["finish_reason"] == "length"
    assert exchange.usage_chunk() == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "fake",
        "choices": [],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }


def test_chat_template_and_stream_order() -> None:
    exchange = chat(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert exchange.plans[0].request.prompt_token_ids == ENGINE.tokenizer.encode(
        "[user]hi\n[assistant]"
    )
    chunks = exchange.chunks(0, TokenEvent(token_ids=[120], text="x", prompt_token_ids=[1]))
    chunks += exchange.chunks(
        0, TokenEvent(token_ids=[121], text="y", finish_reason="stop", stop_reason=121)
    )
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "x"}, {"content": "y"}]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_chat_logprobs_shape_and_max_completion_tokens() -> None:
    exchange = chat(
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=9,
        max_completion_tokens=3,
        logprobs=True,
        top_logprobs=1,
    )
    assert exchange.plans[0].request.sampling.max_tokens == 3
    assert exchange.plans[0].request.sampling.logprobs == 1
    exchange.feed(
        0,
        TokenEvent(
            token_ids=[120],
            text="x",
            logprobs=[lp(120, -0.25)],
            finish_reason="length",
            prompt_token_ids=[1, 2],
        ),
    )
    message = exchange.response()["choices"][0]
    assert message["message"] == {"role": "assistant", "content": "x"}
    assert message["logprobs"] == {
        "content": [
            {
                "token": "x",
                "logprob": -0.25,
                "bytes": [120],
                "top_logprobs": [{"token": "x", "logprob": -0.25, "bytes": [120]}],
            }
        ]
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tokens": 100}, "max_tokens"),
    ],
)
def test_bad_chat_requests(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat(messages=[{"role": "user", "content": "hi"}], **body)
    assert caught.value.param == param
