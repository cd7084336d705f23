"""Running a call's engine requests (one, or many for OpenAI `n` and prompt batches), each
on its admission ticket, their events pushed to one receiver (`run_generations`, the
engine's `run`: no task wakes per event).

Invariant: however the call ends (every request finished, cancelled, or failed in one
branch), every branch is closed, which aborts any engine request still running and
releases its ticket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from functools import partial

from app.admission import Tickets, run
from app.engine.base import Engine, GenerationRequest, TokenEvent


async def run_generations(
    engine: Engine,
    requests: Sequence[GenerationRequest],
    tickets: Tickets,
    receive: Callable[[int, TokenEvent], None],
) -> None:
    """Run every request (`tickets[i]` is `requests[i]`'s), each event pushed to
    `receive(i, event)`; the first failure cancels the others and is raised."""
    if len(requests) == 1:
        await run(engine, requests[0], tickets[0], partial(receive, 0))
        return
    tasks = [
        asyncio.ensure_future(run(engine, request, tickets[i], partial(receive, i)))
        for i, request in enumerate(requests)
    ]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished
    finally:
        await _cancel_all(tasks)


async def _cancel_all(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Cancel every branch and wait for each to end (which aborts its engine request)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
