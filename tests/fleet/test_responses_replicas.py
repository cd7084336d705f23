"""The response store across the fleet's two replicas (each its own `switchboard serve`
process and engine, sharing the fleet's redis-server), called directly: a conversation
stored on one is continued on the other, and background responses running on one are
cancelled through the other (the cancel flag in the store, read by the owner). The same
store without a replica's engine: tests/e2e/test_responses_replicas.py.

How these fail: B cannot see A's record (404), or renders a different prompt than the
chat route does for the whole conversation; a cancel through A leaves B's runs going (B's
records end `incomplete` with every token, B's engine stays busy).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL

pytestmark = pytest.mark.e2e

DEADLINE_S = 60.0
LONG = 960  # tokens a background run may take: seconds of a replica's engine for 24


def _tokens(base: str, messages: list[dict[str, Any]]) -> int:
    answer = httpx.post(f"{base}/tokenize", json={"model": LIVE_MODEL, "messages": messages})
    return int(answer.json()["count"])


def test_a_conversation_continues_on_another_replica(fleet: Fleet) -> None:
    replica_a, replica_b = (replica.url for replica in fleet.replicas)
    first = httpx.post(
        f"{replica_a}/v1/responses",
        json={"model": LIVE_MODEL, "input": "one", "max_output_tokens": 5, "temperature": 0},
        timeout=120,
    ).json()
    second = httpx.post(
        f"{replica_b}/v1/responses",
        json={
            "model": LIVE_MODEL,
            "input": "two",
            "previous_response_id": first["id"],
            "max_output_tokens": 5,
        },
        timeout=120,
    )
    assert second.status_code == 200, second.text
    text = first["output"][0]["content"][0]["text"]
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "two"},
    ]
    assert second.json()["usage"]["input_tokens"] == _tokens(replica_a, messages)
    # Each replica reads what the other stored.
    assert httpx.get(f"{replica_b}/v1/responses/{first['id']}").json() == first
    second_id = second.json()["id"]
    assert httpx.get(f"{replica_a}/v1/responses/{second_id}").json() == second.json()
    items = httpx.get(f"{replica_a}/v1/responses/{second_id}/input_items").json()
    assert [i["content"][0]["text"] for i in items["data"]] == ["two"]
    assert httpx.delete(f"{replica_a}/v1/responses/{second_id}").status_code == 200
    assert httpx.get(f"{replica_b}/v1/responses/{second_id}").status_code == 404


def test_cancel_on_one_replica_aborts_the_run_on_another(fleet: Fleet) -> None:
    replica_a, replica_b = (replica.url for replica in fleet.replicas)
    runs = 24  # x LONG tokens: several seconds of B's engine
    body = {
        "model": LIVE_MODEL,
        "max_output_tokens": LONG,
        "temperature": 0,
        "ignore_eos": True,
        "background": True,
    }
    ids = [
        httpx.post(f"{replica_b}/v1/responses", json={**body, "input": f"story {i}"}).json()["id"]
        for i in range(runs)
    ]
    deadline = time.monotonic() + DEADLINE_S
    while httpx.get(f"{replica_a}/v1/responses/{ids[-1]}").json()["status"] == "queued":
        assert time.monotonic() < deadline, "B never started its runs"
        time.sleep(0.05)

    async def cancel_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=replica_a, timeout=60) as client:
            return await asyncio.gather(*(client.post(f"/v1/responses/{i}/cancel") for i in ids))

    for answer in asyncio.run(cancel_all()):
        response = answer.json()
        # Its error, when it ended otherwise, is what to read first.
        assert response.get("status") == "cancelled", (
            answer.status_code,
            response.get("status"),
            response.get("error"),
            response.get("incomplete_details"),
        )
        assert response["usage"]["output_tokens"] < LONG
    deadline = time.monotonic() + DEADLINE_S
    while _engine_requests(replica_b):
        assert time.monotonic() < deadline, "B's engine still runs the cancelled responses"
        time.sleep(0.1)


def _engine_requests(base: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total
