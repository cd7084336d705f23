"""Server-sent events: the encoding of one event, and the streamed responses that carry
them.

Two responses. `PushedStream`, for a call whose events the engine pushes (the engine's
`run`): each event's frames are written from the engine's own loop, as they come, by a
`BodyWriter`; the response's task waits once, for the end, not once per event (a task
woken per token cost ~1.8 us of it, with the generator layers between engine and socket
some 3-4 us, measured at 64 streams). `EventStream`, for a producer that is an async
generator of encoded events (the Responses runner), writes each as it is pulled. Either
writes straight to the ASGI `send`, one message per event, and cancels its producer when
the client disconnects (which aborts its engine requests). They replace sse-starlette's
response, whose per-event cancel scope and four tasks per stream cost the frontend about
a tenth of its CPU per token at 32 streams (profiled). Events are `data: <json>\\n\\n`,
or named (`event: <name>\\ndata: <json>\\n\\n`); no pings. The call's admission
tickets are given back when the response ends, however it ends: even when the client left
before the producer started.

The body goes to the server's own `send` (`RAW_SEND`, put in the scope by
`bodies_past_middleware` around the app uvicorn serves), past the middleware stack:
every middleware here (Starlette's error layers, the HTTP metrics, our last
resort) watches the response's start and only passes its body through, and wrapping each
event's `send` in five of them cost about 7% of the frontend's CPU per token (profiled
at 64 streams). Without the key (an ASGI test client) the body takes the chain. A pushed
body that uvicorn's httptools protocol streams chunked goes one step further, framed as
chunks straight onto the connection (`ChunkWriter`) while the client keeps up; uvicorn's
`send` still starts and ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, Generic, Protocol, TypeVar, cast

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.admission import Tickets
from app.routes.http.disconnect import ClientGone, unless_disconnected
from app.routes.http.json import dump_json

P = TypeVar("P")  # a piece a `BodyWriter` writes
DONE = b"data: [DONE]\n\n"
RAW_SEND = "switchboard.raw_send"
_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # proxies must pass each event on at once
]


def sse(body: Mapping[str, Any], event: str | None = None) -> bytes:
    """One event holding `body` as JSON: a bare `data:` line (OpenAI's Chat and
    Completions), or named by an `event:` line (the Responses API, Anthropic's)."""
    if event is None:
        return b"data: " + dump_json(body) + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + dump_json(body) + b"\n\n"


class EventStream(Response):
    """A 200 `text/event-stream` of the `events` (each one already encoded)."""

    def __init__(self, events: AsyncGenerator[bytes, None], tickets: Tickets) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.raw_headers = list(_HEADERS)
        self._events = events
        self._tickets = tickets

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._tickets:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            # A client gone has nobody to tell; its requests are aborted by then.
            with contextlib.suppress(ClientGone):
                await unless_disconnected(receive, self._pump(scope.get(RAW_SEND, send)))

    async def _pump(self, send: Send) -> None:
        try:
            async for event in self._events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            # Cancelled during a send, the producer sits at a `yield`: close it now, not
            # when the garbage collector gets to it, so its requests are aborted at once.
            await self._events.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def body_part(body: bytes) -> Message:
    """A piece of an HTTP response's body."""
    return {"type": "http.response.body", "body": body, "more_body": True}


def text_frame(text: str) -> Message:
    """A websocket text frame."""
    return {"type": "websocket.send", "text": text}


class BodyWriter(Generic[P]):
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


class Writer(Protocol):
    def write(self, piece: bytes, /) -> None: ...

    async def drained(self) -> None: ...


class ChunkWriter:
    """An HTTP/1.1 response body that uvicorn's httptools protocol is streaming chunked,
    written by framing each piece as a chunk straight onto the connection's transport:
    what uvicorn's `send` does for a body, without a message, a coroutine and its checks
    per event (~0.7 us of CPU a token of the ~1 us that `send` took, measured). uvicorn's
    own state is only read: while its flow control holds the connection (the client reads
    slower than we write) or the client has gone, each piece takes uvicorn's `send` (a
    `BodyWriter`), and so does every piece until that has caught up, so the order holds;
    the end of the body is uvicorn's to write (`PushedStream`)."""

    def __init__(self, cycle: RequestResponseCycle, send: Send) -> None:
        self._cycle = cycle
        self._waiting = BodyWriter(send, body_part, b"".join)

    def write(self, piece: bytes) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused or cycle.disconnected or self._waiting.busy:
            self._waiting.write(piece)
        elif piece:  # an empty chunk would end the body
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))

    async def drained(self) -> None:
        await self._waiting.drained()


def body_writer(send: Send) -> Writer:
    """An HTTP response's body, written as it comes: chunks straight onto the connection
    when `send` is uvicorn's own for a chunked body under way (`RAW_SEND`), else each piece
    as an ASGI message."""
    cycle = getattr(send, "__self__", None)
    if (
        isinstance(cycle, RequestResponseCycle)
        and cycle.response_started
        and not cycle.response_complete
        and cycle.chunked_encoding
        and cycle.scope["method"] != "HEAD"
    ):
        return ChunkWriter(cycle, send)
    return BodyWriter(send, body_part, b"".join)


def frame_writer(send: Send) -> BodyWriter[str]:
    """A websocket's text frames, written as they come."""
    return BodyWriter(send, text_frame, None)


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


Produce = Callable[[Callable[[bytes], None]], Awaitable[None]]


class PushedStream(Response):
    """A 200 `text/event-stream` whose events `produce(write)` writes as they come (each
    already encoded), from any code on the event loop, its own task waiting once, then
    `tail` (OpenAI's `[DONE]`, say) in the one write that ends the body: the end's
    separate write was one more socket write per request."""

    def __init__(self, produce: Produce, tickets: Tickets, tail: bytes = b"") -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.raw_headers = list(_HEADERS)
        self._produce = produce
        self._tickets = tickets
        self._tail = tail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._tickets:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            send = scope.get(RAW_SEND, send)
            writer = body_writer(send)
            # A client gone has nobody to tell; its requests are aborted by then.
            with contextlib.suppress(ClientGone):
                await unless_disconnected(receive, self._produce(writer.write))
            await writer.drained()
        await send({"type": "http.response.body", "body": self._tail, "more_body": False})


def bodies_past_middleware(app: ASGIApp) -> ASGIApp:
    """`app`, with the server's own `send` in each HTTP call's and websocket's scope
    (`RAW_SEND`)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope[RAW_SEND] = send
        await app(scope, receive, send)

    return serve
