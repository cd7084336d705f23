"""The tasks a connection runs.

`TaskGroup` holds the calls (Salience Generates, Evergreen actions) one connection runs
concurrently. Closing it cancels every call and waits until each has finished (so their
engine requests are aborted and their sessions freed before the connection is gone),
even when the closer is itself cancelled (server shutdown). A closed group starts
nothing.

(What a failed call becomes for its client is `app.errors.client_error`'s.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class TaskGroup:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        coro: Coroutine[Any, Any, None],
        on_done: Callable[[], None] | None = None,
    ) -> asyncio.Task[None] | None:
        """Run `coro` as a task of the group (None, and `coro` closed, once the group is
        closed). `on_done` runs when the task is over and out of the group."""
        if self.closed:
            coro.close()
            return None
        task = asyncio.create_task(coro)
        self._tasks.add(task)

        def done(_: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            if on_done is not None:
                on_done()

        task.add_done_callback(done)
        return task

    async def aclose(self) -> None:
        """Cancel every task and wait for all of them; nothing starts afterwards.

        With no task left it returns without touching the event loop: a connection's
        coroutine that is closed rather than cancelled (the garbage collector closing one
        whose server has gone) runs this on its way out with no loop to run on."""
        self.closed = True
        tasks = list(self._tasks)
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
