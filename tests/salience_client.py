"""Salience as the tests speak it over a websocket: the JSON envelopes (`gen`, `dump`), a
minimal client (`JsonClient`: one call at a time), and the calls several test modules
make with it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

READ_TIMEOUT_S = 120  # one frame of a live server


def gen(call_id: str, **request: Any) -> dict[str, Any]:
    """A Generate envelope."""
    return {"id": call_id, "method": "Generate", "request": request}


def dump(call_id: str, session: str) -> dict[str, Any]:
    """A DumpSession envelope."""
    return {"id": call_id, "method": "DumpSession", "request": {"sessionId": session}}


class JsonClient:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        call_id = f"c{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": method, "request": request}))
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), READ_TIMEOUT_S))
        assert reply["id"] == call_id
        return reply

    async def generate(self, request: dict[str, Any], call_id: str = "") -> list[dict[str, Any]]:
        self.n += 1
        call_id = call_id or f"g{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": "Generate", "request": request}))
        events = []
        while True:
            reply = json.loads(await asyncio.wait_for(self.ws.recv(), READ_TIMEOUT_S))
            assert reply["id"] == call_id
            if "error" in reply:
                return [reply]
            events.append(reply["event"])
            if "done" in reply["event"]:
                return events


def tokens_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["token"] for e in events if "token" in e]


async def open_session(client: JsonClient, model: str) -> str:
    reply = await client.call("OpenSession", {"model": model})
    return str(reply["response"]["sessionId"])


async def run(
    client: JsonClient, session: str, offset: int, append: list[int], images: list[Any], **kw: Any
) -> list[dict[str, Any]]:
    """A greedy (top_k 1) Generate on `session`: its events, or [the error reply]."""
    request = {
        "sessionId": session,
        "offset": offset,
        "appendTokens": append,
        "images": images,
        "topK": 1,
        **kw,
    }
    return await client.generate(request)


def decoded(events: list[dict[str, Any]]) -> list[int]:
    """The ids a Generate decoded (its prompt's tokens left out)."""
    assert "error" not in events[0], events[0]
    return [t.get("id", 0) for t in tokens_of(events) if not t.get("isPrefill")]


def scored(events: list[dict[str, Any]]) -> list[float]:
    """The prompt's sampled logprobs (over its logprobs ranges)."""
    return [t["sampledLogprob"] for t in tokens_of(events) if t.get("isPrefill")]


async def open_and_generate(
    ws: Any, model: str, call_id: str, tokens: list[int], max_tokens: int
) -> None:
    """Open a session on `ws` and start a Generate `call_id` on it; its events are left
    for the caller to read."""
    opening = {"id": "o" + call_id, "method": "OpenSession", "request": {"model": model}}
    await ws.send(json.dumps(opening))
    opened = json.loads(await asyncio.wait_for(ws.recv(), READ_TIMEOUT_S))
    session = opened["response"]["sessionId"]
    request = {"sessionId": session, "appendTokens": tokens, "offset": 0, "maxTokens": max_tokens}
    await ws.send(json.dumps({"id": call_id, "method": "Generate", "request": request}))
