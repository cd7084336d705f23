"""`grpc_calls.Writer` when a write is abandoned: its writer (an Evergreen action) is
cancelled while the message is still in flight because the client has not read it.

grpcio's core keeps that send going after the Python side stops waiting, and takes one
send per call at once: a second send (the session's ABORT message) while it is in flight
fails the call (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS), and the aborting session never ends
with its status. The Writer drops later messages until the abandoned write ends, so the
call still ends with its status. Two tests, each bounded in seconds:

- over a real grpcio server and channel (no engine): a message too large for the
  client's flow-control window stays in flight while the client reads nothing; its writer
  is cancelled, the handler sends once more and ends the call with a status, and the
  client must then read that status;
- over a fake call that behaves as grpcio's core does (a cancelled send stays in flight,
  a second one fails), checking what the Writer sends and when.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import grpc
import pytest
from google.protobuf import wrappers_pb2

from app.errors import ResourceExhausted
from app.routes.grpc.calls import Context, Writer
from tests import grpc_bytes
from tests.conftest import free_port

BIG = 16 * 1024 * 1024  # far past a stream's HTTP/2 window: in flight until the client reads
LIMIT = 64 * 1024 * 1024
BOUND_S = 10.0
METHOD = "/test.Writer/Stream"


def _message(data: bytes) -> wrappers_pb2.BytesValue:
    return wrappers_pb2.BytesValue(value=data)


@pytest.mark.parametrize("earlier", [False, True], ids=["first-message", "after-one"])
async def test_a_write_abandoned_in_flight_lets_the_call_end_with_its_status(
    earlier: bool,
) -> None:
    handler_saw: list[str] = []
    second_send_done = asyncio.Event()

    async def stream(requests: Any, context: Any) -> None:
        send = Writer(context, "r-1")
        if earlier:  # a message that fits the window goes first, and is sent
            await send(_message(b"hello"))
        first = asyncio.ensure_future(send(_message(b"x" * BIG)))
        await asyncio.sleep(0.5)
        handler_saw.append("first in flight" if not first.done() else "first done")
        first.cancel()  # the action is aborted: its writer stops waiting
        with contextlib.suppress(asyncio.CancelledError):
            await first
        try:
            await send(_message(b"ABORT"))  # the session's last message
        except BaseException as exc:
            handler_saw.append(f"second send raised {exc!r}")
            raise
        finally:
            second_send_done.set()
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the session aborted")

    server = grpc.aio.server(
        options=[("grpc.max_send_message_length", LIMIT), ("grpc.so_reuseport", 0)]
    )
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Stream": grpc.stream_stream_rpc_method_handler(
            stream, response_serializer=lambda m: m.SerializeToString()
        )
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Writer", handlers),)
    )
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        options = [("grpc.max_receive_message_length", LIMIT)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = grpc_bytes.stream_stream(channel, METHOD)(iter(()), timeout=2 * BOUND_S)
            # The client reads nothing until the handler has cancelled the first writer
            # and sent again.
            await asyncio.wait_for(second_send_done.wait(), BOUND_S)
            received = []
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                async with asyncio.timeout(BOUND_S):
                    async for reply in call:
                        received.append(len(reply))
    finally:
        await server.stop(0)
    assert handler_saw == ["first in flight"], handler_saw
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
        ended.value.code(),
        ended.value.details(),
    )
    assert ended.value.details() == "the session aborted"


class CoreLikeCall:
    """A call's sends as grpcio's core and its aio context do them: one message send at a
    time; a send stays in flight until the client reads it, even when the coroutine
    awaiting it is cancelled; the initial metadata goes with the first message unless sent
    before, and counts as sent only once that message has gone; a batch that repeats an
    op in flight fails (TOO_MANY_OPERATIONS), the final status included."""

    def __init__(self) -> None:
        self.in_flight: asyncio.Future[None] | None = None
        self.metadata_in_flight = False
        self.metadata_sent = False
        self.sent: list[bytes] = []
        self.status: tuple[grpc.StatusCode, str] | None = None

    def _busy(self) -> bool:
        return self.in_flight is not None and not self.in_flight.done()

    async def send_initial_metadata(self, metadata: Any) -> None:
        if self.metadata_sent or self.metadata_in_flight:
            raise RuntimeError("Send initial metadata failed: already sent")
        self.metadata_sent = True

    async def write(self, message: wrappers_pb2.BytesValue) -> None:
        if self._busy():
            raise RuntimeError(TOO_MANY)
        self.metadata_in_flight = not self.metadata_sent
        self.in_flight = asyncio.get_running_loop().create_future()
        self.sent.append(message.value)
        await asyncio.shield(self.in_flight)  # cancelling the waiter leaves the send going
        self.metadata_sent = True

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        if not self.metadata_sent and self.metadata_in_flight and self._busy():
            raise RuntimeError(TOO_MANY)  # the status's batch repeats the initial metadata
        self.status = (code, details)
        if self._busy():  # the call is over: so is a send still in flight
            assert self.in_flight is not None
            self.in_flight.cancel()

    def client_reads(self) -> None:
        if self._busy():
            assert self.in_flight is not None
            self.in_flight.set_result(None)
            self.metadata_in_flight = False

    def done(self) -> bool:
        return self.status is not None

    def cancelled(self) -> bool:
        return False


TOO_MANY = "Failed grpc_call_start_batch: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS"


async def test_sends_after_an_abandoned_write_are_dropped_and_the_status_goes() -> None:
    call = CoreLikeCall()
    send = Writer(cast(Context, call), "r-1")  # the double has what a Writer uses of a call
    first = asyncio.ensure_future(send(_message(b"fragment")))
    await asyncio.sleep(0.01)
    first.cancel()  # the action is aborted while its fragment waits for the client
    with pytest.raises(asyncio.CancelledError):
        await first
    # The ABORT message while the fragment is still in flight: dropped at once (the call
    # is ending; its status says why), not a second send.
    await asyncio.wait_for(send(_message(b"ABORT")), BOUND_S)
    assert call.sent == [b"fragment"]
    await call.abort(grpc.StatusCode.INVALID_ARGUMENT, "the session aborted")
    assert call.status == (grpc.StatusCode.INVALID_ARGUMENT, "the session aborted")


async def test_once_an_abandoned_write_has_gone_the_call_takes_sends_again() -> None:
    call = CoreLikeCall()
    send = Writer(cast(Context, call), "r-1")  # the double has what a Writer uses of a call
    first = asyncio.ensure_future(send(_message(b"fragment")))
    await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    call.client_reads()
    await asyncio.sleep(0)
    later = asyncio.ensure_future(send(_message(b"later")))
    await asyncio.sleep(0.01)
    call.client_reads()
    await asyncio.wait_for(later, BOUND_S)
    assert call.sent == [b"fragment", b"later"]


async def test_a_write_the_client_never_takes_ends_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader that stops reading is cut, as an SSE or websocket one is: the write waits
    its stall bound, then the call ends RESOURCE_EXHAUSTED (its engine work with it) and
    the abandoned write no longer blocks the status."""
    monkeypatch.setattr("app.routes.grpc.calls.STREAM_STALL_S", 0.2)
    call = CoreLikeCall()
    send = Writer(cast(Context, call), "r-1")  # the double has what a Writer uses of a call
    with pytest.raises(ResourceExhausted, match=r"read nothing of the stream for 0\.2 s"):
        await asyncio.wait_for(send(_message(b"fragment")), BOUND_S)
    await asyncio.wait_for(send(_message(b"ABORT")), BOUND_S)  # dropped: the call is ending
    assert call.sent == [b"fragment"]
    await call.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "stalled")
    assert call.status == (grpc.StatusCode.RESOURCE_EXHAUSTED, "stalled")
