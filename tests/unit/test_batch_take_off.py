"""`app.batches.runner`'s take-off: the requests it takes off the engine when an interactive
request is admitted past the lane's busy width.

How these fail: the taken-off requests' aborts asked for only as their tasks unwind (a
turn later, after every one's first step), not in the take-off's own turn ahead of any
unwinding; their tasks all cancelled in one turn (all their first steps in the next);
a request taken off in the turn it started (its task cancelled before its first step,
so none of its code runs) left counted as running, never queued again, its batch never
ending; a wave's places filled all in one turn.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

from app.admission import Admission, ProtocolName
from app.batches.files import Files
from app.batches.lane import Lane
from app.batches.requests import Answer, Endpoints
from app.batches.runner import STARTED_PER_TURN, BatchRunner, _Held, _Item
from app.engine.base import OPEN_REQUESTS
from app.protocols.batches import BatchRecord
from app.store.batches import BatchStore

BATCH = BatchRecord(
    id="batch_t",
    api="openai",
    tenant="t",
    endpoint="/v1/chat/completions",
    created_at=0.0,
    expires_at=1e12,
    window="24h",
    status="in_progress",
    total=24,
    chunk_size=24,
    chunks=1,
)
LINE = b'{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {}}'


class Engine:
    """`Endpoints.answer` as far as the runner sees it: each request opens one engine
    request, registered with its task's `OpenRequests` as the engine does, and runs until
    cancelled; what happened, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def answer(self, endpoint: str, body: Any, *, request_id: str, tenant: str) -> Answer:
        held = OPEN_REQUESTS.get()  # the runner's task sets it
        if held is not None:
            held.opened(request_id, lambda: self.events.append(f"abort {request_id}"))
        try:
            await asyncio.Event().wait()
        finally:
            if held is not None:
                held.closed(request_id)
            self.events.append(f"unwound {request_id}")
        raise AssertionError("unreachable")


def _runner(engine: Engine, width: int = 8) -> tuple[BatchRunner, Admission]:
    admission = Admission(max_requests=None, max_tokens=None)
    lane = Lane(admission, max_running=width, busy_running=1)
    runner = BatchRunner(
        cast("BatchStore", None),  # not reached: no scan runs
        cast("Files", None),
        cast("Endpoints", engine),
        lane,
        None,
        lease_s=60.0,
        max_requests=100,
    )
    runner._held[(BATCH.id, 0)] = _Held(set(range(BATCH.total)))
    return runner, admission


def _items(count: int) -> list[_Item]:
    return [_Item(BATCH, 0, i, LINE) for i in range(count)]


def test_the_take_offs_aborts_leave_before_any_request_unwinds() -> None:
    async def main() -> None:
        engine = Engine()
        runner, admission = _runner(engine)
        for item in _items(4):
            runner._start(item)
        await asyncio.sleep(0)  # each in the engine
        admission.admit(ProtocolName.OPENAI)  # interactive: the lane narrows to 1
        # The three newest taken off: their aborts asked for at once, in the admission's
        # own turn, before any task has unwound.
        assert engine.events == [f"abort {BATCH.id}-{i}" for i in (1, 2, 3)], engine.events
        for _ in range(3):
            await asyncio.sleep(0)
        assert sorted(engine.events[3:]) == [f"unwound {BATCH.id}-{i}" for i in (1, 2, 3)]
        assert runner.running == 1 and runner.lane.running == 1
        assert sorted(i.index for i in runner._queue) == [1, 2, 3]  # to run again

    asyncio.run(main())


def test_a_request_taken_off_in_the_turn_it_started_runs_again() -> None:
    async def main() -> None:
        engine = Engine()
        runner, admission = _runner(engine)
        first, second = _items(2)
        runner._start(first)
        await asyncio.sleep(0)
        runner._start(second)
        # In the same turn, before its task's first step: taken off.
        admission.admit(ProtocolName.OPENAI)
        for _ in range(3):
            await asyncio.sleep(0)
        assert runner.running == 1 and runner.lane.running == 1
        assert [i.index for i in runner._queue] == [1]

    asyncio.run(main())


def test_a_wide_lane_fills_a_few_requests_a_turn() -> None:
    """A wave's places are filled `STARTED_PER_TURN` a turn: what else is ready (a socket
    read, an interactive request) runs between the slices, not after every start."""

    async def main() -> None:
        engine = Engine()
        runner, _ = _runner(engine, width=24)
        runner._held[(BATCH.id, 0)] = _Held(set(range(24)))
        runner._queue.extend(_items(24))
        turns: list[int] = [0]  # requests started by each turn's end

        async def turn_counter() -> None:
            while len(turns) < 10:
                turns.append(runner.running)
                await asyncio.sleep(0)

        counter = asyncio.create_task(turn_counter())
        await runner._fill()
        await counter
        assert runner.running == 24
        steps = [b - a for a, b in itertools.pairwise(turns)]
        assert max(steps) <= STARTED_PER_TURN, turns

    asyncio.run(main())


def test_a_take_offs_requests_unwind_a_few_a_turn() -> None:
    async def main() -> None:
        engine = Engine()
        runner, admission = _runner(engine, width=24)
        runner._held[(BATCH.id, 0)] = _Held(set(range(24)))
        for item in _items(24):
            runner._start(item)
        await asyncio.sleep(0)  # each in the engine
        admission.admit(ProtocolName.OPENAI)  # 23 taken off
        assert len(engine.events) == 23  # every abort at once
        unwound: list[int] = []  # by each turn's end
        while len(unwound) < 12:
            unwound.append(sum(e.startswith("unwound") for e in engine.events))
            await asyncio.sleep(0)
        assert unwound[-1] == 23
        steps = [b - a for a, b in itertools.pairwise(unwound)]
        assert max(steps) <= STARTED_PER_TURN, unwound
        assert runner.running == 1 and len(runner._queue) == 23

    asyncio.run(main())


def test_the_lane_stays_narrow_for_a_while_after_interactive_traffic() -> None:
    """Busy width while an interactive request is in flight and for the hold after it;
    the recent width for `recent_s` after that (the first requests of traffic that comes
    back wait for one engine step at that width, not at the idle one); the idle width
    after. Before any interactive request, the idle width."""
    now = [100.0]
    admission = Admission(max_requests=None, max_tokens=None)
    lane = Lane(
        admission,
        max_running=192,
        busy_running=2,
        hold_s=0.5,
        recent_running=32,
        recent_s=10.0,
        clock=lambda: now[0],
    )
    assert lane.width() == 192
    ticket = admission.admit(ProtocolName.OPENAI)
    assert lane.width() == 2
    now[0] += 60.0  # a long request: busy all along
    assert lane.width() == 2
    ticket.release()
    now[0] += 0.4
    assert lane.width() == 2  # the hold
    now[0] += 0.2
    assert lane.width() == 32
    now[0] += 9.7  # 10.3 s after the last one ended
    assert lane.width() == 32
    now[0] += 0.5
    assert lane.width() == 192
    # The recent width never above the idle one, nor below the busy one.
    for recent, idle, busy, expected in ((32, 16, 2, 16), (1, 192, 2, 2)):
        narrow = Lane(
            admission,
            max_running=idle,
            busy_running=busy,
            recent_running=recent,
            recent_s=10.0,
            clock=lambda: now[0],
        )
        with admission.admit(ProtocolName.OPENAI):
            assert narrow.width() == busy
        now[0] += 1.0
        assert narrow.width() == expected
