"""Cancelling an HTTP call's work when its client goes away.

The work (a non-streamed call's collection, or a stream's pump) runs beside a watcher of
the ASGI `http.disconnect` message; once the client is gone the work is cancelled, which
closes its engine iterators and so aborts its requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": nobody reads it, logs do


class ClientGone(Exception):
    """The client disconnected before the work finished (control flow, never rendered)."""


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """`work`'s result (its exception propagates), or `ClientGone` once its client has
    disconnected and the work's cancellation has completed."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
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
