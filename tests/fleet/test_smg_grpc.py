"""SMG in its gRPC mode (`smg launch --worker-urls grpc://... --model-path DIR`) in front
of the suite's two replicas: SMG applies the chat template, tokenizes, constrains and
parses tool calls and detokenizes in Rust; the replicas' `vllm.grpc.engine.VllmEngine`
service moves token ids. Through it, with the openai SDK unchanged: chat and completions
to both replicas (their `smg` admissions), a stream to its usage, forced tool calls SMG
parses (tool_choice required and named) and structured outputs (a JSON schema).

A random model meets every corner of the grammar SMG sends, so each property is sampled
`SAMPLES` times at temperature 1 (`n` choices a request): a one-in-ten failure escapes
with probability 0.9^30 = 4%. Every string and number of the schemas is bounded
(tests/e2e/test_tool_choice.py's and test_openai_structured.py's), so a correct server
finishes a named call and a structured output inside `max_tokens`, always. `required`
is SMG's own grammar: an array of calls with no bound on their number (SMG 1.13 drops
`parallel_tool_calls: false` from it), so a random model may call until the limit, and
such an answer is honestly cut (`length`); `REQUIRED_MAX_TOKENS` holds more calls than a
random model was seen to make. (Its rolling restart: tests/fleet/test_rolling_restart.py.)

How these fail: SMG never routes to a replica (its probe finds no service it knows), a
call SMG carries comes back in a shape the SDK cannot read, a forced call or a schema's
output does not parse or breaks its schema, or one replica is never chosen.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL
from tests.e2e.test_openai_structured import SCHEMA
from tests.e2e.test_tool_choice import (
    CHAT_N,
    CHAT_TOOLS,
    MAX_TOKENS,
    PROMPT,
    SAMPLES,
    SCHEMAS,
    Answer,
    check,
    gather,
)
from tests.fleet.conftest import admitted, stream_whole

pytestmark = pytest.mark.e2e

REQUIRED_MAX_TOKENS = 4 * MAX_TOKENS  # a call is under 90 tokens: seven calls, at least


@pytest.fixture(scope="module")
def url(fleet: Fleet) -> str:
    return f"{fleet.router('smg-grpc').url}/v1"


def _async_client(url: str) -> Callable[[], openai.AsyncOpenAI]:
    return lambda: openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)


def test_chat_and_completions_reach_both_replicas(fleet: Fleet, url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    before = admitted(fleet, "smg")
    for _ in range(len(fleet.replicas) * 2):
        chat = client.chat.completions.create(
            model=LIVE_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.usage is not None and chat.usage.prompt_tokens > 0
        assert chat.choices[0].finish_reason in ("stop", "length")
        completion = client.completions.create(model=LIVE_MODEL, prompt="def main():", max_tokens=4)
        assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 4
    after = admitted(fleet, "smg")
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    stream_whole(client, 12)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_are_parsed_by_smg(url: str, choice: str) -> None:
    named = choice == "named"
    tool_choice: Any = {"type": "function", "function": {"name": "get_time"}} if named else choice

    async def one(client: openai.AsyncOpenAI, seed: int) -> list[Answer]:
        result: Any = await client.chat.completions.create(  # its calls: function calls
            model=LIVE_MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            tools=CHAT_TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            max_tokens=MAX_TOKENS if named else REQUIRED_MAX_TOKENS,
            n=CHAT_N,
            seed=3000 + seed * CHAT_N,
        )
        return [
            (
                c.finish_reason,
                [(t.function.name, t.function.arguments) for t in c.message.tool_calls or ()],
                None,
            )
            for c in result.choices
        ]

    answers = gather(_async_client(url), SAMPLES // CHAT_N, one)
    assert len(answers) == SAMPLES
    if named:  # one call, bounded: always finished, with it
        check(answers, {"stop", "tool_calls"}, {"get_time"})
    else:
        check(answers, {"tool_calls"}, set(SCHEMAS), cut="length")
        cut = sum(finish == "length" for finish, _, _ in answers)
        assert cut <= SAMPLES // 3, f"{cut} of {SAMPLES} cut: the limit no longer holds"


def test_structured_outputs_follow_the_schema(url: str) -> None:
    async def one(client: openai.AsyncOpenAI, seed: int) -> list[Answer]:
        result = await client.chat.completions.create(
            model=LIVE_MODEL,
            messages=[{"role": "user", "content": "Describe a thing as JSON."}],
            max_tokens=200,
            n=CHAT_N,
            seed=4000 + seed * CHAT_N,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
            },
        )
        return [(c.finish_reason, [("", c.message.content or "")], None) for c in result.choices]

    answers = gather(_async_client(url), SAMPLES // CHAT_N, one)
    assert len(answers) == SAMPLES
    for finish, [(_, text)], _ in answers:  # bounded: always finished
        assert finish == "stop", (finish, text)
        jsonschema.validate(json.loads(text), SCHEMA)
