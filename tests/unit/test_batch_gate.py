"""`BatchGate`: exclusive holders run alone, without starving, and a cancelled waiter or
holder never leaves the gate closed."""

from __future__ import annotations

import asyncio

from app.engine.batch_gate import BatchGate


async def _entered(task: asyncio.Task[object]) -> bool:
    await asyncio.sleep(0.01)
    return task.done()


async def test_exclusive_waits_for_shared_and_shared_queue_behind_it() -> None:
    gate = BatchGate()
    first = await gate.enter(exclusive=False)
    exclusive = asyncio.create_task(gate.enter(exclusive=True))
    assert not await _entered(exclusive)
    late = asyncio.create_task(gate.enter(exclusive=False))  # queued behind the exclusive
    assert not await _entered(late)
    first()
    assert await _entered(exclusive)
    assert not await _entered(late)  # nothing shares a step with the exclusive holder
    exclusive.result()()
    assert await _entered(late)
    late.result()()


async def test_exclusive_holders_take_turns() -> None:
    gate = BatchGate()
    one = await gate.enter(exclusive=True)
    two = asyncio.create_task(gate.enter(exclusive=True))
    assert not await _entered(two)
    one()
    one()  # a second release is a no-op, not a second opening
    assert await _entered(two)
    shared = asyncio.create_task(gate.enter(exclusive=False))
    assert not await _entered(shared)
    two.result()()
    assert await _entered(shared)


async def test_a_cancelled_exclusive_waiter_lets_shared_arrivals_in() -> None:
    gate = BatchGate()
    holder = await gate.enter(exclusive=False)
    exclusive = asyncio.create_task(gate.enter(exclusive=True))
    shared = asyncio.create_task(gate.enter(exclusive=False))
    assert not await _entered(shared)
    exclusive.cancel()
    assert await _entered(shared)
    holder()
    shared.result()()
    assert await _entered(asyncio.create_task(gate.enter(exclusive=True)))
