"""When the frontend fetches readouts, and how takes of one step are batched."""

from __future__ import annotations

import asyncio

from app.engine.readout_client import ReadoutBatcher, ReadoutTracker


def test_tracker_takes_only_when_fed_positions_meet_the_ranges() -> None:
    tracker = ReadoutTracker([(12, 13)], prompt_len=10)
    # After n output tokens, positions [0, 10 + n - 1) have been fed in.
    assert [tracker.due(n) for n in range(1, 6)] == [False, False, False, True, False]


def test_tracker_prompt_ranges_are_due_with_the_first_event() -> None:
    tracker = ReadoutTracker([(0, 3)], prompt_len=10)
    assert tracker.due(1) is True
    assert tracker.due(2) is False


def test_tracker_open_range_is_due_every_event() -> None:
    tracker = ReadoutTracker([(0, 10_000)], prompt_len=4)
    assert [tracker.due(n) for n in (1, 2, 3)] == [True, True, True]


async def test_batcher_coalesces_one_step_into_one_call() -> None:
    calls: list[list[str]] = []

    async def take_many(ids: list[str]) -> dict[str, list[tuple[int, bytes]]]:
        calls.append(ids)
        return {i: [(int(i[1:]), b"x")] for i in ids}

    batcher = ReadoutBatcher(take_many)
    results = await asyncio.gather(*[batcher.take(f"r{i}") for i in range(5)])
    assert calls == [[f"r{i}" for i in range(5)]]
    assert results == [{i: b"x"} for i in range(5)]
    assert await batcher.take("r7") == {7: b"x"}
    assert len(calls) == 2
