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
- Drain, as on the websocket, where a draining server refuses a new socket and ends an
  open one with its goodbye: every call that arrives once the drain has begun (unary ones
  included, CloseSession too: a gRPC call is what a new socket is to the websocket) ends
  UNAVAILABLE with the retry hint before anything runs; a Generate still running when
  the drain says its goodbyes (past the cut, `app.drain`) is ended the same way, its
  engine request aborted and its session keeping what was decoded, as the Generates of a
  socket the goodbye closes.
- Each call is a request to telemetry (`app.telemetry`): its `x-request-id` metadata
  taken or minted and answered in its initial metadata, its span under its
  `traceparent` metadata, its access-log line once it has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

import grpc

from app.drain import Drain
from app.errors import SwitchboardError, client_error
from app.objects import AppObjects
from app.protocols.salience.service import METHODS, Method
from app.routes.grpc.calls import (
    Context,
    Service,
    Writer,
    abort,
    answer_id,
    caller_of,
    decode,
    principal,
    register,
)
from app.sessions.lifetime import SessionLifetime
from app.sessions.salience import SalienceRunner
from app.telemetry.logs import logging_as
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from schemas import salience_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Salience"]


class _Salience:
    """Each call is a session (`app.sessions.lifetime`): a unary one only opens (its
    answer is its whole life), a Generate is served until its stream ends."""

    def __init__(self, runner: SalienceRunner, drain: Drain, telemetry: Telemetry) -> None:
        self._runner = runner
        self._drain = drain
        self._telemetry = telemetry

    def _record(self, name: str, context: Context) -> RequestRecord:
        caller = caller_of(context)
        # A Generate is the API's inference; the other calls keep its sessions.
        api = "salience" if name == "Generate" else None
        full = f"{_SERVICE.full_name}/{name}"
        return self._telemetry.open_call(caller, name=full, api=api)

    def behaviours(self) -> dict[str, Any]:
        return {
            name: self.generate if method.streaming else self._unary(method)
            for name, method in METHODS.items()
        }

    def _unary(self, method: Method) -> Any:
        async def call(data: bytes, context: Context) -> Any:
            record = self._record(method.name, context)
            try:
                with logging_as(record.request_id):
                    await answer_id(context, record.request_id)
                    who = SessionLifetime(self._drain).open(principal)
                    request = decode(method.request, data)
                    return await self._runner.unary(method.name, request, who)
            except Exception as exc:
                record.failed(client_error(exc))
                await abort(context, exc)
            finally:
                self._telemetry.close(record)

        return call

    async def generate(self, data: bytes, context: Context) -> None:
        runner, lifetime = self._runner, SessionLifetime(self._drain)
        task = asyncio.current_task()
        assert task is not None
        streaming = False
        said: SwitchboardError | None = None  # the drain's goodbye, once said

        async def goodbye(refusal: SwitchboardError) -> None:
            nonlocal said
            if streaming:  # once the call is ending by itself, its own status goes out
                said = refusal
                task.cancel()

        record = self._record("Generate", context)
        with logging_as(record.request_id):
            try:
                try:
                    who = lifetime.open(principal)
                except Exception as exc:
                    await self._failed(record, context, exc)
                async with lifetime.serving(goodbye):
                    try:
                        request = decode(pb.GenerateRequest, data)
                        generation = await runner.start_generate(request, who, record)
                        streaming = True
                        try:
                            await runner.run_generate(
                                generation, Writer(context, record.request_id)
                            )
                        except asyncio.CancelledError:
                            if said is None:
                                record.cancelled = True
                                raise
                            task.uncancel()  # our goodbye's, consumed here
                            raise said from None
                        finally:
                            streaming = False
                    except Exception as exc:
                        await self._failed(record, context, exc)
            finally:
                self._telemetry.close(record)

    async def _failed(self, record: RequestRecord, context: Context, exc: Exception) -> NoReturn:
        record.failed(client_error(exc))
        await abort(context, exc)


def _add(server: grpc.aio.Server, objects: AppObjects) -> None:
    servicer = _Salience(objects.salience, objects.drain, objects.telemetry)
    register(server, _SERVICE, servicer.behaviours())


SERVICE = Service(_SERVICE.full_name, _add)
