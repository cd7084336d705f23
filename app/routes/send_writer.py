"""Writing to an ASGI `send` from synchronous code (the engine's loop, which pushes each
step's events to every stream at once), in order, without a task per piece.

`SendWriter(send, message, join)` turns each written piece into the ASGI message
`message` makes of it and runs `send` at once: it finishes without waiting unless the
connection's buffer is full (the server waits for it to drain before writing). Then a
task finishes that send, and what is written meanwhile waits behind it: joined into one
piece (`join`, a body's bytes) or sent piece by piece (a websocket's frames); `drained`
waits for it all. What streams builds one: an HTTP body (`app.routes.http.sse`), a
websocket's frames (`app.routes.ws.frame_writer`).

A reader that stops reading is cut: once what waits behind a send that the client does
not take passes `STREAM_BACKLOG_BYTES`, or a send has waited `STREAM_STALL_S` without the
client taking a byte, the connection is aborted (`app.routes.raw_send.cut_connection`),
which the server reports as the client's disconnect, so the stream's producer is
cancelled and its engine requests aborted as for any client that leaves. Before, the
backlog grew with every event for as long as the engine generated, and a finished stream
waited for its reader for ever, holding its admission places. `send_within_stall` bounds
one awaited send the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar, cast

from starlette.types import Message, Send

from app.routes.http.disconnect import ClientGone
from app.routes.raw_send import cut_connection

logger = logging.getLogger(__name__)

P = TypeVar("P")  # a piece a `SendWriter` writes
# What may wait for a reader that has stopped reading, per stream (some thousands of
# tokens' events, beside the kernel's socket buffers and the transport's 64 KiB), and how
# long a send may wait for it to take anything.
STREAM_BACKLOG_BYTES = 1 << 20
STREAM_STALL_S = 30.0


class SendWriter(Generic[P]):
    """Writes a response's body, or a websocket's frames, from synchronous code (the
    engine's loop), in order: each piece becomes the ASGI message `message` makes of it.

    Each `write` runs the server's `send` at once: it finishes without waiting unless the
    connection's buffer is full (uvicorn waits for it to drain before writing). Then a
    task finishes that send, and what is written meanwhile waits behind it: joined into
    one chunk (`join`, a body's bytes), or sent piece by piece (a websocket's frames);
    `drained` waits for it all."""

    def __init__(
        self,
        send: Send,
        message: Callable[[P], Message],
        join: Callable[[list[P]], P] | None,
        *,
        max_backlog: int = STREAM_BACKLOG_BYTES,
        stall_s: float = STREAM_STALL_S,
    ) -> None:
        self._send = send
        self._message = message
        self._join = join
        self._backlog: list[P] | None = None  # a send is waiting: what comes next
        self._backlog_bytes = 0
        self._flushing: asyncio.Future[None] | None = None
        self._max_backlog = max_backlog
        self._stall_s = stall_s
        self._stall: asyncio.TimerHandle | None = None
        self.cut = False  # the reader stopped reading: its connection was aborted

    def write(self, piece: P) -> None:
        if self.cut:
            return
        if self._backlog is not None:
            self._backlog.append(piece)
            self._backlog_bytes += len(piece)  # type: ignore[arg-type]  # bytes or str
            if self._backlog_bytes > self._max_backlog:
                self._cut(f"{self._backlog_bytes} bytes waited for it")
            return
        message = self._message(piece)
        started = cast(Coroutine[Any, Any, None], self._send(message))  # an async def's
        try:
            waiting_on = started.send(None)
        except StopIteration:
            return
        self._backlog = []
        self._backlog_bytes = 0
        self._progress()
        self._flushing = asyncio.ensure_future(self._finish(started, waiting_on))

    async def _finish(self, started: Coroutine[Any, Any, None], waiting_on: object) -> None:
        try:
            await _resume(started, waiting_on)
            while self._backlog:
                self._progress()
                pieces, self._backlog, self._backlog_bytes = self._backlog, [], 0
                if self._join is not None:
                    pieces = [self._join(pieces)]
                for piece in pieces:
                    await self._send(self._message(piece))
        finally:
            self._backlog = None
            self._backlog_bytes = 0
            if self._stall is not None:
                self._stall.cancel()
                self._stall = None

    def _progress(self) -> None:
        """A send has gone through: the stall is counted from now."""
        if self._stall is not None:
            self._stall.cancel()
        loop = asyncio.get_running_loop()
        why = f"no byte taken in {self._stall_s:g} s"
        self._stall = loop.call_later(self._stall_s, self._cut, why)

    def _cut(self, why: str) -> None:
        if self.cut:
            return
        self.cut = True
        self._backlog = [] if self._backlog is not None else None
        self._backlog_bytes = 0
        logger.info("a stream's reader stopped reading (%s): its connection is cut", why)
        cut_connection(self._send)

    async def drained(self) -> None:
        """Once every write has reached the server's `send`."""
        if self._flushing is not None:
            await self._flushing

    @property
    def busy(self) -> bool:
        """A send is waiting; what is written meanwhile follows it."""
        return self._backlog is not None


async def send_within_stall(send: Send, message: Message) -> None:
    """`send(message)`, or the connection cut (`cut_connection`) and `ClientGone` once
    it has waited `STREAM_STALL_S` for a reader that takes nothing."""
    try:
        async with asyncio.timeout(STREAM_STALL_S):
            await send(message)
    except TimeoutError:
        logger.info("a stream's reader took nothing in %g s: its connection is cut", STREAM_STALL_S)
        cut_connection(send)
        raise ClientGone from None


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
