"""Structured outputs and logit_bias through the `openai` SDK, unchanged, on real vLLM:
the tiny model's weights are random, so only the structured-output backend can make its
output match; each sample is checked with jsonschema, a regex or the choice list."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema
from pydantic import BaseModel, Field

from tests.conftest import LiveServer
from tests.json_text import whitespace_outside_strings

pytestmark = pytest.mark.e2e

# Every string and number is bounded, so a random model finishes inside max_tokens.
SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]{2}$"},
        "inner": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["x", "y"]}},
            "required": ["ok", "kind"],
            "additionalProperties": False,
        },
    },
    "required": ["colour", "code", "inner"],
    "additionalProperties": False,
}
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Describe a thing as JSON."}
]
# Sent as clients of vllm serve send it; vLLM 0.32 takes the whitespace policy from the
# server's --structured-outputs-config (the live server disables free whitespace, which a
# random model rarely stops writing).
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


class Inner(BaseModel):
    ok: bool
    kind: Literal["x", "y"]


class Thing(BaseModel):
    colour: Literal["red", "green", "blue"]
    code: str = Field(pattern=r"^[a-z]{2}-[0-9]{2}$")
    inner: Inner


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0)


def _format() -> ResponseFormatJSONSchema:
    return {
        "type": "json_schema",
        "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
    }


def test_parse_returns_a_parsed_pydantic_object(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    result = client.chat.completions.parse(
        model=live_server.model,
        messages=MESSAGES,
        response_format=Thing,
        max_tokens=200,
        seed=1,
        extra_body=COMPACT,
    )
    choice = result.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Thing)


def test_json_schema_on_every_sample_of_chat(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    result = client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format=_format(),
        n=4,
        max_tokens=200,
        temperature=1.0,
        seed=3,
        extra_body=COMPACT,
    )
    for choice in result.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "tags"],
    "additionalProperties": False,
}


def test_bounded_strings_are_json_on_every_sample(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    """Strings with a length bound, where xgrammar 0.2.8 takes raw control characters
    and UTF-8-encoded surrogates (app/engine/vllm/json_grammar.py): 30 samples at
    temperature 1 (a one-in-ten failure escapes 4% of the time) are JSON, parsed
    strictly, valid for the schema, with no whitespace between tokens (the server's
    `disable_any_whitespace`)."""
    texts = []
    for seed in (0, 10, 20):  # choice j of a request seeded s is seeded s + j
        result = client.chat.completions.create(
            model=live_server.model,
            messages=MESSAGES,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bounded", "schema": BOUNDED, "strict": True},
            },
            n=10,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
        )
        texts += [(c.finish_reason, c.message.content or "") for c in result.choices]
    for finish, text in texts:
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), BOUNDED)
        assert not whitespace_outside_strings(text), text


def test_json_schema_streamed(client: openai.OpenAI, live_server: LiveServer) -> None:
    stream = client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        response_format=_format(),
        max_tokens=200,
        stream=True,
        seed=4,
        extra_body=COMPACT,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_and_json_object_on_completions(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    result = client.completions.create(
        model=live_server.model,
        prompt="JSON:",
        max_tokens=200,
        n=3,
        seed=5,
        extra_body={"response_format": _format(), **COMPACT},
    )
    for choice in result.choices:
        jsonschema.validate(json.loads(choice.text), SCHEMA)
    result = client.completions.create(
        model=live_server.model,
        prompt="JSON:",
        max_tokens=40,
        seed=5,
        extra_body={"structured_outputs": {"json_object": True}},
    )
    # A random model may run out of tokens inside the object; what it wrote is a prefix of
    # a JSON object either way.
    assert result.choices[0].text.lstrip().startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_choice_and_regex_on_completions(
    client: openai.OpenAI, live_server: LiveServer, stream: bool
) -> None:
    choices = ["alpha", "beta", "gamma delta"]
    pattern = r"[a-c]{3}-[0-9]{1,3}"
    for extra, check in (
        ({"structured_outputs": {"choice": choices}}, lambda text: text in choices),
        ({"structured_outputs": {"regex": pattern}}, lambda text: re.fullmatch(pattern, text)),
    ):
        for seed in range(3):
            result = client.completions.create(
                model=live_server.model,
                prompt="Pick:",
                max_tokens=20,
                seed=seed,
                stream=stream,
                extra_body=extra,
            )
            if isinstance(result, openai.Stream):
                text = "".join(chunk.choices[0].text for chunk in result if chunk.choices)
            else:
                text = result.choices[0].text
            assert check(text), (extra, text)


def test_grammar_on_chat(client: openai.OpenAI, live_server: LiveServer) -> None:
    grammar = 'root ::= ("yes" | "no") " " [0-9]'
    result = client.chat.completions.create(
        model=live_server.model,
        messages=MESSAGES,
        max_tokens=10,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    assert re.fullmatch(r"(yes|no) [0-9]", result.choices[0].message.content or "")


def test_logit_bias_is_honoured(client: openai.OpenAI, live_server: LiveServer) -> None:
    token = httpx.post(f"{live_server.base_url}/tokenize", json={"prompt": "zebra"}).json()[
        "tokens"
    ][0]
    result = client.completions.create(
        model=live_server.model,
        prompt="def main():",
        max_tokens=5,
        temperature=0,
        logit_bias={str(token): 100},
        extra_body={"ignore_eos": True},
        logprobs=1,
    )
    ids = httpx.post(
        f"{live_server.base_url}/tokenize", json={"prompt": result.choices[0].text}
    ).json()
    assert ids["tokens"] and set(ids["tokens"]) == {token}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "structured_outputs.grammar"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ],
)
def test_invalid_constraints_are_400_naming_the_field(
    live_server: LiveServer, extra: dict[str, object], param: str
) -> None:
    for path, body in (
        ("/v1/completions", {"prompt": "a", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3}),
    ):
        for stream in (False, True):
            response = httpx.post(
                f"{live_server.base_url}{path}",
                json={**body, **extra, "stream": stream},
                timeout=60,
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param
    # The engine survived every one of them.
    ok = httpx.post(
        f"{live_server.base_url}/v1/completions",
        json={"prompt": "a", "max_tokens": 3, "structured_outputs": {"choice": ["x"]}},
        timeout=60,
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "x"
    assert live_server.wait_idle() == 0


def test_graphpipe_config_constraint_is_enforced(live_server: LiveServer) -> None:
    import numpy as np

    from tests.graphpipe_client import Infer, infer_request, read_infer_response

    url = f"{live_server.base_url}/graphpipe"
    prompts = np.empty(3, dtype=object)
    prompts[:] = [b"a", b"b", b"c"]
    config = {"max_tokens": 10, "constraint": {"choice": ["north", "south"]}}
    response = httpx.post(
        url, content=infer_request(Infer([prompts], config=json.dumps(config))), timeout=120
    )
    answer = read_infer_response(response.content)
    assert answer.errors == []
    assert {t.decode() for t in answer.outputs[0].tolist()} <= {"north", "south"}
    bad = {"constraint": {"regex": "(unclosed"}}
    response = httpx.post(
        url, content=infer_request(Infer([prompts], config=json.dumps(bad))), timeout=60
    )
    [(code, message)] = read_infer_response(response.content).errors
    assert code == 400 and "config.constraint.regex" in message
