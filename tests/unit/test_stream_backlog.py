"""A reader that stops reading is cut, within bounded memory and time: the writer of every
pushed body and websocket's frames aborts the connection once what waits for the reader
passes `STREAM_BACKLOG_BYTES`, or a send has waited `STREAM_STALL_S`; the client's
engine requests are then aborted as for a client that leaves. Over the fake engine, on
the uvicorn `switchboard serve` runs, with a raw socket that reads the answer's head and
then nothing; and the writer alone, with a send that never completes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncGenerator, Callable, MutableMapping
from typing import Any

from app.engine.base import GenerationRequest, TokenEvent
from app.routes.http.sse import body_part
from app.routes.send_writer import STREAM_BACKLOG_BYTES, SendWriter
from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import served_as_switchboard

DEADLINE_S = 30.0


class StuckTransport:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


class StuckSend:
    """A server's `send` whose client never reads: every send waits for ever (until the
    transport is aborted)."""

    def __init__(self) -> None:
        self.transport = StuckTransport()
        self.sent = 0

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent += 1
        while not self.transport.aborted:
            await asyncio.sleep(0.01)


async def test_the_backlog_past_its_bound_cuts_the_connection() -> None:
    stuck = StuckSend()
    writer = SendWriter(stuck.send, body_part, b"".join, max_backlog=1000, stall_s=60)
    writer.write(b"first")  # its send waits
    for _ in range(99):
        writer.write(b"x" * 10)  # 990 bytes wait behind it
    assert not writer.cut and not stuck.transport.aborted
    writer.write(b"x" * 11)
    assert writer.cut and stuck.transport.aborted
    writer.write(b"x" * 1_000_000)  # dropped: nothing more is held
    await asyncio.wait_for(writer.drained(), DEADLINE_S)


async def test_a_send_stalled_past_its_bound_cuts_the_connection() -> None:
    stuck = StuckSend()
    writer = SendWriter(stuck.send, body_part, b"".join, max_backlog=1 << 20, stall_s=0.2)
    writer.write(b"first")
    await asyncio.wait_for(writer.drained(), DEADLINE_S)
    assert writer.cut and stuck.transport.aborted


async def test_a_reader_that_keeps_reading_is_never_cut() -> None:
    sent: list[bytes] = []

    async def slow(message: MutableMapping[str, Any]) -> None:
        await asyncio.sleep(0.05)
        sent.append(message["body"])

    writer = SendWriter(slow, body_part, b"".join, max_backlog=1 << 20, stall_s=1)
    for i in range(50):
        writer.write(b"%d," % i)
        await asyncio.sleep(0.005)
    await asyncio.wait_for(writer.drained(), DEADLINE_S)
    assert not writer.cut
    assert b"".join(sent) == b"".join(b"%d," % i for i in range(50))


class CountingEngine(FakeEngine):
    """Counts the events its requests yield."""

    def __init__(self) -> None:
        super().__init__(max_model_len=200_000)
        self.events = 0

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        async for event in super().generate(request):
            self.events += 1
            yield event


def _waited(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {DEADLINE_S} s for {what}"
        time.sleep(0.02)


def test_an_sse_reader_that_stops_reading_is_cut_and_its_request_aborted() -> None:
    engine = CountingEngine()
    with served_as_switchboard(engine) as port:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little
        sock.connect(("127.0.0.1", port))
        body = json.dumps(
            {
                "model": "fake",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 150_000,
                "stream": True,
            }
        ).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # then it reads nothing more
        _waited(lambda: engine.events > 0, "the request to start")
        _waited(lambda: not engine.running, "the engine to hold no request")
        sock.close()
    # Cut long before the generation's end: the backlog's bound, not the answer, ended it
    # (each event is some 150 bytes of SSE).
    assert engine.events < 150_000
    assert engine.events * 150 < 8 * STREAM_BACKLOG_BYTES
