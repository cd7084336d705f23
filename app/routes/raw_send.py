"""The server's own `send`, past the middleware stack, for what streams.

Every middleware here (Starlette's error layers, the HTTP metrics, the last resort)
watches a response's start and only passes its body through; wrapping each event's
`send` in five of them cost about 7% of the frontend's CPU per token (profiled at 64
streams). So the app keeps, in each HTTP call's and websocket's scope, the `send` the
server gave it (`RAW_SEND`), and what streams (an SSE body, `app.routes.http.sse`; a
websocket's frames, `app.routes.ws.frame_writer`) writes its pieces there once the
response has started through the chain. `app.main.create_app`'s app keeps it
(`keep_raw_send` in its `__call__`); `bodies_past_middleware` does the same around any
other ASGI app. Without the key (an app that keeps none) the pieces take the chain.

`cut_connection(send)` aborts the connection a server's own `send` writes to: what a
stream does to a reader that has stopped reading (`app.routes.send_writer`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

RAW_SEND = "switchboard.raw_send"


def keep_raw_send(scope: Scope, send: Send) -> None:
    """Keep the server's `send` in an HTTP call's or a websocket's `scope`."""
    if scope["type"] in ("http", "websocket"):
        scope[RAW_SEND] = send


def raw_send(scope: Scope, send: Send) -> Send:
    """The server's own `send` for this scope, or `send` (the chain's) without one."""
    kept: Send = scope.get(RAW_SEND, send)
    return kept


def bodies_past_middleware(app: ASGIApp) -> ASGIApp:
    """`app`, with the server's own `send` kept in each scope (`RAW_SEND`)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        keep_raw_send(scope, send)
        await app(scope, receive, send)

    return serve


def cut_connection(send: Send | None) -> bool:
    """Abort the connection the server's own `send` writes to (its transport closed at
    once, what it holds unsent dropped): uvicorn then reports the client's disconnect to
    the app, whose work ends as for a client that left. False for a `send` that is not
    the server's (an ASGI test client's)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        return False
    transport.abort()
    return True
