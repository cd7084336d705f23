"""Running several engine requests as one stream of `(index, TokenEvent)`.

Used when one client call needs many generations (OpenAI `n` or prompt batches). Each
request runs on its admission ticket (`app.admission.generate`). Invariant: however the
merged iterator ends (exhausted, closed early by its consumer, cancelled, or failed in
one branch), every branch's engine iterator is closed, which aborts any engine request
still running and releases its ticket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from app.admission import Tickets, generate
from app.engine.base import Engine, GenerationRequest, TokenEvent

_DONE = object()


async def merge_generations(
    engine: Engine, requests: Sequence[GenerationRequest], tickets: Tickets
) -> AsyncIterator[tuple[int, TokenEvent]]:
    """`tickets[i]` is `requests[i]`'s."""
    if len(requests) == 1:
        # The common case: no tasks, no queue, one engine iterator.
        stream = generate(engine, requests[0], tickets[0])
        try:
            async for event in stream:
                yield 0, event
        finally:
            await stream.aclose()
        return

    queue: asyncio.Queue[tuple[int, TokenEvent] | BaseException | object] = asyncio.Queue()

    async def pump(index: int, request: GenerationRequest) -> None:
        stream = generate(engine, request, tickets[index])
        try:
            async for event in stream:
                queue.put_nowait((index, event))
            queue.put_nowait(_DONE)
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
