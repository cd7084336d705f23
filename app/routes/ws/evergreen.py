"""Evergreen over a websocket (`/evergreen/ws`): one socket is one session.

A pump between the socket and the session layer (`app.sessions.evergreen`): frames are
decoded by the core (`app.protocols.evergreen.frames`; the server answers in the
encoding of the client's first frame), the session runs, and an aborted session ends
with the core's ABORT message and close code and reason
(`app.protocols.evergreen.lifecycle`). Bearer auth as on every route (header, or
`?token=`); a refused client gets the UNAUTHENTICATED abort. A draining server refuses a
new session with the UNAVAILABLE abort, and ends an open one with it (the drain's
goodbye, `app.drain`).

Each GENERATE is a request to telemetry (`app.telemetry`): its record and span (under
the upgrade's `traceparent`), its id the socket's numbered (`<id>.1`, ...), its
access-log line once the action has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, WebSocket

from app.errors import SwitchboardError
from app.protocols.evergreen import frames
from app.protocols.evergreen.lifecycle import abort_message, close_code, close_reason
from app.routes.deps import get_admission, get_drain, get_engine, get_settings, principal_of
from app.routes.ws.pump import WebSocketPump
from app.sessions.evergreen import EvergreenRun
from app.telemetry.http import caller_of
from schemas import evergreen_service_pb2 as service_pb

router = APIRouter()


@router.websocket("/evergreen/ws")
async def evergreen_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    pump, encoding = WebSocketPump(websocket), frames.Encoding()

    async def send(message: service_pb.SessionMessage) -> None:
        await pump.send(encoding.encode(message))

    async def messages() -> AsyncIterator[service_pb.SessionMessage]:
        async for frame in pump.frames():
            yield encoding.decode(frame)

    settings, drain = get_settings(websocket), get_drain(websocket)
    failure: SwitchboardError | None
    closed = asyncio.Event()
    unsubscribe = None
    try:
        principal_of(websocket)
        drain.check_open()
    except SwitchboardError as exc:
        failure = exc
    else:
        run = EvergreenRun.from_settings(
            get_engine(websocket),
            get_admission(websocket),
            settings,
            send,
            websocket.app.state.telemetry,
            caller_of(websocket),
        )

        async def goodbye() -> None:
            run.stop(drain.refusal())
            await closed.wait()

        unsubscribe = drain.subscribe(goodbye)
        failure = await run.serve(messages())
    try:
        if failure is not None:
            await send(abort_message(failure))
            await pump.close(close_code(failure), close_reason(failure))
    finally:
        if unsubscribe is not None:
            unsubscribe()
        closed.set()
