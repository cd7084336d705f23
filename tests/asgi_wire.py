"""One websocket connection to an ASGI app on the test's own event loop, a queue each way.

Unlike starlette's TestClient, `Wire` lets a test put several frames in the app's inbox at
once (the route then reads them back to back without yielding to the event loop, as it
does when a burst arrives in one TCP read), and every wait is bounded: a frame that never
comes fails the test after `TIMEOUT_S` instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

TIMEOUT_S = 5.0  # per frame, and for the app to return once disconnected

# Every Wire of the running test. A test must end each one (`disconnect`, or the app
# closing it): an app left waiting for a frame is garbage-collected in some later test,
# with no event loop to end it on. `tests/conftest.py` fails the test that leaves one.
_WIRES: list[Wire] = []


def left_running() -> list[Wire]:
    """The Wires made since the last call whose app has not returned."""
    wires = list(_WIRES)
    _WIRES.clear()
    return [wire for wire in wires if not wire.task.done()]


class Wire:
    def __init__(
        self, app: Any, path: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.accepted: dict[str, Any] | None = None  # the app's accept message, once seen
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})
        scope = {
            "type": "websocket",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers or [],
            "scheme": "ws",
            "server": ("test", 80),
            "client": ("test", 1234),
            "root_path": "",
            "subprotocols": [],
            "app": app,
        }
        self.task = asyncio.create_task(app(scope, self.inbox.get, self._sent))
        _WIRES.append(self)

    async def _sent(self, message: dict[str, Any]) -> None:
        await self.outbox.put(message)
        if message["type"] == "websocket.close":
            # The client answers a close at once, as a browser does, whether or not the
            # test has read that far: an app waiting for the handshake (a drain's goodbye)
            # is not held until the test reads the close.
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": message["code"]})

    def send(self, *frames: dict[str, Any]) -> None:
        """JSON text frames, all in the inbox at once."""
        for frame in frames:
            self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(frame)})

    def send_bytes(self, data: bytes) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    async def frame(self, timeout: float = TIMEOUT_S) -> str | bytes | int:
        """The next frame the app sends (text or bytes), or its close code once it closes
        (answered as it was sent: `_sent`)."""
        while True:
            message = await asyncio.wait_for(self.outbox.get(), timeout)
            if message["type"] == "websocket.accept":
                self.accepted = message
            if message["type"] == "websocket.send":
                text: str | None = message.get("text")
                return text if text is not None else bytes(message["bytes"])
            if message["type"] == "websocket.close":
                return int(message["code"])

    async def recv_or_close(self) -> dict[str, Any] | int:
        """The next JSON frame, or the close code once the app closes."""
        frame = await self.frame()
        if isinstance(frame, int):
            return frame
        return dict(json.loads(frame))

    async def recv(self) -> dict[str, Any]:
        """The next JSON frame; the app closing instead fails the test."""
        frame = await self.recv_or_close()
        assert not isinstance(frame, int), f"the app closed ({frame}) where a frame was due"
        return frame

    async def disconnect(self) -> None:
        """The client goes away; the app must return."""
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})
        await self.ended()

    async def ended(self) -> None:
        await asyncio.wait_for(self.task, TIMEOUT_S)

    async def open_session(self) -> str:
        """A Salience OpenSession on the fake engine's model: the new session's id."""
        self.send({"id": "open", "method": "OpenSession", "request": {"model": "fake"}})
        return str((await self.recv())["response"]["sessionId"])
