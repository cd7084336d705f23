"""What every gRPC adapter needs: how its service is registered, how requests decode, and
how a call ends with an error.

- `register` adds a service's handlers from its descriptor in the published proto (the
  method names and streaming shapes are the schema's, as in the generated
  `add_*Servicer_to_server`), with one difference: requests reach the adapter as bytes
  and `decode` turns them into messages, so a request that does not decode is
  INVALID_ARGUMENT with a message, where grpcio's own deserializer would end the call
  UNKNOWN with the exception's text.
- `Writer` sends a call's responses: one at a time (grpcio allows one write in flight per
  call; Evergreen's actions stream concurrently), and none once the call is over; its
  initial metadata answers the call's `x-request-id`.
- `caller_of` is the call's `Caller` (`app.telemetry`: its `x-request-id` taken or
  minted, its peer, its `traceparent` metadata), for the records of its requests;
  `answer_id` sends a unary call's request id as its initial metadata.
- `abort` is the gRPC form of the one rule for errors: a `SwitchboardError` ends the call
  with its own status (`app.errors` names it per class) and message; any other exception
  is a bug of ours, logged by `InternalError.wrap` under an id, and the client sees
  INTERNAL with that id, never the exception's text. `end` ends a call with an error's
  message under a status the caller names (Evergreen's abort reason); both go through it.
- The status message travels in a trailer (`grpc-message`, percent-encoded), and a
  client refuses trailers over 16 KiB: the call would end RESOURCE_EXHAUSTED "received
  metadata size exceeds hard limit" instead of its own status. A message quoting a
  client's long input is therefore cut to `STATUS_MESSAGE_BYTES` (the whole message
  still goes where the protocol has a body for it, as Evergreen's ABORT).
- `principal()` is the call's caller, decided by the server's interceptor from the
  call's metadata before its handler runs (`with_principal`), as a deadline is: the
  handler hands it on to the session layer.
- A refusal (`Overloaded`: the queue bound, or a draining server) carries its retry hint
  as gRPC's rich status (`grpc-status-details-bin`: a `google.rpc.Status` holding a
  `google.rpc.RetryInfo`, what grpcio-status and Google's client libraries read) and as
  `grpc-retry-pushback-ms` (what a gRPC client's own retry policy obeys).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

from app.errors import (
    InvalidRequest,
    Overloaded,
    ResourceExhausted,
    SwitchboardError,
    client_error,
)
from app.objects import AppObjects
from app.routes.send_writer import STREAM_STALL_S
from app.telemetry.callers import Caller
from app.telemetry.ids import REQUEST_ID_HEADER
from app.tenants import Principal

Context = grpc.aio.ServicerContext[Any, Any]
M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Service:
    """A protocol service: its full name, and how to add its servicer, on the app's
    objects, to a server."""

    name: str
    add: Callable[[grpc.aio.Server, AppObjects], None]


# The running call's principal: set by the handler `with_principal` wraps, in the call's
# own task, before the adapter's code runs.
_PRINCIPAL: ContextVar[Principal] = ContextVar("grpc_principal")


def principal() -> Principal:
    """The caller of the running call (the server's interceptor decided it)."""
    return _PRINCIPAL.get()


def with_principal(
    handler: grpc.RpcMethodHandler[Any, Any], caller: Principal
) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler`, its behaviour run with `caller` as `principal()`."""
    behaviour: Any = {
        (False, False): handler.unary_unary,
        (False, True): handler.unary_stream,
        (True, False): handler.stream_unary,
        (True, True): handler.stream_stream,
    }[(handler.request_streaming, handler.response_streaming)]
    if inspect.isasyncgenfunction(behaviour):

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            _PRINCIPAL.set(caller)
            async for message in behaviour(request, context):
                yield message

        return shaped_like(handler, stream)

    async def call(request: Any, context: Context) -> Any:
        _PRINCIPAL.set(caller)
        result = behaviour(request, context)
        return await result if inspect.isawaitable(result) else result

    return shaped_like(handler, call)


def shaped_like(
    handler: grpc.RpcMethodHandler[Any, Any], behaviour: Callable[..., Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of `handler`'s shape (streaming, serializers) running `behaviour`."""
    return _HANDLER_KINDS[(handler.request_streaming, handler.response_streaming)](
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def status_code(exc: SwitchboardError) -> grpc.StatusCode:
    return grpc.StatusCode[exc.grpc_status]


# Far under the 16 KiB a client takes in trailers, even percent-encoded (3 bytes a byte).
STATUS_MESSAGE_BYTES = 1024


async def abort(context: Context, exc: BaseException) -> NoReturn:
    """End the call with `exc` as its status."""
    error = client_error(exc)
    await end(context, error, error.grpc_status)


async def end(
    context: Context, error: SwitchboardError, code_name: str, request_id: str | None = None
) -> NoReturn:
    """End the call with status `code_name` and `error`'s message (cut to fit a trailer),
    plus the retry hint of a refusal, and `request_id` (a call that answered no initial
    metadata: its status is all the client gets)."""
    code = grpc.StatusCode[code_name]
    message = status_message(error)
    trailers: tuple[tuple[str, str | bytes], ...] = ()
    if isinstance(error, Overloaded):
        trailers = _retry_trailers(code, message, error.retry_after_s)
    if request_id is not None:
        trailers += ((REQUEST_ID_HEADER, request_id),)
    await context.abort(code, message, trailing_metadata=trailers)


def status_message(error: SwitchboardError) -> str:
    """`error`'s message, cut to `STATUS_MESSAGE_BYTES` (never inside a UTF-8 sequence)."""
    data = error.message.encode()
    if len(data) <= STATUS_MESSAGE_BYTES:
        return error.message
    return data[:STATUS_MESSAGE_BYTES].decode(errors="ignore") + " [cut]"


def _retry_trailers(
    code: grpc.StatusCode, message: str, retry_after_s: int
) -> tuple[tuple[str, str | bytes], ...]:
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after_s))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("grpc-retry-pushback-ms", str(retry_after_s * 1000)),
    )


class Writer:
    """One write at a time: gRPC takes one message send per call at once, and a second
    one fails the call (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS).

    The call's initial metadata goes on its own before the first message: grpcio marks
    it sent only once a write completes, so a first write abandoned in flight (the client
    not reading) would make the call's final status send the initial metadata again, and
    that status would fail the same way and never reach the client."""

    def __init__(self, context: Context, request_id: str) -> None:
        self._context = context
        self._metadata = ((REQUEST_ID_HEADER, request_id),)
        self._lock = asyncio.Lock()
        # A write the client takes nothing of for STREAM_STALL_S ends the call (as an
        # SSE or websocket reader that stops reading is cut: app.routes.http.sse).
        self._opened = False  # the initial metadata has gone
        # A write whose writer was cancelled (an aborted action) goes on in grpcio's core
        # until the client reads it or leaves; nothing more may be sent meanwhile.
        self._orphan: asyncio.Future[None] | None = None

    async def __call__(self, message: Message) -> None:
        """Write `message`; dropped once the call is over (the client cancelled it or its
        deadline passed: grpcio is cancelling the handler, which ends the work), or while
        an abandoned write is still in flight (the call is ending: its status still goes)."""
        async with self._lock:
            if self._orphan is not None and not self._orphan.done():
                return
            write = asyncio.ensure_future(self._send(message))
            try:
                async with asyncio.timeout(STREAM_STALL_S):
                    await asyncio.shield(write)
            except asyncio.CancelledError:
                self._orphan = write
                write.add_done_callback(_consume)
                raise
            except TimeoutError:  # the client stopped reading: its call ends, as a cancel's
                self._orphan = write
                write.add_done_callback(_consume)
                raise ResourceExhausted(
                    f"The client read nothing of the stream for {STREAM_STALL_S:g} s"
                ) from None
            except grpc.aio.BaseError:
                if not (self._context.done() or self._context.cancelled()):
                    raise

    async def _send(self, message: Message) -> None:
        if not self._opened:
            await self._context.send_initial_metadata(self._metadata)
            self._opened = True
        await self._context.write(message)


def _consume(write: asyncio.Future[None]) -> None:
    # The abandoned write's outcome is nobody's: the call ends with its own status.
    if not write.cancelled():
        write.exception()


def caller_of(context: Context, *, numbered: bool = False) -> Caller:
    """The call's caller (`numbered`: its requests are several, numbered after its id)."""
    metadata = context.invocation_metadata() or ()
    caller = _PRINCIPAL.get(None)  # the server's interceptor decided it
    tenant = caller.label if caller is not None else None
    return Caller.of_metadata(metadata, context.peer(), numbered=numbered, tenant=tenant)


async def answer_id(context: Context, request_id: str) -> None:
    """A unary call's request id, answered in its initial metadata."""
    await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))


def decode(message_type: type[M], data: bytes) -> M:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        name = message_type.DESCRIPTOR.full_name
        raise InvalidRequest(f"not a {name}: {exc}") from exc


def _serialize(message: Message) -> bytes:
    data: bytes = message.SerializeToString()
    return data


_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def register(
    server: grpc.aio.Server, service: ServiceDescriptor, behaviours: Mapping[str, Any]
) -> None:
    """Serve `service` with `behaviours[method name]` (each takes the request's bytes, or
    an async iterator of them, and the context); every method of the service must have
    one."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(
            behaviours[method.name], request_deserializer=None, response_serializer=_serialize
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
