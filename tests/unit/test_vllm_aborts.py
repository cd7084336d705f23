"""`app.engine.vllm.aborts`: the aborts asked for in one turn of the event loop reach
vLLM in one call, as a lane's cancelled requests ask for theirs.

How these fail: one `AsyncLLM.abort` call per request (the engine core then hears of a
lane's requests one message at a time, while it steps them); a waiter that returns
before the call carrying its id has returned; a failed call that some waiter never sees;
a call's waiters all resumed in one turn of the event loop (what arrives meanwhile, the
interactive requests a take-off made room for, waits for every one to unwind).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

import pytest

from app.engine.vllm.aborts import RESUMED_PER_TURN, Aborts

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class StubLLM:
    """`AsyncLLM.abort` as far as `Aborts` calls it: each call's ids, and whether each
    call had returned."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.returned = 0
        self.fail = fail

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        assert internal  # ours are vLLM's internal ids
        self.calls.append([request_id] if isinstance(request_id, str) else list(request_id))
        await asyncio.sleep(0)  # the message's send
        if self.fail:
            raise RuntimeError("the engine core is gone")
        self.returned += 1


def _aborts(llm: StubLLM) -> Aborts:
    return Aborts(cast("AsyncLLM", llm))


async def _running(aborts: Aborts, llm: StubLLM, ids: list[str]) -> list[asyncio.Task[int]]:
    """A task per id, waiting as a request does for its events, that aborts its id once
    cancelled (as `VllmEngine.run` does); each returns how many calls had returned when
    its abort did."""

    async def request(internal_id: str) -> int:
        try:
            await asyncio.Event().wait()
        finally:
            await aborts.abort(internal_id)
        raise AssertionError("unreachable")

    async def held(internal_id: str) -> int:
        try:
            return await request(internal_id)
        except asyncio.CancelledError:
            return llm.returned

    tasks = [asyncio.create_task(held(i)) for i in ids]
    await asyncio.sleep(0)  # each waiting
    return tasks


def test_the_aborts_of_one_turn_go_to_vllm_in_one_call() -> None:
    async def main() -> None:
        llm = StubLLM()
        aborts = _aborts(llm)
        ids = [f"r{i}" for i in range(190)]
        tasks = await _running(aborts, llm, ids)
        for task in tasks:  # a lane taking its requests off the engine at once
            task.cancel()
        returned = await asyncio.gather(*tasks)
        assert llm.calls == [ids]
        assert returned == [1] * len(ids)  # each once the call had returned
        # A later turn's aborts: a call of their own.
        later = await _running(aborts, llm, ["s0", "s1"])
        for task in later:
            task.cancel()
        await asyncio.gather(*later)
        assert llm.calls == [ids, ["s0", "s1"]]

    asyncio.run(main())


def test_a_calls_waiters_resume_a_few_per_turn() -> None:
    """What becomes ready while a lane's cancelled requests unwind (a socket read: the
    interactive requests that came with the one that took them off) runs after a few of
    them, not after all 190."""

    async def main() -> None:
        llm = StubLLM()
        aborts = _aborts(llm)
        loop = asyncio.get_running_loop()
        order: list[str] = []

        async def request(internal_id: str) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                await aborts.abort(internal_id)
                if not order:  # the first to resume: a request arrives now
                    loop.call_soon(order.append, "arrived")
                order.append(internal_id)

        ids = [f"r{i}" for i in range(190)]
        tasks = [asyncio.create_task(request(i)) for i in ids]
        await asyncio.sleep(0)  # each waiting
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert llm.calls == [ids]  # still one call
        assert sorted(order) == sorted([*ids, "arrived"])
        assert order.index("arrived") <= 2 * RESUMED_PER_TURN, order.index("arrived")

    asyncio.run(main())


def test_a_failed_call_is_raised_to_each_of_its_waiters() -> None:
    async def main() -> None:
        llm = StubLLM(fail=True)
        aborts = _aborts(llm)
        results = await asyncio.gather(aborts.abort("a"), aborts.abort("b"), return_exceptions=True)
        assert llm.calls == [["a", "b"]]
        assert all(isinstance(r, RuntimeError) for r in results), results

    asyncio.run(main())


def test_a_waiter_cancelled_meanwhile_does_not_stop_the_call() -> None:
    async def main() -> None:
        llm = StubLLM()
        aborts = _aborts(llm)
        first = asyncio.create_task(aborts.abort("a"))
        second = asyncio.create_task(aborts.abort("b"))
        await asyncio.sleep(0)  # both asked; the call under way
        first.cancel()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert llm.calls == [["a", "b"]] and llm.returned == 1

    asyncio.run(main())
