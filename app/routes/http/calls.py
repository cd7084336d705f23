"""A call of an API whose body is an `Exchange` (`app.protocols.exchange`), answered over
HTTP: the shared road (`app.sessions.calls`) with its events as server-sent events, or
its body as JSON.

`serve_call` admits and builds a call and answers it; `answer_call` answers one already
started (the Responses API starts its own: it reads a stored conversation first), and
`collect_answer` gives its body to a route that makes its own answer of it (compaction).
Streamed: a 200 `text/event-stream` of the exchange's events, written as they come (each
engine event's in one write), then `data: [DONE]` where the API ends with it; an error
after the first byte is in the stream, in the API's shape. Not streamed: the body as
JSON, or the error raised for the route's responder. A client that disconnects cancels
the call (its engine requests are aborted); its admission places are given back however
the answer ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from app.admission import Admission, ProtocolName
from app.engine.base import Engine
from app.protocols.exchange import Event, Exchange
from app.routes.deps import principal_on
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import DONE, PushedStream, sse
from app.sessions.calls import Call, Hooks, collect_call, in_prompt_thread, start_call, stream_call
from app.telemetry.http import record_of


async def serve_call(
    request: Request,
    engine: Engine,
    admission: Admission,
    *,
    protocol: ProtocolName,
    units: Sequence[int],
    priority: int,
    stream: bool,
    build: Callable[[], Exchange],
) -> Response:
    """Admit a call of `len(units)` engine requests (`units[i]`: a bound of request i's
    prompt tokens) at `priority`, no more urgent than its caller's key allows, build its
    exchange in the prompt thread and answer it."""
    call = await start_call(
        admission,
        record_of(request),
        protocol=protocol,
        units=units,
        priority=priority,
        principal=principal_on(request),
        build=lambda: in_prompt_thread(build),
    )
    return await answer_call(request, engine, call, stream=stream)


async def answer_call(
    request: Request,
    engine: Engine,
    call: Call[Any],
    *,
    stream: bool,
    hooks: Hooks | None = None,
) -> Response:
    """`call` run and answered: streamed as SSE, or its body as JSON."""
    if stream:

        async def produce(write: Callable[[bytes], None]) -> None:
            await stream_call(engine, call, lambda events: write(_encoded(events)), hooks)

        return PushedStream(produce, call.tickets, DONE if call.exchange.ends_with_done else b"")
    try:
        body = await collect_answer(request, engine, call, hooks)
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    return OrjsonResponse(body)


async def collect_answer(
    request: Request, engine: Engine, call: Call[Any], hooks: Hooks | None = None
) -> Any:
    """`call` run to its end (not streamed): its body, or `ClientGone` once its client
    has disconnected (its engine requests aborted)."""
    try:
        return await unless_disconnected(request.receive, collect_call(engine, call, hooks))
    finally:
        call.tickets.release()


def _encoded(events: list[Event]) -> bytes:
    """Events as SSE, in one chunk."""
    return b"".join(sse(body, name) for name, body in events)
