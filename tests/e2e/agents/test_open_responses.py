"""The Open Responses compliance suite (tests/open_responses.py, its port) against the live
Switchboard: every test of it but the image test (tests/e2e/test_open_responses_image.py,
on the vision-language model), each response and streamed event held to the spec's
schemas as the suite holds them.

On the agent CLIs' server: the suite sends no `max_output_tokens`, as those clients do not,
and the tiny model served there ends its turns (the default one runs to the end of its
context and would end `incomplete`). What a random-weight model cannot do is said where it
is asked and in docs/responses.md: calling a tool the prompt merely makes likely
("tool-calling": the suite's request is checked in every other respect, and the same
request with the call forced is checked in full, whole and streamed).
"""

from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.open_responses import (
    STREAMED,
    TESTS,
    WEATHER_TOOL,
    Target,
    has_output,
    has_output_type,
    run,
    single,
)

pytestmark = pytest.mark.e2e

ELSEWHERE = ("image-input",)  # on the vision-language model
MODEL_BOUND = ("tool-calling",)
NO_CALL = 'Expected output item of type "function_call" but none found'


def _target(live: LiveServer) -> Target:
    return Target(f"{live.base_url}/v1", live.model)


@pytest.mark.parametrize("test_id", [t for t in TESTS if t not in (*ELSEWHERE, *MODEL_BOUND)])
def test_the_suite(long_server: LiveServer, test_id: str) -> None:
    outcome = run(_target(long_server), test_id)
    assert outcome.errors == [], outcome.bodies


def test_tool_calling(long_server: LiveServer) -> None:
    """The suite's request leaves the call to the model (`tool_choice` auto): a random
    model writes one by chance only, so the one check that needs it may fail, no other.
    Forced, the call is the server's to make: then every check holds, whole and streamed."""
    target = _target(long_server)
    outcome = run(target, "tool-calling")
    assert outcome.errors in ([], [NO_CALL]), outcome.bodies
    # Its location bounded: a random model's free string can run to the end of the context.
    location = {**WEATHER_TOOL["parameters"]["properties"]["location"], "maxLength": 12}
    tool = {**WEATHER_TOOL, "parameters": {**WEATHER_TOOL["parameters"], "properties": {
        "location": location}}}  # fmt: skip
    body = {
        "model": target.model,
        "input": [{"type": "message", "role": "user", "content": "What's the weather like?"}],
        "tools": [tool],
        "tool_choice": "required",
    }
    forced = single(target, body, (has_output, has_output_type("function_call")))
    assert forced.errors == [], forced.bodies
    streamed = single(target, body, (*STREAMED, has_output_type("function_call")), stream=True)
    assert streamed.errors == [], streamed.bodies
