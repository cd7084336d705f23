"""`salience.v1.Salience` over native gRPC: a thin adapter over the session layer.

Each RPC of the published service is one call of the process's `SalienceRunner`, the same
one the websocket (`/salience/ws`) uses: a session opened here can be generated in,
forked, dumped or closed over the websocket and the reverse, and `CloseSession` from
either transport cancels the session's running Generate on the other (its stream ends
with Done FINISH_REASON_CANCELLED).

- Unary RPCs answer the runner's response; Generate streams its `GenerateEvent`s, ending
  with Done.
- Errors end the call with the status the proto's header names (`grpc_calls.abort`):
  NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ABORTED (session busy),
  INVALID_ARGUMENT; a Generate that fails after it has streamed events ends with the
  status too, the session rolled back as the core says.
- A client that cancels its Generate, passes its deadline or drops the connection: grpcio
  cancels the handler, which aborts the engine request; the session keeps what was
  decoded (the websocket's disconnect does the same).
"""

from __future__ import annotations

from typing import Any

import grpc
from fastapi import FastAPI

from app.protocols.salience.service import METHODS, Method
from app.routes.deps import salience_runner
from app.routes.grpc.calls import Context, Service, Writer, abort, decode, register
from app.sessions.salience import SalienceRunner
from schemas import salience_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Salience"]


class _Salience:
    def __init__(self, runner: SalienceRunner) -> None:
        self._runner = runner

    def behaviours(self) -> dict[str, Any]:
        return {
            name: self.generate if method.streaming else self._unary(method)
            for name, method in METHODS.items()
        }

    def _unary(self, method: Method) -> Any:
        async def call(data: bytes, context: Context) -> Any:
            try:
                return self._runner.unary(method.name, decode(method.request, data))
            except Exception as exc:
                await abort(context, exc)

        return call

    async def generate(self, data: bytes, context: Context) -> None:
        runner = self._runner
        try:
            generation = await runner.start_generate(decode(pb.GenerateRequest, data))
            await runner.run_generate(generation, Writer(context))
        except Exception as exc:
            await abort(context, exc)


def _add(server: grpc.aio.Server, app: FastAPI) -> None:
    register(server, _SERVICE, _Salience(salience_runner(app)).behaviours())


SERVICE = Service(_SERVICE.full_name, _add)
