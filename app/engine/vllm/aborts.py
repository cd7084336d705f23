"""`Aborts`: this process's aborts of its own engine requests, sent together: every abort
asked for in one turn of the event loop goes to vLLM in one `AsyncLLM.abort` call (it
takes a list: one message to the engine core, read before its next step).

Why: the batch lane takes its requests past the busy width off the engine the moment an
interactive request is admitted (`app.batches.lane`: some 190 on an idle replica). Each
cancelled request asked for its own abort as its task unwound, one message each, spread
over the whole unwinding (60-110 ms of the event loop on the benchmark's 2 busy cores,
measured), and the engine core went on stepping the batch's 128 sequences, with the
interactive request waiting for a place, until enough of them had arrived. Cancelled
together, their tasks each reach their abort in the same turn (the first step of each
unwinding), so the engine core has them all in one message at its next step.

Invariant: `abort(internal_id)` returns once the call that carries it has returned, as
`AsyncLLM.abort` would have for that id alone (the request's state gone from the output
processor, its sink given its final "abort" delta, the message sent); the call's failure
is raised to each of its waiters. A waiter cancelled meanwhile does not stop the call.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine's own; its tests need no vLLM
    from vllm.v1.engine.async_llm import AsyncLLM


class Aborts:
    def __init__(self, llm: AsyncLLM) -> None:
        self._llm = llm
        self._ids: list[str] = []
        self._sending: asyncio.Future[None] | None = None

    async def abort(self, internal_id: str) -> None:
        """Abort the request vLLM knows as `internal_id`, with the others asked for in
        this turn of the event loop."""
        self._ids.append(internal_id)
        if self._sending is None:
            # Its first step runs in the loop's next turn, after every task this turn
            # has already scheduled (a lane's cancelled requests) has asked.
            self._sending = asyncio.ensure_future(self._send())
        await asyncio.shield(self._sending)

    async def _send(self) -> None:
        ids, self._ids, self._sending = self._ids, [], None
        await self._llm.abort(ids, internal=True)
