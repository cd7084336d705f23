"""OpenAI's structured-output fields and logit_bias -> the neutral constraint, without an
engine (the fake's backend compiles anything not marked UNCOMPILABLE)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from app.engine.constraints import Constraint
from app.engine.models import ServedModel
from app.errors import InvalidRequest
from app.protocols.openai.chat import ChatExchange
from app.protocols.openai.completions import CompletionExchange
from schemas.openai import ChatCompletionRequest, CompletionRequest
from tests.fake_engine import FakeEngine

ENGINE = FakeEngine(max_model_len=64)
ARGS: dict[str, Any] = {"response_id": "cmpl-1", "created": 1, "served": ServedModel("fake", None)}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def completion(**body: object) -> CompletionExchange:
    return CompletionExchange(
        CompletionRequest.model_validate({"prompt": "a", **body}),
        ENGINE.info,
        ENGINE.tokenizer,
        **ARGS,
    )


def chat(**body: object) -> ChatExchange:
    return ChatExchange(
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hi"}], **body}
        ),
        ENGINE.info,
        ENGINE.tokenizer,
        **ARGS,
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"response_format": {"type": "text"}}, None),
        (
            {"response_format": {"type": "json_object"}},
            Constraint("json_object", None, "response_format"),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            Constraint("json", json.dumps(SCHEMA), "response_format.json_schema.schema"),
        ),
        (
            {"structured_outputs": {"regex": "[a-z]+"}},
            Constraint("regex", "[a-z]+", "structured_outputs.regex"),
        ),
        (
            {"structured_outputs": {"choice": ["x", "y"]}},
            Constraint("choice", ("x", "y"), "structured_outputs.choice"),
        ),
        (
            {"structured_outputs": {"grammar": 'root ::= "a"'}},
            Constraint("grammar", 'root ::= "a"', "structured_outputs.grammar"),
        ),
        (
            {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
            Constraint("json", json.dumps(SCHEMA), "structured_outputs.json"),
        ),
        # response_format wins over structured_outputs, as in vllm serve
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            Constraint("json_object", None, "response_format"),
        ),
    ],
)
@pytest.mark.parametrize("make", [completion, chat])
def test_constraint_reaches_every_choice(
    make: Callable[..., CompletionExchange | ChatExchange],
    body: dict[str, object],
    expected: Constraint | None,
) -> None:
    exchange = make(n=2, **body)
    assert [p.request.sampling.constraint for p in exchange.plans] == [expected, expected]


def test_logit_bias_is_passed_as_sorted_pairs() -> None:
    exchange = completion(logit_bias={"7": -100, "3": 2.5})
    assert exchange.plans[0].request.sampling.logit_bias == ((3, 2.5), (7, -100.0))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": "{nope"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"UNCOMPILABLE": 1}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
        ({"structured_outputs": {"regex": "a\x00"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "  "}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
        ({"structured_outputs": {"regex": "UNCOMPILABLE"}}, "structured_outputs.regex"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ],
)
@pytest.mark.parametrize("make", [completion, chat])
def test_bad_constraints_name_the_field(
    make: Callable[..., CompletionExchange | ChatExchange], body: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make(**body)
    assert caught.value.param == param
