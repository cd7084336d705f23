"""The hand-over of vLLM's outputs as deltas (app.engine.vllm.deltas), without an engine:
the sink's order, waking and errors, and one event made of the deltas that arrived
together. The path itself runs on real vLLM in tests/engine/test_vllm_engine.py."""

from __future__ import annotations

import asyncio

import pytest

# Imported as test_engine_errors imports vLLM: its first import of vllm.v1.engine warns
# (torch.jit) in vLLM's own code, nothing to do with these tests.
deltas = pytest.importorskip("app.engine.vllm.deltas")
Delta, DeltaSink, merge_deltas = deltas.Delta, deltas.DeltaSink, deltas.merge_deltas


def _delta(ids: list[int], text: str, finish: str | None = None, stop: str | None = None) -> Delta:
    return Delta(ids, text, finish, stop, 5)


def test_the_sink_hands_over_what_arrived_in_order_and_wakes_its_reader() -> None:
    async def scenario() -> list[list[Delta]]:
        sink = DeltaSink()
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
        sink = DeltaSink()
        reader = asyncio.ensure_future(sink.take())
        await asyncio.sleep(0)
        sink.put(RuntimeError("the output handler failed"))
        with pytest.raises(EngineGenerateError) as raised:
            await asyncio.wait_for(reader, 1)
        assert isinstance(raised.value.__cause__, RuntimeError)
        with pytest.raises(EngineGenerateError):
            sink.take_nowait()
        dead = DeltaSink()
        dead.put(EngineDeadError())
        with pytest.raises(EngineDeadError):
            await dead.take()

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
