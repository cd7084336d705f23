"""The frontend's side of readouts: when to fetch them, and fetching them in batches.

Readouts wait in the worker until taken with a `collective_rpc`, a round trip through the
engine core's loop. Two rules keep that cheap: a request takes only when the positions the
engine has fed since its last take intersect the ranges it asked for (`ReadoutTracker`),
and all requests due in the same engine step share one call (`ReadoutBatcher`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

TakeMany = Callable[[list[str]], Awaitable[dict[str, list[tuple[int, bytes]]]]]


class ReadoutTracker:
    """Which of a request's wanted positions the engine has fed in and not yet handed out.

    After an event that brings the request's output to n tokens, positions
    [0, prompt_len + n - 1) have been fed in: the prompt, and every sampled token but the
    newest, which only enters the model on the next step."""

    def __init__(self, ranges: Sequence[tuple[int, int]], prompt_len: int) -> None:
        self._ranges = list(ranges)
        self._prompt_len = prompt_len
        self._taken_until = 0

    def due(self, output_tokens: int) -> bool:
        fed_until = self._prompt_len + max(output_tokens - 1, 0)
        start, self._taken_until = self._taken_until, max(self._taken_until, fed_until)
        return any(lo < fed_until and hi > start for lo, hi in self._ranges)


class ReadoutBatcher:
    """Coalesces the takes of one engine step into one call of `take_many`."""

    def __init__(self, take_many: TakeMany) -> None:
        self._take_many = take_many
        self._pending: dict[str, asyncio.Future[dict[int, bytes]]] = {}
        self._flushing = False
        self._flush_task: asyncio.Task[None] | None = None

    async def take(self, request_id: str) -> dict[int, bytes]:
        future: asyncio.Future[dict[int, bytes]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if not self._flushing:
            self._flushing = True
            self._flush_task = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        # The engine's outputs for one step wake every request in the same loop turn: one
        # yield lets all of them register before the call goes out.
        await asyncio.sleep(0)
        batch, self._pending, self._flushing = self._pending, {}, False
        try:
            result = await self._take_many(list(batch))
        except Exception as exc:
            for future in batch.values():
                if not future.done():
                    future.set_exception(exc)
            return
        for request_id, future in batch.items():
            if not future.done():
                future.set_result({int(p): bytes(v) for p, v in result.get(request_id, [])})
