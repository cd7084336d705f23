"""What every websocket route needs, once: frames in, frames out, the calls in flight.

`WebSocketPump` wraps an accepted socket:

- `frames()` yields each client frame as `bytes` (a binary frame) or `str` (a text
  frame); the type is the encoding the client chose, which the protocol's core answers
  in. It ends when the client disconnects.
- `send(frame)` sends `bytes` as a binary frame and `str` as a text frame, one at a time
  (concurrent calls write whole frames, never interleaved); once the client has gone it
  drops the frame instead of raising. A client that takes nothing of a frame for
  `STREAM_STALL_S` is cut (its connection aborted, as a pushed stream's reader is), so
  its calls end as they do when a client leaves.
- `spawn(coro, on_error)` runs a call as a task of the socket's `TaskGroup`; closing the
  pump (`async with`) cancels every call and waits until each has finished, so no engine
  request outlives its socket.
- `on_frame_too_large(answer)`: a frame over the size limit is answered with
  `answer(error)`, the protocol's own error frame, before the close 1009
  (`app.routes.http.connections`).
- `guard(coro, on_error)` runs a call inline. Both render a failure through `on_error`
  as the protocol's error, from the one `client_error` (a `SwitchboardError` as it is,
  anything else an `InternalError` with an id, never the exception's text).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from app.errors import SwitchboardError, client_error
from app.routes.http.connections import TooLarge, on_frame_too_large
from app.routes.raw_send import RAW_SEND, cut_connection
from app.routes.send_writer import STREAM_STALL_S
from app.sessions.tasks import TaskGroup

OnError = Callable[[SwitchboardError], Awaitable[None]]


class WebSocketPump:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.open = True
        self._send_lock = asyncio.Lock()
        self._tasks = TaskGroup()

    def on_frame_too_large(self, answer: TooLarge) -> None:
        on_frame_too_large(self.websocket.scope, answer)

    async def frames(self) -> AsyncIterator[bytes | str]:
        while self.open:
            try:
                message = await self.websocket.receive()
            except (WebSocketDisconnect, RuntimeError):
                message = {"type": "websocket.disconnect"}
            if message["type"] == "websocket.disconnect":
                self.open = False
                return
            data = message.get("bytes")
            yield data if data is not None else (message.get("text") or "")

    async def send(self, frame: bytes | str) -> None:
        if not self.open:
            return
        try:
            async with self._send_lock, asyncio.timeout(STREAM_STALL_S):
                if isinstance(frame, bytes):
                    await self.websocket.send_bytes(frame)
                else:
                    await self.websocket.send_text(frame)
        except (WebSocketDisconnect, RuntimeError):  # the client left meanwhile
            self.open = False
        except TimeoutError:  # the client stopped reading
            self.open = False
            cut_connection(self.websocket.scope.get(RAW_SEND))

    async def close(self, code: int, reason: str = "") -> None:
        self.open = False
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client left first
            await self.websocket.close(code=code, reason=reason)

    async def guard(self, call: Awaitable[None], on_error: OnError) -> None:
        try:
            await call
        except Exception as exc:
            await on_error(client_error(exc))

    def spawn(self, call: Coroutine[Any, Any, None], on_error: OnError) -> None:
        if self._tasks.closed:
            call.close()
            return
        self._tasks.spawn(self.guard(call, on_error))

    async def __aenter__(self) -> WebSocketPump:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._tasks.aclose()
