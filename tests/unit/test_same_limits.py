"""One limit, every protocol: the same out-of-range value is refused by each protocol's
core with the same rule, and the error names that protocol's own field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from google.protobuf import struct_pb2, text_format

from app.engine.models import ServedModel
from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocols.anthropic.exchange import MessagesExchange
from app.protocols.evergreen.generate import plan_action
from app.protocols.graphpipe.decode import InferCall
from app.protocols.graphpipe.inference import InferExchange
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange
from app.protocols.openai.responses.exchange import ResponsesExchange
from app.protocols.openai.responses.items import read_input
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.sessions import Limits, SessionStore
from schemas import evergreen_pb2
from schemas import salience_pb2 as salience
from schemas.anthropic import AnthropicMessagesRequest
from schemas.openai import ChatCompletionRequest, CompletionRequest
from schemas.openai_responses import ResponsesRequest
from tests.fake_engine import FakeEngine

ENGINE = FakeEngine(max_model_len=64)  # vocabulary: 256 ids
INFO = ENGINE.info
OPENAI: dict[str, Any] = {"response_id": "x", "created": 0, "served": ServedModel("fake", None)}

Refuse = Callable[[str, Any], InvalidRequest]


def _refused(build: Callable[[], object]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        build()
    return refused.value


def completions(field: str, value: Any) -> InvalidRequest:
    body = CompletionRequest.model_validate({"prompt": "ab", "max_tokens": 2, field: value})
    return _refused(lambda: CompletionExchange(body, INFO, ENGINE.tokenizer, **OPENAI))


def chat(field: str, value: Any) -> InvalidRequest:
    extra = {"logprobs": True, "top_logprobs": value} if field == "logprobs" else {field: value}
    body = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2, **extra}
    )
    return _refused(lambda: ChatExchange(body, INFO, ENGINE.tokenizer, **OPENAI))


def anthropic(field: str, value: Any) -> InvalidRequest:
    name = {"stop": "stop_sequences"}.get(field, field)
    body = AnthropicMessagesRequest.model_validate(
        {"model": "fake", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2}
        | {name: value}
    )
    return _refused(
        lambda: MessagesExchange(
            body, INFO, ENGINE.tokenizer, message_id="x", served=ServedModel("fake", None)
        )
    )


def responses(field: str, value: Any) -> InvalidRequest:
    names = {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}
    extra = {"include": ["message.output_text.logprobs"]} if field == "logprobs" else {}
    body = ResponsesRequest.model_validate(
        {"input": "a", "max_output_tokens": 2, **extra, names.get(field, field): value}
    )
    return _refused(
        lambda: ResponsesExchange(
            body,
            INFO,
            ENGINE.tokenizer,
            response_id="x",
            created_at=0,
            served=ServedModel("fake", None),
            input_items=read_input(body.input),
        )
    )


def graphpipe(field: str, value: Any) -> InvalidRequest:
    prompts = np.empty(1, dtype=object)
    prompts[:] = [b"ab"]
    config = json.dumps({"max_tokens": 2, field: value}).encode()
    call = InferCall(config, (), (prompts,), ())
    return _refused(
        lambda: InferExchange(call, INFO, ENGINE.tokenizer, request_id="r", lora_name=None)
    )


def evergreen(field: str, value: Any) -> InvalidRequest:
    action = text_format.Parse(
        'name: "GENERATE" inputs { name: "prompt" id: "p" }', evergreen_pb2.Action()
    )
    struct = struct_pb2.Struct()
    struct.update({field: value} if field == "max_tokens" else {"maxTokens": 2, field: value})
    action.configs.add().Pack(struct)
    return _refused(lambda: plan_action(action, INFO, lambda name: False))


def salience_(field: str, value: Any) -> InvalidRequest:
    store = SessionStore("fake", Limits(max_model_len=INFO.max_model_len), lambda: 0.0)
    sid = store.open("fake").session_id
    name = {"logprobs": "logprob_top_k"}.get(field, field)
    request = salience.GenerateRequest(session_id=sid, append_tokens=[1, 2], max_tokens=2)
    if isinstance(value, list):
        getattr(request, name).extend(value)
    else:
        setattr(request, name, value)
    refused = _refused(lambda: GenerateCall(store, request, INFO, "r"))
    assert store.get(sid).tokens.tolist() == []  # refused before the session was touched
    return refused


PROTOCOLS: dict[str, tuple[Refuse, Callable[[str], str]]] = {
    "openai completions": (completions, lambda field: field),
    "openai chat": (chat, lambda field: {"logprobs": "top_logprobs"}.get(field, field)),
    "anthropic": (anthropic, lambda field: {"stop": "stop_sequences"}.get(field, field)),
    "openai responses": (
        responses,
        lambda field: {"logprobs": "top_logprobs", "max_tokens": "max_output_tokens"}.get(
            field, field
        ),
    ),
    "graphpipe": (graphpipe, lambda field: f"config.{field}"),
    "evergreen": (evergreen, lambda field: f"GENERATE config {field!r}"),
    "salience": (salience_, lambda field: {"logprobs": "logprob_top_k"}.get(field, field)),
}

# (neutral field, the value sent, the rule every protocol states, protocols that have it)
CASES = [
    ("temperature", 2.5, "must be in [0, 2], got 2.5", set(PROTOCOLS)),
    ("top_p", 1.5, "must be in (0, 1], got 1.5", set(PROTOCOLS)),
    (
        "top_k",
        -2,
        "must be -1 or 0 (every token), or at least 1, got -2",
        {
            "openai completions",
            "openai chat",
            "openai responses",
            "anthropic",
            "graphpipe",
            "evergreen",
        },
    ),
    (
        "seed",
        2**63,
        f"must be an integer in [-2**63, 2**63), got {2**63}",
        {"openai completions", "openai chat", "openai responses", "graphpipe", "evergreen"},
    ),
    (
        "stop",
        ["a", ""],
        "must not contain an empty string",
        {
            "openai completions",
            "openai chat",
            "openai responses",
            "anthropic",
            "graphpipe",
            "evergreen",
        },
    ),
    (
        "stop_token_ids",
        [7, 256],
        "[1] is 256; token ids must be in [0, 256)",
        {"openai completions", "openai chat", "openai responses", "salience"},
    ),
    (
        "logprobs",
        21,
        "must be -1 (every token) or in [0, 20], got 21",
        {"openai completions", "openai chat", "openai responses", "salience"},
    ),
]


@pytest.mark.parametrize(
    ("protocol", "field", "value", "rule"),
    [
        (protocol, field, value, rule)
        for field, value, rule, protocols in CASES
        for protocol in sorted(protocols)
    ],
)
def test_the_same_value_is_refused_with_the_same_rule_naming_the_protocols_field(
    protocol: str, field: str, value: Any, rule: str
) -> None:
    refuse, name_of = PROTOCOLS[protocol]
    error = refuse(field, value)
    name = name_of(field)
    assert type(error) is InvalidRequest
    assert error.message == f"{name} {rule}" or error.message == f"{name}{rule}"
    assert error.param == name


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_max_tokens_past_the_context_is_a_context_error_naming_the_field(protocol: str) -> None:
    refuse, name_of = PROTOCOLS[protocol]
    error = refuse("max_tokens", 1000)
    assert isinstance(error, ContextLengthExceeded)
    assert error.grpc_status == "RESOURCE_EXHAUSTED" and error.http_status == 400
    name = name_of("max_tokens")
    assert error.param == name and name in error.message
