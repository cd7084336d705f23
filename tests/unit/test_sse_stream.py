"""The SSE responses: `EventStream`'s body goes to the server's own `send` when
`bodies_past_middleware` put it in the scope (as `create_app`'s app does), and through
the middleware otherwise; the start always passes the middleware, which is all any of
ours reads. `PushedStream`'s body is written from synchronous code by a `SendWriter`, in
order even when the connection makes a send wait; under uvicorn's httptools protocol (as
served) as chunks straight onto the connection, uvicorn's `send` taking over while the
client is slow."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncGenerator, Callable

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.admission import Tickets
from app.config import Settings
from app.main import create_app
from app.routes.http.sse import ChunkWriter, EventStream, PushedStream, body_writer
from app.routes.raw_send import bodies_past_middleware
from app.routes.send_writer import SendWriter
from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import uvicorn_in_thread

EVENTS = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]


class Watch:
    """A middleware recording the type of every message sent through it."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watched(message: Message) -> None:
            self.seen.append(message["type"])
            await send(message)

        await self.app(scope, receive, watched)


async def _events() -> AsyncGenerator[bytes, None]:
    for event in EVENTS:
        yield event


async def _stream(request: Request) -> EventStream:
    return EventStream(_events(), Tickets([]))


async def _call(app: ASGIApp) -> list[Message]:
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/s",
        "headers": [],
        "query_string": b"",
    }
    received = False

    async def receive() -> Message:
        nonlocal received
        if received:
            await asyncio.Event().wait()  # the client stays
        received = True
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("past", [True, False], ids=["served", "asgi-client"])
def test_the_body_skips_the_middleware_only_when_served(past: bool) -> None:
    seen: list[str] = []
    app = Starlette(routes=[Route("/s", _stream)])
    app.add_middleware(Watch, seen=seen)
    sent = asyncio.run(_call(bodies_past_middleware(app) if past else app))

    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 4
    assert [m["body"] for m in sent[1:]] == [*EVENTS, b""]
    bodies_seen = seen.count("http.response.body")
    assert seen[0] == "http.response.start"
    assert bodies_seen == (0 if past else 4)


def test_the_app_of_create_app_streams_past_its_middleware_by_itself() -> None:
    """`create_app` wires the bypass (no server needs to): a streamed chat's start passes
    the middleware, its events do not."""
    seen: list[str] = []
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    app.add_middleware(Watch, seen=seen)

    async def chat() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            return await client.post("/v1/chat/completions", json={**body, "stream": True})

    answer = asyncio.run(chat())
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    assert seen.count("http.response.start") == 1
    assert "http.response.body" not in seen


def test_a_pushed_body_is_written_in_order_when_the_connection_makes_a_send_wait() -> None:
    """`SendWriter` runs each send at once from synchronous code; a send that must wait
    (uvicorn waits for a full buffer to drain) is finished by a task, and what is written
    meanwhile follows it, in order, joined; `drained` waits for all of it."""

    async def scenario() -> list[bytes]:
        sent: list[bytes] = []
        paused: asyncio.Future[None] | None = None

        async def send(message: Message) -> None:
            if paused is not None and not paused.done():
                await paused  # the buffer is full: wait for it to drain
            sent.append(message["body"])

        writer = body_writer(send)
        writer.write(b"1")
        assert sent == [b"1"]  # at once, no task
        paused = asyncio.get_running_loop().create_future()
        writer.write(b"2")
        writer.write(b"3")
        writer.write(b"4")
        assert sent == [b"1"]
        await asyncio.sleep(0)
        assert sent == [b"1"]
        paused.set_result(None)
        await writer.drained()
        writer.write(b"5")
        return sent

    assert asyncio.run(scenario()) == [b"1", b"2", b"34", b"5"]


def test_a_pushed_stream_writes_what_its_producer_writes_then_ends() -> None:
    async def produce(write: Callable[[bytes], None]) -> None:
        for event in EVENTS:
            write(event)
            await asyncio.sleep(0)

    async def endpoint(request: Request) -> PushedStream:
        return PushedStream(produce, Tickets([]))

    app = Starlette(routes=[Route("/s", endpoint)])
    sent = asyncio.run(_call(bodies_past_middleware(app)))
    assert [m["body"] for m in sent[1:]] == [*EVENTS, b""]
    assert sent[-1]["more_body"] is False


def test_a_pushed_streams_tail_goes_in_the_write_that_ends_the_body() -> None:
    async def produce(write: Callable[[bytes], None]) -> None:
        write(EVENTS[0])

    async def endpoint(request: Request) -> PushedStream:
        return PushedStream(produce, Tickets([]), tail=b"data: [DONE]\n\n")

    app = Starlette(routes=[Route("/s", endpoint)])
    sent = asyncio.run(_call(bodies_past_middleware(app)))
    assert [(m["body"], m["more_body"]) for m in sent[1:]] == [
        (EVENTS[0], True),
        (b"data: [DONE]\n\n", False),
    ]


def _unchunked(body: bytes) -> bytes:
    out = b""
    while True:
        size, _, body = body.partition(b"\r\n")
        if int(size, 16) == 0:
            return out
        out, body = out + body[: int(size, 16)], body[int(size, 16) + 2 :]


def test_a_served_body_goes_onto_the_connection_and_through_send_while_the_client_lags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 768 KiB written while the client does not read: the transport's buffer fills,
    # uvicorn's flow control holds the connection and the pieces meanwhile take uvicorn's
    # `send` until it has caught up; then the connection again. Every byte arrives, in
    # order, in one well-formed chunked body.
    pieces = [bytes([65 + i % 26]) * 16384 for i in range(48)]
    writers: list[object] = []
    through_send: list[int] = []
    writes = SendWriter.write

    def counted(self: SendWriter[bytes], piece: bytes) -> None:
        through_send.append(len(piece))
        writes(self, piece)

    monkeypatch.setattr(SendWriter, "write", counted)

    async def produce(write: Callable[[bytes], None]) -> None:
        writer = getattr(write, "__self__", None)
        writers.append(writer)
        # The server's send buffer fixed small: left to grow (tcp_wmem, up to 4 MiB) the
        # kernel took the whole body in some runs, and nothing backed up; more body
        # than the writer lets wait for a reader (1 MiB) is cut.
        if isinstance(writer, ChunkWriter):
            connection = writer._cycle.transport.get_extra_info("socket")
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        for piece in pieces:
            write(piece)
            await asyncio.sleep(0)  # the client's reads come in between

    async def endpoint(request: Request) -> PushedStream:
        return PushedStream(produce, Tickets([]), tail=b"end")

    app = bodies_past_middleware(Starlette(routes=[Route("/s", endpoint)]))
    with uvicorn_in_thread(app, http="httptools") as port, socket.socket() as sock:
        sock.settimeout(30)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # before the window
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.5)  # not reading: the server's writes back up
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(1 << 16)
            time.sleep(0.001)
            assert chunk, "connection closed before the body's end"
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert _unchunked(body) == b"".join(pieces) + b"end"
    assert isinstance(writers[0], ChunkWriter)
    assert 0 < len(through_send) < len(pieces)  # some took the connection, some `send`


class _Transport(asyncio.Transport):
    """What a connection was sent, as it was written."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_a_chunk_written_as_the_client_catches_up_waits_behind_those_held_before_it() -> None:
    # The flow resumes before uvicorn's `send` has written what waited: a piece written in
    # between must follow those pieces, not pass them on the connection.
    import logging

    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    async def scenario() -> bytes:
        transport = _Transport()
        flow = FlowControl(transport)
        scope: Scope = {"type": "http", "method": "GET", "path": "/s", "headers": []}
        log = logging.getLogger("test")
        # uvicorn types ASGI scopes and events as TypedDicts, starlette (and our Send) as
        # mappings: the same objects, typed twice by two libraries that disagree.
        cycle = RequestResponseCycle(
            scope,  # type: ignore[arg-type]  # uvicorn's TypedDict scope, starlette's mapping
            transport, flow, log, log, False, [], asyncio.Event(), False, True, print,
        )  # fmt: skip
        await cycle.send({"type": "http.response.start", "status": 200, "headers": []})
        writer = body_writer(cycle.send)  # type: ignore[arg-type]  # uvicorn's typed events
        assert isinstance(writer, ChunkWriter)
        writer.write(b"1")
        flow.pause_writing()
        writer.write(b"2")
        writer.write(b"3")
        flow.resume_writing()
        writer.write(b"4")  # before the waiting send has run
        await writer.drained()
        writer.write(b"5")
        await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
        return b"".join(transport.written).partition(b"\r\n\r\n")[2]

    assert _unchunked(asyncio.run(scenario())) == b"12345"
