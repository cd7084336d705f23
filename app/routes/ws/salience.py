"""Salience over one websocket (`/salience/ws`): many calls per socket, JSON or protobuf.

A pump between the socket and the session layer (`app.sessions.salience`, one runner per
app, so that sessions outlive sockets): frames are parsed by the core's envelope
(`app.protocols.salience.envelope`), each call is answered in its own encoding, a
malformed frame gets INVALID_ARGUMENT and the socket stays usable. Calls run in frame
order; a Generate, once applied to its session, streams in a task of its own. Closing
the socket cancels its running Generates (aborting their engine requests); sessions stay
for a reconnect. Bearer auth as on every route; a refused client gets one
UNAUTHENTICATED error frame and close code 1008. A draining server refuses a new socket
with one UNAVAILABLE error frame and close code 1001 (going away), and ends an open one
the same way (the drain's goodbye, `app.drain`), in the encoding of its last call.
"""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from app.errors import SwitchboardError
from app.protocols.salience import envelope
from app.protocols.salience.envelope import Call, CallIds, Cancel
from app.routes.deps import get_drain, principal_of, salience_runner
from app.routes.ws.pump import WebSocketPump
from app.sessions.salience import SalienceRunner
from schemas import salience_pb2 as pb

router = APIRouter()
GOING_AWAY = 1001


@router.websocket("/salience/ws")
async def salience_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    pump, drain = WebSocketPump(websocket), get_drain(websocket)
    try:
        principal_of(websocket)
    except SwitchboardError as exc:
        await pump.send(envelope.error("", False, exc))
        await pump.close(1008)
        return
    try:
        drain.check_open()
    except SwitchboardError as exc:
        await pump.send(envelope.error("", False, exc))
        await pump.close(GOING_AWAY)
        return
    runner, calls = salience_runner(websocket.app), CallIds()
    binary = False  # the encoding of the client's last call: the goodbye's

    async def goodbye() -> None:
        await pump.send(envelope.error("", binary, drain.refusal()))
        await pump.close(GOING_AWAY)

    unsubscribe = drain.subscribe(goodbye)
    try:
        async with pump:
            async for frame in pump.frames():
                try:
                    call = envelope.parse(frame)
                except envelope.BadFrame as bad:
                    await pump.send(envelope.error(bad.call_id, bad.binary, bad))
                    continue
                binary = call.binary
                if isinstance(call, Cancel):
                    calls.cancel(call.call_id)
                    continue

                async def failed(exc: SwitchboardError, call: Call = call) -> None:
                    await pump.send(envelope.error(call.call_id, call.binary, exc))

                await pump.guard(_call(pump, runner, calls, call), failed)
    finally:
        unsubscribe()


async def _call(pump: WebSocketPump, runner: SalienceRunner, calls: CallIds, call: Call) -> None:
    if call.method != "Generate":
        await pump.send(envelope.response(call, await runner.unary(call.method, call.request)))
        return
    calls.check(call)
    generation = await runner.start_generate(call.request)
    calls.add(call, generation)

    async def emit(event: pb.GenerateEvent) -> None:
        await pump.send(envelope.response(call, event))

    async def stream() -> None:
        try:
            await runner.run_generate(generation, emit)
        finally:
            calls.forget(call.call_id, generation)

    async def failed(exc: SwitchboardError) -> None:
        await pump.send(envelope.error(call.call_id, call.binary, exc))

    pump.spawn(stream(), failed)
