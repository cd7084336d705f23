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

Each call is a request of its own to telemetry (`app.telemetry`): its record and span
(under the upgrade's `traceparent`), its id the socket's numbered (`<id>.1`, ...), its
access-log line once it has answered (a Generate: once its stream has ended).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, WebSocket

from app.errors import SwitchboardError
from app.protocols.salience import envelope
from app.protocols.salience.envelope import Call, CallIds, Cancel
from app.routes.deps import get_drain, get_objects
from app.routes.ws.opening import GOING_AWAY, caller, refusal_close_code
from app.routes.ws.pump import WebSocketPump
from app.sessions.lifetime import SessionLifetime
from app.sessions.salience import SalienceRunner
from app.telemetry.callers import Caller
from app.telemetry.http import caller_of
from app.telemetry.logs import logging_as
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.tenants import Principal
from schemas import salience_pb2 as pb

router = APIRouter()


@router.websocket("/salience/ws")
async def salience_socket(websocket: WebSocket) -> None:
    pump, lifetime = WebSocketPump(websocket), SessionLifetime(get_drain(websocket))
    binary = False  # the encoding of the client's last call: the goodbye's
    pump.on_frame_too_large(lambda error: envelope.error("", binary, error))
    await websocket.accept()
    try:
        principal = lifetime.open(lambda: caller(websocket))
    except SwitchboardError as refused:
        await pump.send(envelope.error("", False, refused))
        await pump.close(refusal_close_code(refused))
        return
    runner, calls = get_objects(websocket.app).salience, CallIds()
    calls_of = _Records(get_objects(websocket.app).telemetry, caller_of(websocket))

    async def goodbye(refusal: SwitchboardError) -> None:
        await pump.send(envelope.error("", binary, refusal))
        await pump.close(GOING_AWAY)

    async with lifetime.serving(goodbye), pump:
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

            record = calls_of.open(call)

            async def failed(
                exc: SwitchboardError, call: Call = call, record: RequestRecord = record
            ) -> None:
                record.failed(exc)
                await pump.send(envelope.error(call.call_id, call.binary, exc))

            with logging_as(record.request_id):
                try:
                    work = _call(pump, runner, calls, call, principal, record, calls_of)
                    await pump.guard(work, failed)
                finally:
                    if record not in calls_of.streaming:  # else its stream's end
                        calls_of.close(record)


class _Records:
    """The records of a socket's calls."""

    def __init__(self, telemetry: Telemetry, caller: Caller) -> None:
        self._telemetry = telemetry
        self._caller = caller
        self.streaming: set[RequestRecord] = set()  # Generates under way: reported at their end

    def open(self, call: Call) -> RequestRecord:
        # A Generate is the API's inference; the other calls keep its sessions.
        api = "salience" if call.method == "Generate" else None
        name = f"salience.v1.Salience/{call.method}"
        return self._telemetry.open_call(self._caller, name=name, api=api)

    def close(self, record: RequestRecord) -> None:
        self.streaming.discard(record)
        self._telemetry.close(record)


async def _call(
    pump: WebSocketPump,
    runner: SalienceRunner,
    calls: CallIds,
    call: Call,
    principal: Principal,
    record: RequestRecord,
    records: _Records,
) -> None:
    if call.method != "Generate":
        answer = await runner.unary(call.method, call.request, principal)
        await pump.send(envelope.response(call, answer))
        return
    calls.check(call)
    generation = await runner.start_generate(call.request, principal, record)
    calls.add(call, generation)

    async def emit(event: pb.GenerateEvent) -> None:
        await pump.send(envelope.response(call, event))

    async def stream() -> None:
        try:
            await runner.run_generate(generation, emit)
        finally:
            calls.forget(call.call_id, generation)

    async def failed(exc: SwitchboardError) -> None:
        record.failed(exc)
        await pump.send(envelope.error(call.call_id, call.binary, exc))

    async def reported() -> None:
        try:
            await pump.guard(stream(), failed)
        except asyncio.CancelledError:  # the socket closed
            record.cancelled = True
            raise
        finally:
            records.close(record)

    records.streaming.add(record)
    pump.spawn(reported(), failed)
