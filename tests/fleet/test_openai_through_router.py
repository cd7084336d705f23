"""The OpenAI APIs through vLLM's router (`vllm-router`, round robin) in front of two real
replicas sharing a Redis, driven by the unchanged openai SDK and openai-agents: what one
replica passes, the fleet passes.

Completions, chat and the Responses API, streamed and not, forced tool calls, structured
outputs and a LoRA adapter by `model` (each asked of both replicas: the router alternates);
a `previous_response_id` chain whose turns alternate replicas (counted on each replica's
/metrics); an agent with a function tool run to completion; the client's errors in
OpenAI's shape as the replica words them, and a refusal (503 + Retry-After) after the
router has tried it on every replica. And what the router does itself, as
docs/operations.md says: its own text/plain answers to a body it cannot parse, its 501 to
DELETE /v1/responses/{id}.

How these fail: a call lost or reshaped on its way through the router; a turn of a chain
not found on the replica the router chose (a store per replica again); a refusal that
reaches the client as anything but OpenAI's 503, or one the router did not retry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel
from pydantic import BaseModel

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_LORA, LIVE_MODEL, tiny_model_path
from tests.error_bodies import body_of
from tests.fleet.conftest import admitted, stream_whole
from tests.fleet_setup import CONTEXT, MAX_QUEUED_TOKENS

pytestmark = pytest.mark.e2e

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "object",
    "properties": {"sky": {"enum": ["sunny", "rainy"]}, "n": {"type": "integer"}},
    "required": ["sky", "n"],
    "additionalProperties": False,
}
# Each sampled property is asked this many times, half of them of each replica.
SAMPLES = 6


@pytest.fixture(scope="module")
def url(fleet: Fleet) -> str:
    return fleet.router("vllm-router").url


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_models_completions_and_chat(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == LIVE_MODEL and LIVE_LORA in ids
    for _ in range(2):  # once on each replica
        done = client.completions.create(model=LIVE_MODEL, prompt="def main():", max_tokens=5)
        assert done.usage is not None and done.usage.completion_tokens == 5
        chat = client.chat.completions.create(
            model=LIVE_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.choices[0].finish_reason in ("length", "stop")
        assert stream_whole(client, 6)


def test_a_lora_adapter_by_model_on_every_replica(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        prompt="for i in range(", max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    base = {client.completions.create(model=LIVE_MODEL, **kwargs).choices[0].text for _ in "ab"}
    lora = [client.completions.create(model=LIVE_LORA, **kwargs) for _ in "ab"]
    assert all(answer.model == LIVE_LORA for answer in lora)
    texts = {answer.choices[0].text for answer in lora}
    # Greedy: each replica answers alike, and the adapter unlike the base model.
    assert len(base) == len(texts) == 1 and texts != base


def _each_seed(sample: Callable[[int], None], seeds: int = SAMPLES) -> None:
    """`sample(seed)` for each seed, all at once (the replicas' engines step them
    together, where one after the other each waited for its own steps: 85-110 s for six
    while the suite's other lane ran), each sample's failure raised."""
    with ThreadPoolExecutor(max_workers=seeds) as pool:
        for sampled in [pool.submit(sample, seed) for seed in range(seeds)]:
            sampled.result()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_forced_tool_calls_are_calls(client: openai.OpenAI, stream: bool) -> None:
    def sample(seed: int) -> None:
        body: dict[str, Any] = dict(
            model=LIVE_MODEL,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=120,
            seed=seed,
            parallel_tool_calls=False,
        )
        if stream:
            with client.chat.completions.stream(**body) as events:
                message = events.get_final_completion().choices[0].message
        else:
            message = client.chat.completions.create(**body).choices[0].message
        assert message.tool_calls, message
        (call,) = message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])

    _each_seed(sample)


def test_structured_outputs_follow_the_schema(client: openai.OpenAI) -> None:
    def sample(seed: int) -> None:
        answer = client.chat.completions.create(
            model=LIVE_MODEL,
            messages=[{"role": "user", "content": "forecast"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "forecast", "schema": ANSWER, "strict": True},
            },
            max_tokens=60,
            seed=seed,
        )
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), ANSWER)

    _each_seed(sample)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_responses_and_a_forced_call(client: openai.OpenAI, stream: bool) -> None:
    tool = {**WEATHER["function"], "type": "function"}

    def sample(seed: int) -> None:
        body: dict[str, Any] = dict(
            model=LIVE_MODEL,
            input="Weather in Paris?",
            tools=[tool],
            tool_choice="required",
            parallel_tool_calls=False,  # else a random model goes on calling
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        if stream:
            with client.responses.stream(**body) as events:
                kinds = [event.type for event in events]
                response = events.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        else:
            response = client.responses.create(**body)
        assert response.status == "completed"
        calls = [item for item in response.output if item.type == "function_call"]
        assert calls and all(call.name == "get_weather" for call in calls)
        jsonschema.validate(json.loads(calls[0].arguments), tool["parameters"])

    _each_seed(sample, SAMPLES // 2)


def test_a_chain_of_responses_alternates_replicas(client: openai.OpenAI, fleet: Fleet) -> None:
    """Each turn continues the last by `previous_response_id` alone, and is served by the
    other replica than the turn before (round robin, nothing else running): the chain
    lives in the store they share."""
    before = admitted(fleet, "responses")
    previous: str | None = None
    turns = 4
    for turn in range(turns):
        response = client.responses.create(
            model=LIVE_MODEL,
            input=f"turn {turn}",
            previous_response_id=previous,
            max_output_tokens=3,
            extra_body={"ignore_eos": True},
        )
        assert response.status == "incomplete" and response.previous_response_id == previous
        previous = response.id
    served = [now - then for now, then in zip(admitted(fleet, "responses"), before, strict=True)]
    assert served == [turns / 2, turns / 2], served
    # The whole chain, read back through the router, last turn first.
    inputs = []
    while previous is not None:
        items = client.responses.input_items.list(previous).data
        for item in items:
            if item.type == "message":
                part = item.content[0]
                assert part.type == "input_text", part
                inputs.append(part.text)
        previous = client.responses.retrieve(previous).previous_response_id
    assert inputs == [f"turn {turn}" for turn in reversed(range(turns))], inputs


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agent_runs_to_completion(url: str, streamed: bool) -> None:
    """openai-agents, unchanged: a forced tool call, the tool's output, a structured final
    answer (see tests/e2e/test_responses_agents.py for why the settings)."""
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="forecaster",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        output_type=Forecast,
        model=OpenAIResponsesModel(model=LIVE_MODEL, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            parallel_tool_calls=False,
            extra_body={"logit_bias": {str(_angle_token()): -100}},
        ),
    )
    if streamed:
        run = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        async for _ in run.stream_events():
            pass
        final = run.final_output
    else:
        final = (await Runner.run(agent, "What is the weather in Paris?", max_turns=3)).final_output
    assert len(asked) == 1 and isinstance(final, Forecast)


def _angle_token() -> int:
    """The token of "<", a hermes call's start."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path(CONTEXT)))
    (angle,) = tokenizer.encode("<", add_special_tokens=False)
    return int(angle)


def test_client_errors_are_the_replicas(client: openai.OpenAI) -> None:
    """Errors of a body the router forwards are the replica's, in OpenAI's shape."""
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-model", prompt="a", max_tokens=2)
    assert body_of(missing.value)["param"] == "model"
    with pytest.raises(openai.BadRequestError) as hot:
        client.chat.completions.create(
            model=LIVE_MODEL, messages=[{"role": "user", "content": "a"}], temperature=5
        )
    assert body_of(hot.value)["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as streamed:
        client.chat.completions.create(
            model=LIVE_MODEL, messages=[{"role": "user", "content": "a"}], stream=True, n=0
        )
    assert body_of(streamed.value)["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=LIVE_MODEL, input="a", max_output_tokens=-1)
    assert body_of(responses.value)["type"] == "invalid_request_error"


def test_a_refusal_is_retried_on_every_replica_then_returned_whole(url: str, fleet: Fleet) -> None:
    """Two choices of a prompt over half the replicas' prompt-token bound: every replica
    refuses the call (503 + Retry-After) whatever its queue holds. The router tries it
    on each replica before it answers, then hands the client the replica's own refusal."""
    refused = [r.metric("switchboard_refused_total") for r in fleet.replicas]
    body = {"model": LIVE_MODEL, "prompt": "x" * (MAX_QUEUED_TOKENS * 3 // 4), "n": 2}
    answer = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 1}, timeout=60)
    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) >= 1
    error = answer.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "overloaded", error
    tried = [
        r.metric("switchboard_refused_total") - before
        for r, before in zip(fleet.replicas, refused, strict=True)
    ]
    assert all(count >= 1 for count in tried), tried  # every replica was asked


def test_what_the_router_answers_itself(url: str, client: openai.OpenAI) -> None:
    """vllm-router parses chat and completion bodies itself and answers one it cannot
    read in its own words and text/plain (400 for bad JSON, 422 for a wrong type), and
    refuses DELETE /v1/responses/{id} (501): docs/operations.md says so; a change of the
    router's here is a change of that page."""
    chat = f"{url}/v1/chat/completions"
    json_type = {"content-type": "application/json"}
    bad = httpx.post(chat, content=b'{"model": "tiny", "messages":', headers=json_type, timeout=10)
    assert bad.status_code == 400 and bad.headers["content-type"].startswith("text/plain")
    typed = {"model": LIVE_MODEL, "messages": [{"role": "user", "content": "a"}], "n": "x"}
    wrong = httpx.post(chat, json=typed, timeout=10)
    assert wrong.status_code == 422 and wrong.headers["content-type"].startswith("text/plain")
    stored = client.responses.create(model=LIVE_MODEL, input="keep", max_output_tokens=2)
    assert httpx.delete(f"{url}/v1/responses/{stored.id}", timeout=10).status_code == 501
    assert client.responses.retrieve(stored.id).id == stored.id
