"""Server-sent events: the encoding of one event, and the streamed responses that carry
them.

Two responses. `PushedStream`, for a call whose events the engine pushes (the engine's
`run`): each event's frames are written from the engine's own loop, as they come, by a
`SendWriter`; the response's task waits once, for the end, not once per event (a task
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

The body goes to the server's own `send`, past the middleware stack
(`app.routes.raw_send`), written from the engine's loop by a `SendWriter`
(`app.routes.send_writer`). A pushed body that uvicorn's httptools protocol streams
chunked goes one step further, framed as chunks straight onto the connection
(`ChunkWriter`) while the client keeps up; uvicorn's `send` still starts and ends it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.admission import Tickets
from app.routes.http.disconnect import ClientGone, unless_disconnected
from app.routes.http.json import dump_json
from app.routes.raw_send import raw_send
from app.routes.send_writer import SendWriter, send_within_stall

DONE = b"data: [DONE]\n\n"
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
                await unless_disconnected(receive, self._pump(raw_send(scope, send)))

    async def _pump(self, send: Send) -> None:
        try:
            async for event in self._events:
                await send_within_stall(send, body_part(event))
        finally:
            # Cancelled during a send, the producer sits at a `yield`: close it now, not
            # when the garbage collector gets to it, so its requests are aborted at once.
            await self._events.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def body_part(body: bytes) -> Message:
    """A piece of an HTTP response's body."""
    return {"type": "http.response.body", "body": body, "more_body": True}


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
    `SendWriter`), and so does every piece until that has caught up, so the order holds;
    the end of the body is uvicorn's to write (`PushedStream`)."""

    def __init__(self, cycle: RequestResponseCycle, send: Send) -> None:
        self._cycle = cycle
        self._waiting = SendWriter(send, body_part, b"".join)

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
    return SendWriter(send, body_part, b"".join)


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
            send = raw_send(scope, send)
            writer = body_writer(send)
            # A client gone has nobody to tell; its requests are aborted by then.
            with contextlib.suppress(ClientGone):
                await unless_disconnected(receive, self._produce(writer.write))
            await writer.drained()
        await send({"type": "http.response.body", "body": self._tail, "more_body": False})
