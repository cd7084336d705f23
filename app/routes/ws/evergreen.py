"""Evergreen over a websocket (`/evergreen/ws`): one socket is one session.

An encoder and a pump over the session's life (`app.sessions.evergreen.serve_session`):
frames are decoded by the core (`app.protocols.evergreen.frames`; the server answers in
the encoding of the client's first frame), and a session that ends in failure ends with
its ABORT message, then the socket's close with the code and reason the core gives it
(`app.protocols.evergreen.lifecycle`). The opening's checks are every websocket's
(`app.routes.ws.opening.caller`: a refused key is the UNAUTHENTICATED abort); a draining
server refuses a new session with the UNAVAILABLE abort, and ends an open one with it
(the drain's goodbye, `app.drain`).

Each GENERATE is a request to telemetry (`app.telemetry`): its record and span (under
the upgrade's `traceparent`), its id the socket's numbered (`<id>.1`, ...), its
access-log line once the action has ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, WebSocket

from app.errors import SwitchboardError
from app.protocols.evergreen import frames
from app.protocols.evergreen.lifecycle import abort_message, close_code, close_reason
from app.routes.deps import get_objects, get_settings
from app.routes.ws.opening import caller
from app.routes.ws.pump import WebSocketPump
from app.sessions.evergreen import EvergreenRun, serve_session
from app.sessions.lifetime import SessionLifetime
from app.telemetry.http import caller_of
from app.tenants import Principal
from schemas import evergreen_service_pb2 as service_pb

router = APIRouter()


@router.websocket("/evergreen/ws")
async def evergreen_socket(websocket: WebSocket) -> None:
    pump, encoding = WebSocketPump(websocket), frames.Encoding()
    pump.on_frame_too_large(lambda error: encoding.encode(abort_message(error)))
    await websocket.accept()

    async def send(message: service_pb.SessionMessage) -> None:
        await pump.send(encoding.encode(message))

    async def messages() -> AsyncIterator[service_pb.SessionMessage]:
        async for frame in pump.frames():
            yield encoding.decode(frame)

    async def end(failure: SwitchboardError) -> None:
        await pump.close(close_code(failure), close_reason(failure))

    objects = get_objects(websocket.app)

    def start(who: Principal) -> EvergreenRun:
        return EvergreenRun.from_settings(
            objects.engine,
            objects.admission,
            get_settings(websocket),
            send,
            objects.telemetry,
            caller_of(websocket),
            who,
        )

    lifetime = SessionLifetime(objects.drain)
    await serve_session(lifetime, lambda: caller(websocket), start, messages(), send, end)
