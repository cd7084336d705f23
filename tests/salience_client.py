"""A minimal Salience client over a websocket (JSON frames), for the e2e tests."""

from __future__ import annotations

import json
from typing import Any


class JsonClient:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        call_id = f"c{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": method, "request": request}))
        reply = json.loads(await self.ws.recv())
        assert reply["id"] == call_id
        return reply

    async def generate(self, request: dict[str, Any], call_id: str = "") -> list[dict[str, Any]]:
        self.n += 1
        call_id = call_id or f"g{self.n}"
        await self.ws.send(json.dumps({"id": call_id, "method": "Generate", "request": request}))
        events = []
        while True:
            reply = json.loads(await self.ws.recv())
            assert reply["id"] == call_id
            if "error" in reply:
                return [reply]
            events.append(reply["event"])
            if "done" in reply["event"]:
                return events


def tokens_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["token"] for e in events if "token" in e]
