"""Cancelling a non-streamed call's work when its HTTP client goes away.

Streams are cancelled by their response machinery (sse-starlette); a plain request/response
handler is not, so it runs its work beside a watcher of the ASGI `http.disconnect`
message. Cancelling the work closes its engine iterators, which aborts the requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, logs do


class ClientGone(Exception):
    """The client disconnected before the work finished (control flow, never rendered)."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result (its exception propagates), or `ClientGone` once its client has
    disconnected and the work's cancellation has completed."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()
