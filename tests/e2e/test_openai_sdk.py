"""The `openai` SDK, unchanged, against the live server (real vLLM, tiny model)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer
from tests.error_bodies import body_of

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def aclient(live_server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0
    )


def test_completion_usage_and_length(client: openai.OpenAI, live_server: LiveServer) -> None:
    result = client.completions.create(
        model=live_server.model,
        prompt="def main():",
        max_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert result.object == "text_completion"
    assert choice.finish_reason == "length"
    assert result.usage is not None
    assert result.usage.completion_tokens == 7
    tokens = httpx.post(f"{live_server.base_url}/tokenize", json={"prompt": "def main():"}).json()
    assert result.usage.prompt_tokens == tokens["count"]
    assert result.usage.total_tokens == result.usage.prompt_tokens + 7
    assert choice.text


def test_greedy_is_deterministic_and_n_choices(
    client: openai.OpenAI, live_server: LiveServer
) -> None:
    kwargs: dict[str, Any] = dict(
        model=live_server.model, prompt="import os\n", max_tokens=12, temperature=0
    )
    first = client.completions.create(**kwargs).choices[0].text
    second = client.completions.create(**kwargs).choices[0].text
    assert first == second
    many = client.completions.create(
        model=live_server.model,
        prompt="x = ",
        max_tokens=5,
        n=3,
        seed=7,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage is not None and many.usage.completion_tokens == 15
    again = client.completions.create(
        model=live_server.model,
        prompt="x = ",
        max_tokens=5,
        n=3,
        seed=7,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    assert [c.text for c in many.choices] == [c.text for c in again.choices]


def test_completion_logprobs_and_echo(client: openai.OpenAI, live_server: LiveServer) -> None:
    prompt = "class Foo:"
    result = client.completions.create(
        model=live_server.model,
        prompt=prompt,
        max_tokens=3,
        logprobs=2,
        echo=True,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert lp is not None and result.usage is not None
    tokens, token_logprobs, offsets, tops = (
        lp.tokens,
        lp.token_logprobs,
        lp.text_offset,
        lp.top_logprobs,
    )
    assert tokens and token_logprobs and offsets and tops
    n_prompt = result.usage.prompt_tokens
    assert len(tokens) == n_prompt + 3
    assert token_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in token_logprobs[1:])
    assert "".join(tokens) == choice.text
    assert offsets[0] == 0
    assert all(b > a for a, b in itertools.pairwise(offsets))
    # Greedy: the sampled token is the best of its top-2.
    for token, top in zip(tokens[n_prompt:], tops[n_prompt:], strict=True):
        assert max(top, key=lambda t: top[t]) == token


def test_echo_scoring_with_zero_max_tokens(client: openai.OpenAI, live_server: LiveServer) -> None:
    result = client.completions.create(
        model=live_server.model, prompt="return None", max_tokens=0, echo=True, logprobs=0
    )
    choice = result.choices[0]
    assert choice.text == "return None"
    assert result.usage is not None and choice.logprobs is not None
    assert result.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens or ()) == result.usage.prompt_tokens


def test_chat_and_max_completion_tokens(client: openai.OpenAI, live_server: LiveServer) -> None:
    result = client.chat.completions.create(
        model=live_server.model,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_completion_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    choice = result.choices[0]
    assert result.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert result.usage is not None and result.usage.completion_tokens == 6
    assert choice.logprobs is not None
    content = choice.logprobs.content
    assert content is not None and len(content) == 6
    assert all(len(item.top_logprobs) == 3 for item in content)
    assert "".join(item.token for item in content) == choice.message.content


def test_chat_stream_with_usage(client: openai.OpenAI, live_server: LiveServer) -> None:
    stream = client.chat.completions.create(
        model=live_server.model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    whole = client.chat.completions.create(
        model=live_server.model,
        messages=[{"role": "user", "content": "count"}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert text == whole.choices[0].message.content


def test_stop_string(client: openai.OpenAI, live_server: LiveServer) -> None:
    free = (
        client.completions.create(
            model=live_server.model,
            prompt="def f(x):",
            max_tokens=20,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .text
    )
    stop = free[3:6]
    assert stop.strip(), free
    stopped = client.completions.create(
        model=live_server.model,
        prompt="def f(x):",
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[: free.index(stop)]


async def test_async_concurrent(aclient: openai.AsyncOpenAI, live_server: LiveServer) -> None:
    import asyncio

    results = await asyncio.gather(
        *[
            aclient.completions.create(
                model=live_server.model,
                prompt=f"n = {i}",
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
            for i in range(6)
        ]
    )
    assert all(r.usage is not None and r.usage.completion_tokens == 4 for r in results)


def test_lora_by_model_name(client: openai.OpenAI, live_server: LiveServer) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == live_server.model and live_server.lora in ids
    kwargs: dict[str, Any] = dict(
        prompt="for i in range(", max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    base = client.completions.create(model=live_server.model, **kwargs).choices[0].text
    lora = client.completions.create(model=live_server.lora, **kwargs)
    assert lora.model == live_server.lora
    assert lora.choices[0].text != base


def test_runtime_lora_load_and_unload(client: openai.OpenAI, live_server: LiveServer) -> None:
    from tests.conftest import tiny_lora_path

    path = tiny_lora_path("tiny-lora-2", seed=2)
    client.post(
        "/load_lora_adapter", body={"lora_name": "extra", "lora_path": str(path)}, cast_to=str
    )
    assert "extra" in [m.id for m in client.models.list().data]
    out = client.completions.create(model="extra", prompt="a", max_tokens=2)
    assert out.model == "extra"
    client.post("/unload_lora_adapter", body={"lora_name": "extra"}, cast_to=str)
    assert "extra" not in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="extra", prompt="a", max_tokens=2)


def test_errors(client: openai.OpenAI, live_server: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="a", max_tokens=2)
    assert body_of(missing.value)["param"] == "model"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=live_server.model, prompt="x " * 2000, max_tokens=5)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=live_server.model, prompt="a", max_tokens=2, temperature=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live_server.model, messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=live_server.model, prompt=[[1, 99999]], max_tokens=2)
