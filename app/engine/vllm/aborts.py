"""`Aborts`: this process's aborts of its own engine requests, sent together: every abort
asked for in one turn of the event loop goes to vLLM in one `AsyncLLM.abort` call (it
takes a list: one message to the engine core, read before its next step); once it has
returned, its waiters resume a few at a time (`RESUMED_PER_TURN`), `RESUME_PAUSE_S` apart.

Why: the batch lane takes its requests past the busy width off the engine the moment an
interactive request is admitted (`app.batches.lane`: some 190 on an idle replica). Each
cancelled request asked for its own abort as its task unwound, one message each, spread
over the whole unwinding (60-110 ms of the event loop on the benchmark's 2 busy cores,
measured), and the engine core went on stepping the batch's 128 sequences, with the
interactive request waiting for a place, until enough of them had arrived. Cancelled
together, their tasks each reach their abort in the same turn (the first step of each
unwinding), so the engine core has them all in one message at its next step.

What is left of each unwinding once its abort has been sent (its call's end, its
admission places, its access-log line, its batch's bookkeeping) is no longer the
engine's business, but some 190 of them resumed in one turn held the loop for 35-90 ms
(measured on the benchmark's machine): the interactive requests that came with the one
that set the take-off off were read, built and sent to the engine only after it, a step
or more behind the first, and their first tokens waited for it too. A few per turn, the
loop polls its sockets between them: those requests reach the engine while the rest
unwind. And a short pause between slices rather than a bare turn: the engine's processes
run niced (10 by default), so while the frontend unwinds at a full core they lose
theirs, and the step in flight, which the aborts and the interactive requests wait for,
stretches (steps of 128 sequences around a take-off ran 95-146 ms, 20-30 otherwise,
measured on the benchmark's machine while it was shared).

A take-off asks for its aborts `soon`, before it cancels the requests' tasks (the
unwinding then awaits that call instead of asking again): the send's task runs first in
the next turn, ahead of the tasks' first steps.

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

# Waiters resumed in one turn of the event loop once their call has returned: each
# unwinds a request's call (0.2-0.5 ms on a busy machine), so a turn stays a few ms.
RESUMED_PER_TURN = 8
# The pause between two slices of a call's waiters (see the module's docstring).
RESUME_PAUSE_S = 0.002


class Aborts:
    def __init__(self, llm: AsyncLLM) -> None:
        self._llm = llm
        self._waiting: list[tuple[str, asyncio.Future[None]]] = []
        self._sending: asyncio.Future[None] | None = None
        # Each send's task until it ends: once it has taken its waiters, nothing else
        # holds it (the loop keeps only weak references to tasks).
        self._sends: set[asyncio.Future[None]] = set()

    async def abort(self, internal_id: str) -> None:
        """Abort the request vLLM knows as `internal_id`, with the others asked for in
        this turn of the event loop."""
        # Not shielded: a waiter cancelled meanwhile cancels only its own future; the
        # call, the send's own task, goes on.
        await self.soon(internal_id)

    def soon(self, internal_id: str) -> asyncio.Future[None]:
        """Ask for `internal_id`'s abort, with the others asked for in this turn, without
        waiting: the future of its call (resolved, as `abort` returns, in its slice of
        the call's waiters). A take-off asks before it cancels its requests' tasks
        (`app.engine.base.OpenRequests`); each task's unwinding then awaits this future
        in place of an abort of its own."""
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieved)
        self._waiting.append((internal_id, done))
        if self._sending is None:
            # Its first step runs in the loop's next turn, after every task this turn
            # has already scheduled (a lane's cancelled requests) has asked.
            self._sending = sending = asyncio.ensure_future(self._send())
            self._sends.add(sending)
            sending.add_done_callback(self._sends.discard)
        return done

    async def _send(self) -> None:
        waiting, self._waiting, self._sending = self._waiting, [], None
        failure: BaseException | None = None
        resumed = 0
        try:
            try:
                await self._llm.abort([i for i, _ in waiting], internal=True)
            except Exception as exc:
                failure = exc
            while resumed < len(waiting):
                if resumed:
                    await asyncio.sleep(RESUME_PAUSE_S)
                for _, done in waiting[resumed : resumed + RESUMED_PER_TURN]:
                    _settle(done, failure)
                resumed += RESUMED_PER_TURN
        finally:  # the send cancelled (the loop closing): none left waiting
            for _, done in waiting[resumed:]:
                if not done.done():
                    done.cancel()


def _retrieved(done: asyncio.Future[None]) -> None:
    """A call's failure counts as seen: a request asked `soon` that finished meanwhile
    has no unwinding left to await it."""
    if not done.cancelled():
        done.exception()


def _settle(done: asyncio.Future[None], failure: BaseException | None) -> None:
    if done.done():  # its waiter was cancelled
        return
    if failure is None:
        done.set_result(None)
    else:
        done.set_exception(failure)
