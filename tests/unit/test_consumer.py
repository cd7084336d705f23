"""The hand-over of the engine core's outputs by the consumer (app.engine.vllm.consumer),
without an engine: the sink's order, waking and errors, pulled or pushed; one event made
of the deltas that arrived together. The consumer itself runs on real vLLM in
tests/engine/test_vllm_engine.py and tests/engine/test_vllm_metrics.py."""

from __future__ import annotations

import asyncio
import warnings

import pytest

# The first import of vllm.v1.engine warns (torch.jit) in vLLM's own code, which the
# suite's filters would make an error here: nothing to do with these tests.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from app.engine.vllm.consumer import Delta, Sink, merge_deltas


def _delta(ids: list[int], text: str, finish: str | None = None, stop: str | None = None) -> Delta:
    return Delta(ids, text, finish, stop, 5)


def test_the_sink_hands_over_what_arrived_in_order_and_wakes_its_reader() -> None:
    async def scenario() -> list[list[Delta]]:
        sink = Sink()
        assert sink.take_nowait() == []
        reader = asyncio.ensure_future(sink.take())
        await asyncio.sleep(0)
        assert not reader.done()
        first = _delta([1], "a")
        sink.put(first)
        got = [await asyncio.wait_for(reader, 1)]
        second, third = _delta([2], "b"), _delta([3], "c", "length")
        sink.put(second)
        sink.put(third)
        got.append(await sink.take())
        assert sink.take_nowait() == []
        return got

    first, second = asyncio.run(scenario())
    assert first == [_delta([1], "a")]
    assert second == [_delta([2], "b"), _delta([3], "c", "length")]


def test_an_error_from_vllm_reaches_the_reader_waiting_or_not() -> None:
    """As AsyncLLM.generate raises them: vLLM's own errors as they are, a failure of its
    output handler as an EngineGenerateError (an engine error, not a bug of ours)."""
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    async def scenario() -> None:
        sink = Sink()
        reader = asyncio.ensure_future(sink.take())
        await asyncio.sleep(0)
        sink.put(RuntimeError("the output handler failed"))
        with pytest.raises(EngineGenerateError) as raised:
            await asyncio.wait_for(reader, 1)
        assert isinstance(raised.value.__cause__, RuntimeError)
        with pytest.raises(EngineGenerateError):
            sink.take_nowait()
        dead = Sink()
        dead.put(EngineDeadError())
        with pytest.raises(EngineDeadError):
            await dead.take()

    asyncio.run(scenario())


def test_a_pushed_sink_gives_each_delta_at_once_and_wakes_its_task_at_the_end() -> None:
    async def scenario() -> list[Delta]:
        sink = Sink()
        got: list[Delta] = []
        sink.put(_delta([1], "a"))  # before the receiver: given first
        sink.push(got.append)
        assert got == [_delta([1], "a")]
        waiting = asyncio.ensure_future(sink.wait_pushed(lambda: got[-1].finish_reason is not None))
        await asyncio.sleep(0)
        sink.put(_delta([2], "b"))
        assert got[-1] == _delta([2], "b")  # at once, in the putting code's turn
        await asyncio.sleep(0)
        assert not waiting.done()
        sink.put(_delta([3], "c", "length"))
        await asyncio.wait_for(waiting, 1)
        return got

    assert [d.token_ids for d in asyncio.run(scenario())] == [[1], [2], [3]]


def test_a_receiver_that_raises_ends_the_pushed_sink_with_its_own_exception() -> None:
    """A bug of ours in the receiver is raised to its task as it is (not as the engine's),
    and never reaches vLLM's loop that put the delta."""

    async def scenario() -> None:
        sink = Sink()

        def receive(delta: Delta) -> None:
            if delta.token_ids == [2]:
                raise KeyError("ours")

        sink.push(receive)
        waiting = asyncio.ensure_future(sink.wait_pushed(lambda: False))
        await asyncio.sleep(0)
        sink.put(_delta([1], "a"))
        sink.put(_delta([2], "b"))  # raises inside: the sink keeps it
        sink.put(_delta([3], "c"))
        with pytest.raises(KeyError):
            await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_deltas_that_arrived_together_make_one_event() -> None:
    event = merge_deltas([_delta([1, 2], "ab"), _delta([3], "c", "stop", "\n")], [7, 8])
    assert list(event.token_ids) == [1, 2, 3] and event.text == "abc"
    assert event.finish_reason == "stop" and event.stop_reason == "\n"
    assert event.prompt_token_ids == [7, 8] and event.num_cached_tokens == 5
    later = merge_deltas([_delta([4], "d")], None)
    assert later.finish_reason is None and later.num_cached_tokens == 0
    assert later.prompt_token_ids is None


@pytest.mark.parametrize(
    ("reason", "ours"),
    [("stop", "stop"), ("length", "length"), ("abort", "abort"), ("error", "abort")],
)
def test_vllm_finish_reasons_become_the_seams(reason: str, ours: str) -> None:
    assert merge_deltas([_delta([], "", reason)], None).finish_reason == ours
