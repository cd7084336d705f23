"""Responses that end early, on the live server (real vLLM): a client that disconnects
aborts its foreground responses; `cancel` aborts background ones; a background response
is not tied to the connection that started it, and can be followed live.

The abort tests are tests/aborts.py's: the long workload (one response per prompt),
vLLM's own request count, and a bound well under the workload's natural length, so an
abort that does not reach the engine fails them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tests.aborts import AbortWatch, Workload
from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

POLL_DEADLINE_S = 120.0


def _body(live: Any, workload: Workload, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": live.model,
        "input": text,
        "max_output_tokens": workload.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


async def _until_ended(client: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + POLL_DEADLINE_S
    while True:
        body: dict[str, Any] = (await client.get(f"/v1/responses/{response_id}")).json()
        if body["status"] not in ("queued", "in_progress"):
            return body
        assert time.monotonic() < deadline, f"{response_id} still {body['status']}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_a_client_that_disconnects_aborts_its_responses(
    live_server: LiveServer, abort_workload: Workload, stream: bool
) -> None:
    limits = httpx.Limits(max_connections=len(abort_workload.texts))
    async with httpx.AsyncClient(
        base_url=live_server.base_url, timeout=120, limits=limits
    ) as client:
        watch = await AbortWatch.start(live_server.engine, abort_workload)

        async def one(text: str) -> None:
            body = _body(live_server, abort_workload, text, stream=stream, store=False)
            if stream:
                async with client.stream("POST", "/v1/responses", json=body) as response:
                    assert response.status_code == 200
                    lines = response.aiter_lines()
                    assert (await anext(lines)).startswith("event: response.created")
                    await asyncio.Event().wait()  # held open until cancelled
            else:
                await client.post("/v1/responses", json=body)

        await watch.leave([asyncio.create_task(one(text)) for text in abort_workload.texts])
    await watch.idle()


async def test_cancel_aborts_background_responses(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    # No connection is reused: a POST sent on a kept-alive connection as the server's
    # keep-alive timer closes it is lost (httpx.ReadError, an EOF before any answer; HTTP
    # lets a client retry only idempotent requests so), a race of the two ends' timers
    # that a pause of the whole process (this one serves the live server too) can open
    # even with the client's expiry far below the server's. It lost one of the 96
    # creates in two whole-suite runs, leaving 95 runs in the engine for later tests.
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=live_server.base_url, timeout=120, limits=limits
    ) as client:
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        created = await asyncio.gather(
            *(
                client.post(
                    "/v1/responses", json=_body(live_server, abort_workload, t, background=True)
                )
                for t in abort_workload.texts
            )
        )
        ids = [answer.json()["id"] for answer in created]
        assert {answer.json()["status"] for answer in created} == {"queued"}
        await watch.all_in_engine()
        cancelled = await asyncio.gather(*(client.post(f"/v1/responses/{i}/cancel") for i in ids))
        await watch.idle()
        for answer in cancelled:
            body = answer.json()
            assert body["status"] == "cancelled", body
            assert body["usage"]["output_tokens"] < abort_workload.max_tokens
        stored = (await client.get(f"/v1/responses/{ids[0]}")).json()
        assert stored["status"] == "cancelled"
        # Cancelling again answers the response as it ended.
        again = await client.post(f"/v1/responses/{ids[0]}/cancel")
        assert again.json()["status"] == "cancelled"


async def test_a_background_response_outlives_its_connection(live_server: LiveServer) -> None:
    """Streamed, then left after its first event: it still runs to its end (fails if the
    disconnect cancelled it: `cancelled`, fewer tokens); a second reader follows it live
    from a sequence number and sees the rest."""
    body = {
        "model": live_server.model,
        "input": "a long story",
        "max_output_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
        "background": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=120) as client:
        async with client.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200
            lines = response.aiter_lines()
            assert await anext(lines) == "event: response.created"
            created = json.loads((await anext(lines)).removeprefix("data: "))
        response_id = created["response"]["id"]
        assert created["response"]["status"] == "queued"
        followed = []
        async with client.stream(
            "GET", f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 0}
        ) as replay:
            async for line in replay.aiter_lines():
                if line.startswith("data: "):
                    followed.append(json.loads(line.removeprefix("data: ")))
        ended = await _until_ended(client, response_id)
    assert ended["status"] == "incomplete"
    assert ended["usage"]["output_tokens"] == 200
    assert [e["sequence_number"] for e in followed] == list(range(1, len(followed) + 1))
    assert followed[-1]["type"] == "response.incomplete"
    text = "".join(e["delta"] for e in followed if e["type"] == "response.output_text.delta")
    assert text == ended["output"][0]["content"][0]["text"]


async def test_a_cancel_right_after_create_wins(live_server: LiveServer) -> None:
    """The issue's probe: create in the background, cancel at once, again and again (a run
    cancelled before its task's first step used to leak its admission place and stay
    `queued`): every cancel answers `cancelled`, the record says it and stays so, and
    nothing is left in the engine or admission."""
    body = {
        "model": live_server.model,
        "input": "a long story",
        "max_output_tokens": 400,
        "ignore_eos": True,
        "background": True,
    }
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=120) as client:
        ids = []
        for _ in range(8):
            created = (await client.post("/v1/responses", json=body)).json()
            cancelled = (await client.post(f"/v1/responses/{created['id']}/cancel")).json()
            assert cancelled["status"] == "cancelled", cancelled
            ids.append(created["id"])
        assert live_server.wait_idle() == 0
        for response_id in ids:
            stored = (await client.get(f"/v1/responses/{response_id}")).json()
            assert stored["status"] == "cancelled"
            assert stored["usage"]["output_tokens"] < 400
    assert live_server.app.state.admission.in_flight == 0
