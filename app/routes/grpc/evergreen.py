"""`evergreen.v2.EvergreenService/StartSession` over native gRPC: one call is one session.

An encoder and a pump over the session's life (`app.sessions.evergreen.serve_session`),
as the websocket (`/evergreen/ws`) is: the client's `SessionMessage`s feed the session;
the output nodes' fragments stream back as the engine produces text.

- The client half-closing its side means it sends nothing more but still listens: the
  session drains (running actions finish, and may start others) and the call ends OK
  once none runs. Actions still waiting for inputs then can never run and are dropped.
- A broken rule or a failed action aborts the session as on the websocket: every running
  action is cancelled (aborting its engine request), the final message is the core's
  `ABORT` action (a Struct `{"code", "message"}`), and the call then ends with that gRPC
  status and message (`grpc_calls.end`: the message cut to fit a trailer, a refusal's
  retry hint as retry info), where the websocket closes with 4000 + the code. A client that
  reads only statuses sees the failure; one that reads the stream sees the ABORT first,
  as the spec's abort is a message of the session.
- A client that cancels the call, passes its deadline or drops the connection ends the
  session: its running actions are cancelled and their engine requests aborted.
- A message that does not decode is INVALID_ARGUMENT, like any broken rule.
- Admission and drain as on the websocket: a GENERATE refused by the queue bound aborts
  the session UNAVAILABLE (the ABORT's Struct carries `retry_after_s`); a draining server
  refuses a new session, and ends an open one, with ABORT UNAVAILABLE and that status.
- Telemetry as on the websocket, the call's `x-request-id` and `traceparent` metadata
  the session's (answered in its initial metadata), each GENERATE a request of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import grpc

from app.admission import Admission
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.errors import SwitchboardError
from app.objects import AppObjects
from app.protocols.evergreen.frames import decode
from app.routes.grpc.calls import Context, Service, Writer, caller_of, end, principal, register
from app.sessions.evergreen import EvergreenRun, serve_session
from app.sessions.lifetime import SessionLifetime
from app.telemetry.callers import Caller
from app.telemetry.reports import Telemetry
from app.tenants import Principal
from schemas import evergreen_service_pb2 as service_pb

_SERVICE = service_pb.DESCRIPTOR.services_by_name["EvergreenService"]


class _Evergreen:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        admission: Admission,
        drain: Drain,
        telemetry: Telemetry,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._admission = admission
        self._drain = drain
        self._telemetry = telemetry

    async def start_session(self, requests: AsyncIterable[bytes], context: Context) -> None:
        caller = caller_of(context, numbered=True)
        send = Writer(context, caller.request_id)
        connections = self._telemetry.metrics
        connections.connected("evergreen", None, +1)
        try:
            await self._serve(requests, context, caller, send)
        finally:
            connections.connected("evergreen", None, -1)

    async def _serve(
        self, requests: AsyncIterable[bytes], context: Context, caller: Caller, send: Writer
    ) -> None:

        async def messages() -> AsyncIterator[service_pb.SessionMessage]:
            async for data in requests:
                yield decode(data)

        async def ended(failure: SwitchboardError) -> None:
            await end(context, failure, failure.evergreen_reason)

        def start(who: Principal) -> EvergreenRun:
            return EvergreenRun.from_settings(
                self._engine,
                self._admission,
                self._settings,
                send,
                self._telemetry,
                caller,
                who,
            )

        lifetime = SessionLifetime(self._drain)
        await serve_session(lifetime, principal, start, messages(), send, ended, drain=True)


def _add(server: grpc.aio.Server, objects: AppObjects) -> None:
    servicer = _Evergreen(
        objects.engine, objects.settings, objects.admission, objects.drain, objects.telemetry
    )
    register(server, _SERVICE, {"StartSession": servicer.start_session})


SERVICE = Service(_SERVICE.full_name, _add)
