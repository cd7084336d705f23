"""One session of a session-shaped protocol on any transport, from its opening to its
close: what every websocket and gRPC adapter of Evergreen, Salience and the Responses
API's websocket mode drives, written once.

A session is a websocket, a gRPC stream, or a gRPC call of a session protocol (what a
new socket is to the websocket). Its life, in order:

1. Opening (`open`): the one place a new session is judged, before anything of it
   exists: who the caller is (the transport's `authenticate`, its reading of the key:
   `Unauthenticated` / `PermissionDenied` raised), then whether the server still opens
   sessions (a draining server's refusal, `Overloaded`, raised). The transport answers a
   refusal in its protocol's shape (an Evergreen ABORT and close code, a Salience error
   frame, a handshake's denial, a gRPC status). A check every session must pass goes
   here; one a transport alone has (a websocket's Origin) goes in its `authenticate`.
2. Serving (`async with serving(goodbye)`): the session runs inside the block.
   Meanwhile the drain's goodbye to it (`app.drain`, once the work in flight has ended
   or been cut) is `goodbye(refusal)`, the transport's way to end a session in its
   protocol's shape; the drain then waits for the block's exit, so that it stops the
   engine only once the session is gone (its engine requests aborted).
3. Closing: leaving the block. No goodbye is said after it, and a goodbye under way
   returns.

Adding a transport to a session protocol is then an encoder and a pump: its frames in
and out, its way to refuse, to say goodbye and to end; nothing of this sequence copied.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from app.drain import Drain
from app.errors import SwitchboardError
from app.tenants import Principal

Goodbye = Callable[[SwitchboardError], Awaitable[None]]


class SessionLifetime:
    def __init__(self, drain: Drain) -> None:
        self._drain = drain

    def open(self, authenticate: Callable[[], Principal]) -> Principal:
        """The caller's principal, once the session may open; the refusal raised."""
        principal = authenticate()
        self._drain.check_open()
        return principal

    @asynccontextmanager
    async def serving(self, goodbye: Goodbye) -> AsyncIterator[None]:
        """Serve the session inside; the drain's goodbye meanwhile is `goodbye` with its
        refusal, then waiting for the block's exit (the session's close)."""
        closed = asyncio.Event()

        async def say() -> None:
            await goodbye(self._drain.refusal())
            await closed.wait()

        unsubscribe = self._drain.subscribe(say)
        try:
            yield
        finally:
            unsubscribe()
            closed.set()
