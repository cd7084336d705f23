"""OpenAI's Agents SDK (`openai-agents`), unchanged, running an agent with a function
tool and a structured final output to completion on the live server (real vLLM, tiny
model) over the Responses API, the only API the SDK uses by default.

The random model will not decide to call a tool: the first turn forces it (`tool_choice:
"required"`, which the SDK resets to `auto` once the tool has run); left free, it would
call again and again, so a logit bias keeps it from starting a hermes `<tool_call>` (the
forced call's grammar is unaffected: a bias is no ban); the final output is a small
enum-valued object (`text.format` json_schema), so the second turn ends by itself.

It fails if the SDK cannot read a response or its stream (an item or event out of shape,
a turn that ends `incomplete`), if the call's arguments do not validate against the
tool's strict schema (the SDK parses them into the function's arguments), or if the
tool's output does not reach the second turn (its stored input items).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from agents import (
    Agent,
    MessageOutputItem,
    ModelSettings,
    Runner,
    RunResult,
    RunResultStreaming,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.models.openai_responses import OpenAIResponsesModel
from pydantic import BaseModel

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


@pytest.fixture(scope="module")
def no_new_calls(tiny_model_dir: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    (angle,) = AutoTokenizer.from_pretrained(str(tiny_model_dir)).encode(
        "<", add_special_tokens=False
    )
    return {str(angle): -100}


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agent_with_a_function_tool_runs_to_completion(
    live_server: LiveServer, no_new_calls: dict[str, int], streamed: bool
) -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI
    asked: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(
        base_url=f"{live_server.base_url}/v1", api_key="unused", max_retries=0
    )
    agent = Agent(
        name="forecaster",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        output_type=Forecast,
        model=OpenAIResponsesModel(model=live_server.model, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            parallel_tool_calls=False,
            extra_body={"logit_bias": no_new_calls},
        ),
    )
    result: RunResult | RunResultStreaming
    if streamed:
        run = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        async for _ in run.stream_events():
            pass
        result = run
    else:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
    assert len(asked) == 1 and asked[0] in ("Paris", "Oslo", "Lima")
    kinds = [type(item) for item in result.new_items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem], kinds
    assert isinstance(result.final_output, Forecast)
    # The second turn carried the tool's output (the SDK stores responses by default).
    second = result.raw_responses[-1].response_id
    items = httpx.get(f"{live_server.base_url}/v1/responses/{second}/input_items").json()
    outputs = [i["output"] for i in items["data"] if i["type"] == "function_call_output"]
    assert outputs == [f"sunny in {asked[0]}"]
