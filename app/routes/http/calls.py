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
3. streamed: a 200 `text/event-stream` of the core's events (`opening`, one batch per
   engine event, `closing`, `[DONE]` where the API ends with it); an error after the
   first byte goes in the stream, in the API's shape (`Core.failure`); not streamed: the
   core's `result()` as JSON, or the error, raised for the route's renderer.

Whatever ends a call (the last event, an error, the client leaving), its engine requests
are closed, which aborts any still running, and its admission places are given back.
An exception inside a call becomes what the client is told through
`app.errors.client_error`, the one rule for every transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response

from app.admission import Admission, Tickets
from app.engine.base import Engine
from app.errors import client_error
from app.protocols.core import Core
from app.routes.http.disconnect import CLIENT_GONE, ClientGone, unless_disconnected
from app.routes.http.generations import merge_generations
from app.routes.http.json import OrjsonResponse
from app.routes.http.sse import DONE, EventStream, sse

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
        return EventStream(_stream(engine, core, tickets), tickets)
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
    async for index, event in merge_generations(engine, core.requests, tickets):
        core.feed(index, event)


async def _stream(engine: Engine, core: Core, tickets: Tickets) -> AsyncGenerator[bytes, None]:
    """The call as SSE: one generator, no nesting, since its loop runs once per token."""
    try:
        for name, body in core.opening():
            yield sse(body, name)
        async for index, token_event in merge_generations(engine, core.requests, tickets):
            for name, body in core.events(index, token_event):
                yield sse(body, name)
        for name, body in core.closing():
            yield sse(body, name)
    except Exception as exc:  # the stream has started: the error goes in it
        for name, body in core.failure(client_error(exc)):
            yield sse(body, name)
    if core.ends_with_done:
        yield DONE
