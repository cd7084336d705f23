"""Batches on the live server (real vLLM), as the unchanged openai and anthropic SDKs call
them: a batch over each OpenAI endpoint, a Message Batch, a cancel (the fake engine's
tests of every rule, two servers on one store and a restart:
tests/unit/test_batches_api.py).

How these fail: an SDK that cannot read an answer; a request answered twice or not at
all, or a body that differs from what its endpoint answers alone (a different object, no
usage); a cancelled batch leaving requests in vLLM.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import anthropic
import openai
import pytest

from app.protocols.openai.batches import ENDPOINTS, Endpoint
from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

T = TypeVar("T")
DEADLINE_S = 120.0
COUNT = 6


def _until(fetch: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"waited {DEADLINE_S:.0f} s for {what}: {value}"
        time.sleep(0.1)


def _body(endpoint: str, model: str, i: int, tokens: int = 4) -> dict[str, Any]:
    if endpoint == "/v1/completions":
        return {"model": model, "prompt": f"def f{i}():", "max_tokens": tokens}
    if endpoint == "/v1/responses":
        return {"model": model, "input": f"hello {i}", "max_output_tokens": tokens}
    messages = [{"role": "user", "content": f"hello {i}"}]
    return {"model": model, "messages": messages, "max_tokens": tokens}


def _jsonl(endpoint: str, bodies: list[dict[str, Any]]) -> bytes:
    lines = [
        {"custom_id": f"req-{i}", "method": "POST", "url": endpoint, "body": body}
        for i, body in enumerate(bodies)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.split("\n") if line]


def _ended(client: openai.OpenAI, batch_id: str) -> Any:
    return _until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status in ("completed", "failed", "expired", "cancelled"),
        f"batch {batch_id} to end",
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_batch_over_each_endpoint(live_server: LiveServer, endpoint: Endpoint) -> None:
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
    bodies = [_body(endpoint, live_server.model, i) for i in range(COUNT)]
    bodies.append({**bodies[0], "model": "no-such-model"})
    upload = client.files.create(file=("in.jsonl", _jsonl(endpoint, bodies)), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint,
        completion_window="24h",
    )
    batch = _ended(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (COUNT, 1)
    out = _lines(client, batch.output_file_id)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(COUNT)]
    for line in out:
        usage = line["response"]["body"]["usage"]
        assert usage.get("completion_tokens", usage.get("output_tokens")) <= 4
    errors = _lines(client, batch.error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [
        (f"req-{COUNT}", 404)
    ]
    assert batch.usage is not None and batch.usage.output_tokens > 0


def test_a_message_batch(live_server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=live_server.base_url, api_key="unused")
    created = client.messages.batches.create(
        requests=[
            {
                "custom_id": f"m{i}",
                "params": {
                    "model": live_server.model,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"hello {i}"}],
                },
            }
            for i in range(COUNT)
        ]
    )
    ended = _until(
        lambda: client.messages.batches.retrieve(created.id),
        lambda b: b.processing_status == "ended",
        "the message batch to end",
    )
    assert ended.request_counts.succeeded == COUNT
    results = list(client.messages.batches.results(created.id))
    assert sorted(r.custom_id for r in results) == [f"m{i}" for i in range(COUNT)]
    for result in results:
        assert result.result.type == "succeeded"
        assert result.result.message.usage.output_tokens <= 4


def test_a_cancelled_batch_leaves_nothing_in_the_engine(live_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
    endpoint: Final = "/v1/chat/completions"
    bodies = [{**_body(endpoint, live_server.model, i, 900), "ignore_eos": True} for i in range(24)]
    upload = client.files.create(file=("in.jsonl", _jsonl(endpoint, bodies)), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id, endpoint=endpoint, completion_window="24h"
    )
    _until(live_server.engine_requests, lambda n: n > 0, "the batch's requests in vLLM")
    client.batches.cancel(created.id)
    batch = _ended(client, created.id)
    assert batch.status == "cancelled"
    lines = _lines(client, batch.output_file_id) + _lines(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(24))
    assert live_server.wait_idle() == 0
