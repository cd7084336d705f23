"""Writing to an ASGI `send` from synchronous code (the engine's loop, which pushes each
step's events to every stream at once), in order, without a task per piece.

`SendWriter(send, message, join)` turns each written piece into the ASGI message
`message` makes of it and runs `send` at once: it finishes without waiting unless the
connection's buffer is full (the server waits for it to drain before writing). Then a
task finishes that send, and what is written meanwhile waits behind it: joined into one
piece (`join`, a body's bytes) or sent piece by piece (a websocket's frames); `drained`
waits for it all. What streams builds one: an HTTP body (`app.routes.http.sse`), a
websocket's frames (`app.routes.ws.frame_writer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar, cast

from starlette.types import Message, Send

P = TypeVar("P")  # a piece a `SendWriter` writes


class SendWriter(Generic[P]):
    """Writes a response's body, or a websocket's frames, from synchronous code (the
    engine's loop), in order: each piece becomes the ASGI message `message` makes of it.

    Each `write` runs the server's `send` at once: it finishes without waiting unless the
    connection's buffer is full (uvicorn waits for it to drain before writing). Then a
    task finishes that send, and what is written meanwhile waits behind it: joined into
    one chunk (`join`, a body's bytes), or sent piece by piece (a websocket's frames);
    `drained` waits for it all."""

    def __init__(
        self, send: Send, message: Callable[[P], Message], join: Callable[[list[P]], P] | None
    ) -> None:
        self._send = send
        self._message = message
        self._join = join
        self._backlog: list[P] | None = None  # a send is waiting: what comes next
        self._flushing: asyncio.Future[None] | None = None

    def write(self, piece: P) -> None:
        if self._backlog is not None:
            self._backlog.append(piece)
            return
        message = self._message(piece)
        started = cast(Coroutine[Any, Any, None], self._send(message))  # an async def's
        try:
            waiting_on = started.send(None)
        except StopIteration:
            return
        self._backlog = []
        self._flushing = asyncio.ensure_future(self._finish(started, waiting_on))

    async def _finish(self, started: Coroutine[Any, Any, None], waiting_on: object) -> None:
        try:
            await _resume(started, waiting_on)
            while self._backlog:
                pieces, self._backlog = self._backlog, []
                if self._join is not None:
                    pieces = [self._join(pieces)]
                for piece in pieces:
                    await self._send(self._message(piece))
        finally:
            self._backlog = None

    async def drained(self) -> None:
        """Once every write has reached the server's `send`."""
        if self._flushing is not None:
            await self._flushing

    @property
    def busy(self) -> bool:
        """A send is waiting; what is written meanwhile follows it."""
        return self._backlog is not None


async def _resume(coroutine: Coroutine[Any, Any, None], waiting_on: object) -> None:
    """Run to its end a coroutine suspended, by a first `send(None)` outside any task, on
    `waiting_on` (the future it awaits; None: a bare yield), as a task would have."""
    try:
        while True:
            if isinstance(waiting_on, asyncio.Future):
                await asyncio.wait([waiting_on])  # its outcome is the coroutine's to see
            else:
                await asyncio.sleep(0)
            waiting_on = coroutine.send(None)
    except StopIteration:
        return
    except asyncio.CancelledError:
        coroutine.close()
        raise
