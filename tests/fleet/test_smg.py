"""The Shepherd Model Gateway (`smg`, round robin) in front of the same two replicas:
chat and the Responses API through the openai SDK, Anthropic Messages through the
anthropic SDK, each asked of both replicas (SMG names the one it chose in
`x-smg-routed-worker-id`), streamed and not. And what SMG answers itself
(docs/operations.md): a body it cannot parse, in OpenAI's shape but its own words.

How these fail: a call SMG cannot carry to a Switchboard replica, or carries reshaped
(an SDK that cannot read the answer), or one replica never chosen.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL
from tests.error_bodies import body_of
from tests.fleet.conftest import stream_whole

pytestmark = pytest.mark.e2e

WORKER = "x-smg-routed-worker-id"


@pytest.fixture(scope="module")
def url(fleet: Fleet) -> str:
    return fleet.router("smg").url


@pytest.fixture(scope="module")
def replicas(fleet: Fleet) -> set[str]:
    return {r.url for r in fleet.replicas}


def test_chat(url: str, replicas: set[str]) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    chosen = set()
    for _ in replicas:
        answer = client.chat.completions.with_raw_response.create(
            model=LIVE_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        chosen.add(answer.headers[WORKER])
        assert answer.parse().choices[0].message.content
    assert chosen == replicas
    stream_whole(client, 5)


def test_responses(url: str, replicas: set[str]) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    chosen = set()
    previous = None
    for turn in range(len(replicas)):
        answer = client.responses.with_raw_response.create(
            model=LIVE_MODEL,
            input=f"turn {turn}",
            previous_response_id=previous,
            max_output_tokens=3,  # no vLLM extension: SMG refuses unknown Responses fields
        )
        chosen.add(answer.headers[WORKER])
        previous = answer.parse().id
    assert chosen == replicas  # a chain whose turns each replica served
    with client.responses.stream(model=LIVE_MODEL, input="hi", max_output_tokens=4) as stream:
        kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )


def test_anthropic_messages(url: str, replicas: set[str]) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    chosen = set()
    for _ in replicas:
        answer = client.messages.with_raw_response.create(
            model=LIVE_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        chosen.add(answer.headers[WORKER])
        message = answer.parse()
        assert message.type == "message" and message.usage.output_tokens <= 4
    assert chosen == replicas
    with client.messages.stream(
        model=LIVE_MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("max_tokens", "end_turn")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert body_of(missing.value)["type"] == "error"


def test_what_smg_answers_itself(url: str) -> None:
    """SMG parses bodies itself: one it cannot read gets its own 400 in OpenAI's shape."""
    bad = httpx.post(
        f"{url}/v1/chat/completions",
        content=b'{"model": "tiny", "messages":',
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
