"""One HTTP call on the engine, for every API whose body is a `Core`
(`app.protocols.core`): admit, build, run, answer.

`serve_call` is the whole of it, in this order:

1. admission (`app.admission`): one unit per engine request the call will make, each
   with a bound of its prompt tokens, before any prompt work; a refusal is the API's
   503 with Retry-After (the error is raised; the route's renderer answers it);
2. the core is built off the event loop, in the one render thread (`render`):
   templating, tokenizing, compiling a constraint's grammar and decoding images block,
   and a render thread of its own keeps them from stalling every stream. A build that
   fails gives its admission places back;
3. the engine requests run with their events pushed (`run_generations`: the engine hands
   each one on from its own loop, and the call's task waits once, for the end);
   streamed: a 200 `text/event-stream` of the core's events (`opening`, one write per
   engine event, `closing`, `[DONE]` where the API ends with it), written as they come;
   an error after the first byte goes in the stream, in the API's shape
   (`Core.failure`); not streamed: each event fed to the core, then its `result()` as
   JSON, or the error, raised for the route's renderer.

Whatever ends a call (the last event, an error, the client leaving), its engine requests
are closed, which aborts any still running, and its admission places are given back.
An exception inside a call becomes what the client is told through
`app.errors.client_error`, the one rule for every transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

from app.admission import Admission, Tickets
from app.engine.base import Engine, TokenEvent
from app.errors import client_error
from app.protocols.core import Core, Event
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.generations import run_generations
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import DONE, PushedStream, sse

T = TypeVar("T")

# One thread, so that prompts are rendered in arrival order and the tokenizer is never
# entered from two threads at once (HF's fast tokenizers are not reentrant).
_RENDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")


async def render(build: Callable[[], T]) -> T:
    """`build()` in the render thread."""
    return await asyncio.get_running_loop().run_in_executor(_RENDER, build)


async def serve_call(
    request: Request,
    engine: Engine,
    admission: Admission,
    *,
    protocol: str,
    units: Sequence[int],
    priority: int,
    stream: bool,
    build: Callable[[], Core],
) -> Response:
    """Admit a call of `len(units)` engine requests (`units[i]`: a bound of request i's
    prompt tokens), build its core off the loop and serve it."""
    tickets = admission.admit_all(protocol, list(units), priority=priority)
    try:
        core = await render(build)
    except BaseException:
        tickets.release()
        raise
    if stream:
        return PushedStream(lambda write: _stream(engine, core, tickets, write), tickets)
    try:
        with tickets:
            await unless_disconnected(request.receive, collect(engine, core, tickets))
            body = core.result()
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    except Exception as exc:
        raise client_error(exc) from exc
    return OrjsonResponse(body)


async def collect(engine: Engine, core: Core, tickets: Tickets) -> None:
    """Run `core`'s requests to their end, feeding it every event (not streamed)."""
    await run_generations(engine, core.requests, tickets, core.feed)


def _encoded(events: list[Event]) -> bytes:
    return b"".join(sse(body, name) for name, body in events)


async def _stream(
    engine: Engine, core: Core, tickets: Tickets, write: Callable[[bytes], None]
) -> None:
    """The call as SSE: each engine event's frames written in one go, as it comes."""

    def on_event(index: int, event: TokenEvent) -> None:
        events = core.events(index, event)
        if events:
            write(_encoded(events))

    try:
        write(_encoded(core.opening()))
        await run_generations(engine, core.requests, tickets, on_event)
        write(_encoded(core.closing()))
    except Exception as exc:  # the stream has started: the error goes in it
        write(_encoded(core.failure(client_error(exc))))
    if core.ends_with_done:
        write(DONE)
