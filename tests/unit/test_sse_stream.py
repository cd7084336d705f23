"""The SSE responses: `EventStream`'s body goes to the server's own `send` when
`bodies_past_middleware` put it in the scope (as `switchboard serve` does), and through
the middleware otherwise; the start always passes the middleware, which is all any of
ours reads. `PushedStream`'s body is written from synchronous code by a `BodyWriter`, in
order even when the connection makes a send wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.admission import Tickets
from app.routes.http.sse import EventStream, PushedStream, bodies_past_middleware, body_writer

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


def test_a_pushed_body_is_written_in_order_when_the_connection_makes_a_send_wait() -> None:
    """`BodyWriter` runs each send at once from synchronous code; a send that must wait
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
