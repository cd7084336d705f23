"""The one consumer of the engine core's outputs: one loop per engine step, in place of
AsyncLLM's output handler.

vLLM's own handler runs `OutputProcessor.process_outputs` over each step's outputs and,
per request, builds a `RequestOutput` around a `CompletionOutput`, merges it into a
collector behind an `asyncio.Event` and wakes the request's `AsyncLLM.generate` task,
whose caller converts it. This loop (`StepConsumer`) walks the same request states with
vLLM's own pieces, in vLLM's order: `IterationStats.update_from_output` (every
counter, histogram and LoRA gauge the endpoint picker and the routers read), the
prefill's cached-token count, the incremental detokenizer and its stop strings (the
surplus tokens past a stop string trimmed, the engine core told to stop the request),
the logprobs processor, the request's finish (`_finish_request`,
`update_from_finished_request`), then the scheduler stats and the stat loggers once per
step. For a request of ours (a `StepState`) it makes one small `Delta` (the new token
ids, the text's delta, the finish; logprobs and prompt logprobs when asked, already in
the seam's shape) and hands it to the request's `Sink`: either put aside for its reader
task (`take`), or given at once to a receiver called from this loop (`Sink.push`), so
that a stream's frame is written without its task waking at all.

Which requests take which path is chosen in one place, `VllmEngine._consumed`; what this
loop cannot serve keeps AsyncLLM's path, and its outputs go through vLLM's own
`process_outputs` from this same loop (so every request, either way, is counted once by
the same stats): an engine-level `--stream-interval` above 1 (a `StepState` hands on
every step's tokens).

Measured: the walk itself costs 5.5 us a token against 6.5 for `process_outputs` with
vLLM's request state (64 requests x 64 tokens, one process, the minimum of 9); what it
saves beside that is the per-request wake-up and the generator layers of a pulled stream
(see bench/results/README.md, "Without an engine" and after).

Invariants:
- `StepConsumer.add` registers a request exactly as `AsyncLLM.add_request` does for a
  rendered prompt with `n` = 1 (vLLM's admission check, the output processor, then the
  engine core, and vLLM's "Added request" line with --enable-log-requests); the request's
  state is a `StepState` before the engine core can step it.
- A `Sink` gets its request's deltas in order, then exactly one with a finish, or an
  error (vLLM's own as it is, anything else as an `EngineGenerateError`, as
  `AsyncLLM.generate` raises them).
- An abort (ours, or a stop string's) ends the request's state in vLLM's way
  (`OutputProcessor.abort_requests`), which hands its sink a final "abort" delta.
- A receiver that raises is a bug of ours: the request is aborted in the engine and its
  reader sees the exception itself, never as the engine's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from vllm.exceptions import VLLMError
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import FinishReason as VllmFinish
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.async_llm import logger as vllm_logger
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.engine.output_processor import RequestState
from vllm.v1.metrics.stats import IterationStats

from app.engine.base import EngineTrace, TokenEvent, TokenLogprob
from app.engine.vllm.convert import check_expansion, finish_of, token_logprob

logger = logging.getLogger(__name__)


class Delta(NamedTuple):
    """One step's output of one request."""

    token_ids: list[int]
    text: str
    finish_reason: str | None  # vLLM's reason: "stop", "length", "abort", "error"...
    stop_reason: str | int | None
    num_cached_tokens: int
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None


Receiver = Callable[[Delta], None]


class Sink:
    """Where the consumer puts one request's deltas, for its one reader: a task that
    takes them (`take`), or a receiver called at once from the consumer's loop (`push`)."""

    __slots__ = ("_error", "_items", "_receiver", "_waiter")

    def __init__(self) -> None:
        self._items: list[Delta] = []
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._receiver: Receiver | None = None

    def push(self, receiver: Receiver) -> None:
        """From now on, give every delta to `receiver` at once (in the consumer's loop;
        what arrived before is given first). A receiver that raises ends the sink with
        its exception (a bug of ours: the caller aborts the request)."""
        self._receiver = receiver
        items, self._items = self._items, []
        for item in items:
            self._give(item)

    def put(self, item: Delta | Exception) -> None:
        """vLLM's side: a `Delta`, or an error for every request."""
        if isinstance(item, Exception):
            error = item
            if not isinstance(item, EngineDeadError | VLLMError):  # the output handler failed
                error = EngineGenerateError()
                error.__cause__ = item
            self._fail(error)
        elif self._receiver is not None and self._error is None:
            self._give(item)
        else:
            self._items.append(item)
            self._wake()

    def _give(self, delta: Delta) -> None:
        assert self._receiver is not None
        try:
            self._receiver(delta)
        except Exception as exc:  # ours: the reader raises it as it is
            self._fail(exc)
            return
        if delta.finish_reason is not None:
            self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
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
            await self._wait()
        return self.take_nowait()

    async def wait_pushed(self, finished: Callable[[], bool]) -> None:
        """Wait, with a receiver pushed, until `finished()` or an error (raised)."""
        while not finished() and self._error is None:
            await self._wait()
        if self._error is not None:
            raise self._error

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class StepState(RequestState):  # type: ignore[misc]  # vLLM is untyped to mypy here
    """vLLM's request state for a request the consumer serves: its outputs are `Delta`s
    for its `Sink` (`queue`), its logprobs already `TokenLogprob`s."""

    prompt_ids: Sequence[int] = ()
    logprobs_k: int | None = None
    prompt_logprobs_k: int | None = None
    trace: EngineTrace | None = None  # a traced request's: told its stage times at its end
    _held: list[TokenLogprob | None] | None = None  # prompt logprobs not yet handed on

    def delta(
        self, new_token_ids: list[int], finish_reason: Any, stop_reason: str | int | None
    ) -> Delta | None:
        """The delta of this step (the text since the last: held back while it could
        still become a stop string, as vLLM's DELTA mode does); None for a step that
        only prefilled part of the prompt (its prompt logprobs wait for the first)."""
        finished = finish_reason is not None
        if self.prompt_logprobs_k is not None:
            self._hold_prompt_logprobs()
            if not new_token_ids and not finished:
                return None
        text = self.detokenizer.get_next_output_text(finished, True)
        logprobs = None
        if self.logprobs_k is not None and new_token_ids:
            positions = self.logprobs_processor.logprobs[-len(new_token_ids) :]
            k = self.logprobs_k
            logprobs = [
                token_logprob(token, position, k)
                for token, position in zip(new_token_ids, positions, strict=True)
            ]
        prompt_logprobs, self._held = self._held, None
        return Delta(
            new_token_ids,
            text,
            str(finish_reason) if finished else None,
            stop_reason,
            self.num_cached_tokens,
            logprobs,
            prompt_logprobs,
        )

    def _hold_prompt_logprobs(self) -> None:
        positions = self.logprobs_processor.pop_prompt_logprobs()
        if not positions:
            return
        held = self._held if self._held is not None else []
        start, k = len(held), self.prompt_logprobs_k or 0
        for offset, position in enumerate(positions):
            token = self.prompt_ids[start + offset]
            held.append(None if position is None else token_logprob(token, position, k))
        self._held = held

    def make_request_output(
        self,
        new_token_ids: list[int],
        pooling_output: Any,
        finish_reason: Any,
        stop_reason: str | int | None,
        kv_transfer_params: Any = None,
        ec_transfer_params: Any = None,
        error: Any = None,
    ) -> Delta | None:
        # vLLM calls it on an abort (OutputProcessor.abort_requests), for the final output.
        return self.delta(new_token_ids, finish_reason, stop_reason)


class StepConsumer:
    """The loop that consumes the engine core's outputs, one step at a time, for every
    request of the process (see the module's docstring)."""

    def __init__(self, llm: AsyncLLM) -> None:
        self._llm = llm
        self._processor = llm.output_processor
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Take the place of AsyncLLM's output handler (started when the engine was
        built inside the event loop, and waiting for a first step: nothing is lost)."""
        llm = self._llm
        if llm.output_handler is not None:
            llm.output_handler.cancel()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="step-consumer")
        # AsyncLLM starts no handler of its own while one is set, reports itself dead
        # when it ends, and cancels it at shutdown.
        llm.output_handler = self._task

    async def add(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams,
        sink: Sink,
        *,
        prompt_ids: Sequence[int],
        lora_request: LoRARequest | None,
        priority: int,
        trace: EngineTrace | None = None,
    ) -> str:
        """Submit a rendered prompt (`tokens_input`, or multimodal data: rendered by
        vLLM's input processor off the loop) whose outputs go to `sink`; vLLM's internal
        request id (what `abort(..., internal=True)` takes). A `trace`'s headers go with
        the request, as `AsyncLLM.generate`'s `trace_headers` do: vLLM's own span of it
        (`llm_request`, with --otlp-traces-endpoint) is their child."""
        llm = self._llm
        if llm.errored:
            raise EngineDeadError()
        kwargs: Mapping[str, Any] = {
            "supported_tasks": await llm.get_supported_tasks(),
            "lora_request": lora_request,
            "priority": priority,
            "trace_headers": trace.headers if trace is not None else None,
        }
        if isinstance(prompt, dict) and "type" in prompt:
            request = llm.input_processor.process_inputs(request_id, prompt, params, **kwargs)
        else:  # multimodal data to process: vLLM does it in its renderer thread
            request = await llm.input_processor.process_inputs_async(
                request_id, prompt, params, **kwargs
            )
            # It expanded the images itself: it must have rebuilt the request's tokens.
            check_expansion(list(prompt_ids), request.prompt_token_ids)
        llm.input_processor.assign_request_id(request)
        internal_id: str = request.request_id
        llm.check_admission(request_id=internal_id)
        self._processor.add_request(request, None, None, 0, sink)
        state = self._processor.request_states[internal_id]
        state.__class__ = StepState
        state.prompt_ids = prompt_ids
        state.logprobs_k = params.logprobs
        state.prompt_logprobs_k = params.prompt_logprobs
        state.trace = trace
        try:
            await llm.engine_core.add_request_async(request)
        except BaseException:
            await asyncio.shield(llm.abort(internal_id, internal=True))
            raise
        if llm.log_requests:  # vLLM's own line, as `AsyncLLM` writes it (--enable-log-requests)
            vllm_logger.info("Added request %s.", internal_id)
        return internal_id

    async def _run(self) -> None:
        llm, processor = self._llm, self._processor
        engine_core = llm.engine_core
        states = processor.request_states
        log_stats = llm.log_stats
        renderer = llm.renderer
        mm_cache = renderer.mm_processor_cache
        try:
            while True:
                outputs = await engine_core.get_output_async()
                ours = outputs.outputs
                stats = IterationStats() if log_stats and ours else None
                timestamp = outputs.timestamp
                theirs = []
                to_abort: list[str] = []
                for output in ours:
                    state = states.get(output.request_id)
                    if state is None:  # aborted meanwhile
                        continue
                    if state.__class__ is StepState:
                        self._step(state, output, timestamp, stats, to_abort)
                    else:
                        theirs.append(output)
                if theirs:  # AsyncLLM's path: vLLM's own processing, in this loop
                    processed = processor.process_outputs(
                        theirs, timestamp, stats, weight_version=outputs.weight_version
                    )
                    to_abort += processed.reqs_to_abort
                if mm_cache is not None:  # as AsyncLLM's handler: recover P0/P1 drift
                    for output in ours:
                        for mm_hash in output.mm_cache_miss_hashes or ():
                            mm_cache.invalidate(mm_hash)
                if to_abort:
                    await engine_core.abort_requests_async(to_abort)
                processor.update_scheduler_stats(outputs.scheduler_stats)
                loggers = llm.logger_manager
                if loggers:
                    loggers.record(
                        engine_idx=outputs.engine_index,
                        scheduler_stats=outputs.scheduler_stats,
                        iteration_stats=stats,
                        mm_cache_stats=renderer.stat_mm_cache(),
                    )
        except Exception as exc:
            logger.exception("the engine's output consumer failed")
            processor.propagate_error(exc)

    def _step(
        self,
        state: StepState,
        output: Any,
        timestamp: float,
        stats: IterationStats | None,
        to_abort: list[str],
    ) -> None:
        """One request's output of one step, as `OutputProcessor.process_outputs` walks
        it (the branches a `StepState` can take: no pooling, no streaming input)."""
        processor = self._processor
        if stats is not None:
            stats.update_from_output(
                output,
                timestamp,
                state.is_prefilling,
                state.stats,
                processor.lora_states,
                state.lora_name,
            )
        new_token_ids = output.new_token_ids
        finish_reason = output.finish_reason
        stop_reason = output.stop_reason
        if state.is_prefilling:
            prefill = output.prefill_stats
            if prefill is not None:
                state.num_cached_tokens = prefill.num_cached_tokens
                state.num_cache_creation_tokens = prefill.num_cache_creation_tokens
            state.is_prefilling = False
        detokenizer = state.detokenizer
        before = detokenizer.num_output_tokens()
        stop_string = detokenizer.update(new_token_ids, finish_reason == VllmFinish.STOP)
        if stop_string:
            finish_reason, stop_reason = VllmFinish.STOP, stop_string
            processor._trim_surplus_tokens(state, output, before)
        if state.logprobs_k is not None or state.prompt_logprobs_k is not None:
            state.logprobs_processor.update_from_output(output)
        delta = state.delta(new_token_ids, finish_reason, stop_reason)
        if finish_reason is not None:
            processor._finish_request(state)
            if output.finish_reason is None:  # a stop string the engine core has not seen
                to_abort.append(state.request_id)
            processor._update_stats_from_finished(state, finish_reason, stats)
            # vLLM's tracing reads the step's stats (none with --disable-log-stats).
            if processor.tracing_enabled and stats is not None:
                processor.do_tracing(output, state, stats)
            if state.trace is not None:
                _tell_stages(state.trace, state.stats)
        if delta is not None:
            state.queue.put(delta)


def _tell_stages(trace: EngineTrace, stats: Any) -> None:
    """The engine core's stage times of a finished request, from vLLM's own
    `RequestStateStats` (the host's monotonic clock; no stats with --disable-log-stats;
    0.0 where vLLM left a stage unreached)."""
    if stats is None:
        return
    trace.queued = stats.queued_ts or None
    trace.scheduled = stats.scheduled_ts or None
    trace.first_token = stats.first_token_ts or None
    trace.last_token = stats.last_token_ts or None


def merge_deltas(deltas: list[Delta], prompt_ids: list[int] | None) -> TokenEvent:
    """One event of the deltas that arrived together (the reader fell behind by as many
    steps, as vLLM's collector merges them); `prompt_ids` on a request's first."""
    last = deltas[-1]
    if len(deltas) == 1:
        token_ids, text, logprobs = last.token_ids, last.text, last.logprobs
    else:
        token_ids = [token for delta in deltas for token in delta.token_ids]
        text = "".join(delta.text for delta in deltas)
        logprobs = (
            None
            if deltas[0].logprobs is None and last.logprobs is None
            else [lp for delta in deltas for lp in delta.logprobs or ()]
        )
    first = prompt_ids is not None
    return TokenEvent(
        token_ids=token_ids,
        text=text,
        logprobs=logprobs,
        finish_reason=finish_of(last.finish_reason),
        stop_reason=last.stop_reason if last.finish_reason is not None else None,
        prompt_token_ids=prompt_ids,
        prompt_logprobs=deltas[0].prompt_logprobs if first else None,
        num_cached_tokens=deltas[0].num_cached_tokens if first else 0,
    )
