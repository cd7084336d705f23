"""`evergreen.v2.EvergreenService/StartSession` over native gRPC: one call is one session.

A thin adapter over the session layer (`app.sessions.evergreen.EvergreenRun`), as the
websocket (`/evergreen/ws`) is: the client's `SessionMessage`s feed the session; the
output nodes' fragments stream back as the engine produces text.

- The client half-closing its side means it sends nothing more but still listens: the
  session drains (running actions finish, and may start others) and the call ends OK
  once none runs. Actions still waiting for inputs then can never run and are dropped.
- A broken rule or a failed action aborts the session as on the websocket: every running
  action is cancelled (aborting its engine request), the final message is the core's
  `ABORT` action (a Struct `{"code", "message"}`), and the call then ends with that gRPC
  status and message (where the websocket closes with 4000 + the code). A client that
  reads only statuses sees the failure; one that reads the stream sees the ABORT first,
  as the spec's abort is a message of the session.
- A client that cancels the call, passes its deadline or drops the connection ends the
  session: its running actions are cancelled and their engine requests aborted.
- A message that does not decode is INVALID_ARGUMENT, like any broken rule.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import grpc
from fastapi import FastAPI

from app.config import Settings
from app.engine.base import Engine
from app.protocols.evergreen.frames import decode
from app.protocols.evergreen.lifecycle import abort_message
from app.routes.grpc_calls import Context, Service, Writer, register
from app.sessions.evergreen import EvergreenRun
from schemas import evergreen_service_pb2 as service_pb

_SERVICE = service_pb.DESCRIPTOR.services_by_name["EvergreenService"]


class _Evergreen:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self._engine = engine
        self._settings = settings

    async def start_session(self, requests: AsyncIterable[bytes], context: Context) -> None:
        send = Writer(context)

        async def messages() -> AsyncIterator[service_pb.SessionMessage]:
            async for data in requests:
                yield decode(data)

        run = EvergreenRun.from_settings(self._engine, self._settings, send)
        failure = await run.serve(messages(), drain=True)
        if failure is not None:
            await send(abort_message(failure))
            await context.abort(grpc.StatusCode[failure.evergreen_reason], failure.message)


def _add(server: grpc.aio.Server, app: FastAPI) -> None:
    servicer = _Evergreen(app.state.engine, app.state.settings)
    register(server, _SERVICE, {"StartSession": servicer.start_session})


SERVICE = Service(_SERVICE.full_name, _add)
