"""Plain text streams taken from vLLM's output processor without `RequestOutput`s.

vLLM's output handler runs `OutputProcessor.process_outputs` once per engine step over
every running request: the iteration stats, the detokenizer and its stop strings,
finishing, aborting what a stop string ended, the LoRA and scheduler gauges the endpoint
picker reads. Its last step per request builds a `RequestOutput` around a
`CompletionOutput`, merges it into a collector guarded by an `asyncio.Event`, and
`AsyncLLM.generate` hands it to its caller, who turns it into a `TokenEvent`. For a
request that asks for no logprobs, prompt logprobs or images (most of them), that last
step is all that differs here: its state is a `DeltaState`, whose `make_request_output`
makes a `Delta` (the new token ids, the text's delta, the finish), put in the request's
`DeltaSink`, which its `VllmEngine.generate` reads. Everything before that last step is
vLLM's own code, unchanged, so the metrics, the gauges and the stop rules are exactly
vLLM's. Measured (bench/per_token.py --deltas-ab): about 2 us less per token than the
`RequestOutput` path, of the engine seam's ~44 at 64 streams (0.96x; a `RequestOutput`
and its conversion cost 3.7 us, a delta and its event 2.4).

Invariants:
- `add_delta_request` registers the request exactly as `AsyncLLM.add_request` does for a
  rendered prompt with `n` = 1 (vLLM's admission check, the output processor, then the
  engine core), and the state is a `DeltaState` before the engine core can step it.
- A `DeltaSink` holds what arrived since it was last read: deltas in order, or the error
  vLLM's output handler propagated, which the next read raises as `AsyncLLM.generate`
  would: vLLM's own errors as they are, anything else as an `EngineGenerateError`.
- The engine-level `stream_interval` must be 1 (the caller checks): a `DeltaState` sends
  every step's tokens as they come.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from vllm.exceptions import VLLMError
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.engine.output_processor import RequestState

from app.engine.base import TokenEvent
from app.engine.vllm.convert import finish_of


class Delta(NamedTuple):
    """One step's output of one request (never empty, so process_outputs hands it on)."""

    token_ids: list[int]
    text: str
    finish_reason: str | None  # vLLM's reason: "stop", "length", "abort", "error"...
    stop_reason: str | int | None
    num_cached_tokens: int


class DeltaSink:
    """Where vLLM's output handler puts one request's deltas, for its one reader."""

    __slots__ = ("_error", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Delta] = []
        self._error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Delta | Exception) -> None:
        """vLLM's side: a `Delta` from `DeltaState`, or an error for every request."""
        if isinstance(item, EngineDeadError | VLLMError):
            self._error = item
        elif isinstance(item, Exception):  # the output handler failed
            self._error = EngineGenerateError()
            self._error.__cause__ = item
        else:
            self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take_nowait(self) -> list[Delta]:
        """What arrived since the last read (maybe nothing); an error is raised."""
        if self._error is not None:
            raise self._error
        items = self._items
        if items:
            self._items = []
        return items

    async def take(self) -> list[Delta]:
        """What arrived since the last read, waiting for at least one delta."""
        while not self._items and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.take_nowait()


class DeltaState(RequestState):  # type: ignore[misc]  # vLLM is untyped to mypy here
    """vLLM's request state, whose output is a `Delta` rather than a `RequestOutput`."""

    def make_request_output(
        self,
        new_token_ids: list[int],
        pooling_output: Any,
        finish_reason: Any,
        stop_reason: str | int | None,
        kv_transfer_params: Any = None,
        ec_transfer_params: Any = None,
        error: Any = None,
    ) -> Delta:
        finished = finish_reason is not None
        # As RequestState._new_completion_output in DELTA mode: the text since the last
        # call (held back while it could still turn into a stop string).
        text = self.detokenizer.get_next_output_text(finished, True)
        return Delta(
            new_token_ids,
            text,
            str(finish_reason) if finished else None,
            stop_reason,
            self.num_cached_tokens,
        )


async def add_delta_request(
    llm: AsyncLLM,
    request_id: str,
    prompt: Any,
    params: SamplingParams,
    *,
    lora_request: LoRARequest | None,
    priority: int,
) -> tuple[str, DeltaSink]:
    """Submit a rendered prompt (`tokens_input`) whose outputs come as `Delta`s; return
    vLLM's internal request id (what `abort(..., internal=True)` takes) and the sink."""
    if llm.errored:
        raise EngineDeadError()
    request = llm.input_processor.process_inputs(
        request_id,
        prompt,
        params,
        supported_tasks=await llm.get_supported_tasks(),
        lora_request=lora_request,
        priority=priority,
    )
    llm.input_processor.assign_request_id(request)
    llm._run_output_handler()  # as add_request: started by the first request
    internal_id: str = request.request_id
    llm.check_admission(request_id=internal_id)
    sink = DeltaSink()
    processor = llm.output_processor
    processor.add_request(request, None, None, 0, sink)
    processor.request_states[internal_id].__class__ = DeltaState
    try:
        await llm.engine_core.add_request_async(request)
    except BaseException:
        await asyncio.shield(llm.abort(internal_id, internal=True))
        raise
    return internal_id, sink


def merge_deltas(deltas: list[Delta], prompt_ids: list[int] | None) -> TokenEvent:
    """One event of the deltas that arrived together (the reader fell behind by as many
    steps, as vLLM's collector merges them); `prompt_ids` on a request's first."""
    last = deltas[-1]
    if len(deltas) == 1:
        token_ids, text = last.token_ids, last.text
    else:
        token_ids = [token for delta in deltas for token in delta.token_ids]
        text = "".join(delta.text for delta in deltas)
    return TokenEvent(
        token_ids=token_ids,
        text=text,
        finish_reason=finish_of(last.finish_reason),
        stop_reason=last.stop_reason if last.finish_reason is not None else None,
        prompt_token_ids=prompt_ids,
        num_cached_tokens=deltas[0].num_cached_tokens if prompt_ids is not None else 0,
    )
