"""Server-sent events: the encoding of one event, and the streamed response that carries
them.

`EventStream` writes each event straight to the ASGI `send`, one message per event, and
cancels its producer when the client disconnects (which closes the producer's engine
iterators, so their requests are aborted). It replaces sse-starlette's response, whose
per-event cancel scope and four tasks per stream cost the frontend about a tenth of its
CPU per token at 32 streams (profiled). Events are `data: <json>\\n\\n`, or named
(`event: <name>\\ndata: <json>\\n\\n`); no pings. The call's admission tickets are
given back when the response ends, however it ends: even when the client left before the
producer started.

The body goes to the server's own `send` (`RAW_SEND`, put in the scope by
`bodies_past_middleware` around the app uvicorn serves), past the middleware stack:
every middleware here (Starlette's error layers, the Prometheus instrumentator, our last
resort) watches the response's start and only passes its body through, and wrapping each
event's `send` in five of them cost about 7% of the frontend's CPU per token (profiled
at 64 streams). Without the key (an ASGI test client) the body takes the chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.admission import Tickets
from app.routes.http.disconnect import ClientGone, unless_disconnected
from app.routes.http.json import dump_json

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


def bodies_past_middleware(app: ASGIApp) -> ASGIApp:
    """`app`, with the server's own `send` in each HTTP call's scope (`RAW_SEND`)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await app(scope, receive, send)

    return serve
