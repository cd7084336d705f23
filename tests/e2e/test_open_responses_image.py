"""The Open Responses suite's image test (tests/open_responses.py) on the tiny
vision-language model (`vl_server`): the suite's request, its PNG as a `data:` URL, the
response held to the spec's schemas.

The model is random and, unlike the agent CLIs' one (tests/e2e/agents/
test_open_responses.py), never ends a reply by itself: with no `max_output_tokens` it
writes to the end of its context, and the response is `incomplete`
(`max_output_tokens`). That one check of the suite's, `completed`, is the model's to
pass, not the server's (docs/responses.md); every other one holds.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import LiveServer
from tests.open_responses import Target, run

pytestmark = pytest.mark.e2e

NOT_ENDED = 'Expected status "completed" but got "incomplete"'


def test_image_input(vl_server: LiveServer) -> None:
    outcome = run(Target(f"{vl_server.base_url}/v1", vl_server.model), "image-input")
    assert outcome.errors in ([], [NOT_ENDED]), outcome.bodies
    (response,) = outcome.bodies
    if outcome.errors:
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    # The image reached the model: its tokens are counted beside the text's.
    text = {
        "model": vl_server.model,
        "input": [
            {"role": "user", "content": "What do you see in this image? Answer in one sentence."}
        ],
        "max_output_tokens": 1,
    }
    alone = httpx.post(f"{vl_server.base_url}/v1/responses", json=text, timeout=60).json()
    assert response["usage"]["input_tokens"] > alone["usage"]["input_tokens"]
