"""`VllmEngine`: the one in-process vLLM `AsyncLLM` of the server, behind `Engine`.

It turns neutral `GenerationRequest`s into vLLM calls (always token-id prompts, so every
protocol shares one tokenisation and vLLM's prefix cache sees identical prefixes) and
the engine core's outputs into neutral `TokenEvent` deltas: through the process's one
consumer of those outputs (`app.engine.vllm.consumer`), or, where it cannot serve,
through AsyncLLM's own path and `app.engine.vllm.convert` (chosen in `_consumed`). A
request's events are pulled (`generate`: an async iterator, its task woken once per step
that has output) or pushed (`run`: handed to a callback from the consumer's loop, its
task woken once at the end). Every call into vLLM goes through `map_engine_errors`.

A vision-language model (`app.engine.vllm.vision`) takes images: a request's images go
to vLLM as multimodal data next to its token ids (`app.engine.images` says how the
prompt is prepared). Such a model never samples its three vision tokens: a sampled pad
would be taken for an image's placeholder the next time the text is sent back.

Invariants:
- A request whose consumer stops (closes the iterator, or its task is cancelled) is
  aborted in the engine before `generate`'s iterator (or `run`) finishes closing; the
  aborts of one turn of the event loop in one call (`app.engine.vllm.aborts`).
- `num_running_requests()` counts requests between submission and their final event.
- `engine_requests()` is the engine core's own count (its scheduler's running + waiting),
  as reported with the outputs of its latest step: it drops only once the engine core has
  finished or aborted a request, and is stale while the engine core has not stepped since
  a request was submitted (a step follows every abort, so an abort always shows).
- A request with images runs on exactly its token ids: if vLLM expands an image to a
  different number of pads than the request's block holds, the request fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from vllm.inputs import TokensPrompt
from vllm.inputs.engine import TokensInput, tokens_input
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.base import (
    OPEN_REQUESTS,
    EngineInfo,
    GenerationRequest,
    LoraAdapter,
    OpenRequests,
    SamplingOptions,
    TokenEvent,
)
from app.engine.batch_gate import BatchGate
from app.engine.images import collapse_blocks
from app.engine.readout_client import ReadoutBatcher, ReadoutTracker
from app.engine.readout_worker import READOUT_ID_KEY, READOUT_KEY
from app.engine.validation import check_prompt, validate_sampling
from app.engine.vllm.aborts import Aborts
from app.engine.vllm.consumer import Delta, Sink, StepConsumer, merge_deltas
from app.engine.vllm.convert import EventConverter, check_expansion, prompt_only
from app.engine.vllm.errors import map_engine_errors
from app.engine.vllm.hold import EngineHold
from app.engine.vllm.json_grammar import lowered
from app.engine.vllm.lora import check_adapter, refused
from app.engine.vllm.params import sampling_params
from app.engine.vllm.stats import SchedulerCounts
from app.engine.vllm.tokenizer import HfTokenizer
from app.errors import InvalidRequest, ModelNotFound, NotFound


class VllmEngine:
    """One `AsyncLLM` for the whole process."""

    def __init__(
        self,
        llm: AsyncLLM,
        info: EngineInfo,
        tokenizer: HfTokenizer,
        counts: SchedulerCounts,
        hold: EngineHold,
    ) -> None:
        self._llm = llm
        self._hold = hold
        self._counts = counts
        self._info = info
        self._tokenizer = tokenizer
        self._grammar = llm.vllm_config.structured_outputs_config
        self._loras: dict[str, LoraAdapter] = {}
        self._next_lora_id = 1
        self._running: set[str] = set()
        self._readouts = ReadoutBatcher(self._take_readouts)
        # Prompt logprobs must run alone where vLLM's CPU LoRA logits path runs (see
        # app.engine.batch_gate); None elsewhere, and then no request waits for anything.
        lora_on_cpu = info.max_loras > 0 and current_platform.is_cpu()
        self._gate = BatchGate() if lora_on_cpu else None
        self._consumer = StepConsumer(llm)
        self._consumer.start()
        self._aborts = Aborts(llm)
        # The consumer hands on every step's tokens: not with an engine-level stream
        # interval, which keeps AsyncLLM's path for every request (see `_consumed`).
        self._stepwise: bool = llm.output_processor.stream_interval == 1

    def shutdown(self) -> None:
        self._hold.release()  # or the engine's processes would ignore vLLM's SIGTERM
        self._tokenizer.close()
        self._llm.shutdown()

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._tokenizer

    # -- models and adapters -------------------------------------------------------

    def has_model(self, name: str) -> bool:
        return name == self._info.model_name or name in self._loras

    def loras(self) -> Sequence[LoraAdapter]:
        return list(self._loras.values())

    async def load_lora(self, name: str, path: str) -> LoraAdapter:
        if self._info.max_loras == 0:
            raise InvalidRequest("LoRA is not enabled; start the server with --enable-lora")
        if name == self._info.model_name or name in self._loras:
            raise InvalidRequest(f"The model {name!r} is already loaded", param="lora_name")
        model_config = self._llm.model_config
        # File reads (a path a client names may be slow storage): off the event loop.
        await asyncio.to_thread(
            check_adapter,
            path,
            self._llm.vllm_config.lora_config,
            getattr(model_config.hf_text_config, "max_position_embeddings", None),
        )
        adapter = LoraAdapter(name=name, path=path, int_id=self._next_lora_id)
        self._next_lora_id += 1
        request = LoRARequest(lora_name=name, lora_int_id=adapter.int_id, lora_path=path)
        try:
            with map_engine_errors():
                await self._llm.add_lora(request)
        except (InvalidRequest, NotFound) as exc:  # vLLM's words may name the path
            raise refused(path, exc.message) from exc
        self._loras[name] = adapter
        return adapter

    async def unload_lora(self, name: str) -> None:
        adapter = self._loras.pop(name, None)
        if adapter is None:
            raise NotFound(f"The LoRA adapter {name!r} is not loaded", param="lora_name")
        with map_engine_errors():
            await self._llm.remove_lora(adapter.int_id)

    def _lora_request(self, name: str | None) -> LoRARequest | None:
        if name is None or name == self._info.model_name:
            return None
        adapter = self._loras.get(name)
        if adapter is None:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        return LoRARequest(lora_name=name, lora_int_id=adapter.int_id, lora_path=adapter.path)

    # -- requests ------------------------------------------------------------------

    def num_running_requests(self) -> int:
        return len(self._running)

    def engine_requests(self) -> int:
        return self._counts.requests

    def kv_event_sources(self) -> dict[int, dict[str, object]]:
        sources = self._llm.engine_core.get_kv_event_sources()
        return {rank: dataclasses.asdict(config) for rank, config in sources.items()}

    async def check_health(self) -> None:
        with map_engine_errors():
            await self._llm.check_health()

    async def abort(self, request_id: str) -> None:
        with map_engine_errors():
            await self._llm.abort(request_id)

    def _prepare(self, request: GenerationRequest) -> _Prepared:
        """The request checked and in vLLM's terms."""
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = self._tokenizer.encode(request.prompt_text or "")
        # The cores validated already, their constraint compiled off the event loop; this
        # is the safety net, without that compiling (it runs on the loop), and the one
        # context check (vLLM has no exception type for it).
        options = validate_sampling(
            request.sampling, self._info, prefill_only=True, compile_constraint=False
        )
        check_prompt(prompt_ids, options.max_tokens, self._info)
        # As the engine's checker checked it: a JSON schema on xgrammar, corrected.
        options = replace(options, constraint=lowered(options.constraint, self._grammar))
        # vLLM always samples at least one token: a prefill-only request (scoring) samples
        # one and drops it.
        prefill_only = options.max_tokens == 0
        if prefill_only:
            options = replace(options, max_tokens=1, logprobs=None)
        lora = self._lora_request(request.lora_name)
        readouts = self._readout_args(request)
        vision = self._info.vision
        params = sampling_params(
            options, readouts, vision.token_ids if vision is not None else frozenset()
        )
        return _Prepared(prompt_ids, options, params, lora, readouts is not None, prefill_only)

    def _consumed(self) -> bool:
        """The one choice of output path. The consumer serves every request (plain,
        logprobs, prompt logprobs, images, readouts, LoRA, stop strings, priorities; `n`
        is one engine request per choice here) unless an engine-level stream interval
        above 1 is set: it hands on every step's tokens, and AsyncLLM's path holds them
        back as the interval asks."""
        return self._stepwise

    async def _enter_gate(self, prepared: _Prepared) -> Callable[[], None]:
        """Wait for the batch gate (`app.engine.batch_gate`); its release."""
        if self._gate is None:
            return _nothing
        return await self._gate.enter(exclusive=prepared.options.prompt_logprobs is not None)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        prepared = self._prepare(request)
        prompt_ids = prepared.prompt_ids
        tracker = (
            ReadoutTracker(request.readout_ranges, len(prompt_ids)) if prepared.readouts else None
        )
        output_tokens = 0
        if self._consumed():
            events = self._consumed_events(prepared, request)
        else:
            events = self._converted_events(prepared, request)
        release = await self._enter_gate(prepared)
        self._running.add(request.request_id)
        try:
            # Only the calls into vLLM are mapped (in the two sources): a bug of ours
            # stays itself.
            async for event in events:
                output_tokens += len(event.token_ids)
                if tracker is not None and tracker.due(output_tokens):
                    taken = await self._readouts.take(request.request_id)
                    event = event._replace(readouts=taken)
                if prepared.prefill_only:
                    yield event._replace(
                        token_ids=[],
                        text="",
                        logprobs=None,
                        finish_reason="length",
                        stop_reason=None,
                        readouts=prompt_only(event.readouts, len(prompt_ids)),
                    )
                    return
                yield event
        finally:
            try:
                self._running.discard(request.request_id)
                # Closing the events aborts the request if it has not finished; shield
                # it so a cancelled consumer still completes the abort.
                await asyncio.shield(events.aclose())
                if prepared.readouts:
                    with map_engine_errors():
                        await asyncio.shield(
                            self._llm.collective_rpc("readout_drop", args=(request.request_id,))
                        )
            finally:
                release()  # after the abort: vLLM handles it before the next request

    async def run(self, request: GenerationRequest, receive: Callable[[TokenEvent], None]) -> None:
        prepared = self._prepare(request)
        if prepared.readouts or prepared.prefill_only or not self._consumed():
            # Readouts are fetched from the worker between events (an await each), and a
            # prefill-only request reshapes its one event: they are pulled.
            async for event in self.generate(request):
                receive(event)
            return
        release = await self._enter_gate(prepared)
        self._running.add(request.request_id)
        sink = Sink()
        internal_id: str | None = None
        first, finished = True, False

        opened: _Opened | None = None

        def hand_on(delta: Delta) -> None:
            nonlocal first, finished
            if opened is not None and opened.sent is not None:
                return  # taken off (`OpenRequests.abort`): its task waits for its cancel
            event = merge_deltas([delta], prepared.prompt_ids if first else None)
            first = False
            finished = event.finish_reason is not None
            receive(event)

        try:
            with map_engine_errors():
                internal_id = await self._add(prepared, request, sink)
            opened = _Opened.of(internal_id, self._aborts)
            sink.push(hand_on)
            # Only the calls into vLLM are mapped: a receiver's exception (a bug of ours)
            # is raised as it is.
            with map_engine_errors():
                await sink.wait_pushed(lambda: finished)
        finally:
            try:
                self._running.discard(request.request_id)
                if internal_id is not None:
                    await self._ended(internal_id, opened, finished)
            finally:
                release()

    async def _add(self, prepared: _Prepared, request: GenerationRequest, sink: Sink) -> str:
        """Submit to the consumer; vLLM's internal request id."""
        return await self._consumer.add(
            request.request_id,
            self._prompt(prepared.prompt_ids, request),
            prepared.params,
            sink,
            prompt_ids=prepared.prompt_ids,
            lora_request=prepared.lora,
            priority=request.priority,
            trace=request.trace,
        )

    async def _consumed_events(
        self, prepared: _Prepared, request: GenerationRequest
    ) -> AsyncGenerator[TokenEvent, None]:
        """The request's outputs from the consumer (`app.engine.vllm.consumer`), pulled."""
        sink = Sink()
        with map_engine_errors():
            internal_id = await self._add(prepared, request, sink)
        opened = _Opened.of(internal_id, self._aborts)
        first, finished = True, False
        try:
            while not finished:
                with map_engine_errors():
                    deltas = sink.take_nowait() or await sink.take()
                event = merge_deltas(deltas, prepared.prompt_ids if first else None)
                first = False
                finished = event.finish_reason is not None
                yield event
        finally:
            await self._ended(internal_id, opened, finished)

    async def _ended(self, internal_id: str, opened: _Opened | None, finished: bool) -> None:
        """A request's end as it unwinds: out of its task's `OpenRequests`, and, unless it
        finished, aborted: by the abort that `OpenRequests` sent already, or its own."""
        if opened is not None:
            opened.close()
        if finished:
            return
        if opened is None or opened.sent is None:
            await self._aborts.abort(internal_id)
        else:  # its waiter may be cancelled; the call goes on
            await asyncio.shield(opened.sent)

    async def _converted_events(
        self, prepared: _Prepared, request: GenerationRequest
    ) -> AsyncGenerator[TokenEvent, None]:
        """AsyncLLM's path: vLLM's `RequestOutput`s, converted."""
        prompt_ids = prepared.prompt_ids
        prompt = self._prompt(prompt_ids, request)
        stream = self._llm.generate(
            prompt,
            prepared.params,
            request.request_id,
            lora_request=prepared.lora,
            priority=request.priority,
            trace_headers=request.trace.headers if request.trace is not None else None,
        )
        converter = EventConverter(prompt_ids, prepared.options)
        echo_due = bool(request.images)
        try:
            while True:
                with map_engine_errors():
                    try:
                        output = await anext(stream)
                    except StopAsyncIteration:
                        return
                if echo_due:
                    check_expansion(prompt_ids, output.prompt_token_ids)
                    echo_due = False
                event = converter.convert(output)
                if event is not None:
                    yield event
        finally:
            # Closing vLLM's generator aborts the request if it has not finished.
            await asyncio.shield(stream.aclose())

    def _prompt(
        self, prompt_ids: list[int], request: GenerationRequest
    ) -> TokensInput | TokensPrompt:
        if not request.images:
            # Already rendered: vLLM takes it on the event loop. A raw TokensPrompt would
            # make a round trip through vLLM's renderer thread for nothing, and each hop
            # costs the frontend a GIL hand-over (8% of its CPU at 32 streams, profiled).
            return tokens_input(prompt_ids)
        vision = self._info.require_vision("images")
        if len(request.images) > vision.max_images:
            raise InvalidRequest(
                f"{len(request.images)} images in one prompt; the engine takes at most "
                f"{vision.max_images}",
                param="images",
            )
        images = request.images
        return TokensPrompt(
            prompt_token_ids=collapse_blocks(prompt_ids, images, vision),
            multi_modal_data={"image": [block.image.pixels for block in images]},
            multi_modal_uuids={"image": [block.image.digest for block in images]},
        )

    def _readout_args(self, request: GenerationRequest) -> dict[str, Any] | None:
        if not request.readout_ranges:
            return None
        if self._info.readout is None:
            raise InvalidRequest(
                "Readouts are not configured on this server (--readout-concepts)",
                param="readout_ranges",
            )
        ranges = [[int(start), int(end)] for start, end in request.readout_ranges]
        if any(start < 0 or end < start for start, end in ranges):
            raise InvalidRequest("readout ranges must be [start, end)", param="readout_ranges")
        return {READOUT_KEY: ranges, READOUT_ID_KEY: request.request_id}

    async def _take_readouts(self, request_ids: list[str]) -> dict[str, list[tuple[int, bytes]]]:
        with map_engine_errors():
            per_worker = await self._llm.collective_rpc("readout_take", args=(request_ids,))
        # Every tensor-parallel rank computes the same residual stream; rank 0's suffices.
        taken: dict[str, list[tuple[int, bytes]]] = per_worker[0]
        return taken


class _Opened:
    """A request registered with its task's `OpenRequests` while it runs: the abort that
    sends `sent` ahead of the task's cancel."""

    def __init__(self, held: OpenRequests, internal_id: str, aborts: Aborts) -> None:
        self.held, self.internal_id, self._aborts = held, internal_id, aborts
        self.sent: asyncio.Future[None] | None = None
        held.opened(internal_id, self._send)

    @classmethod
    def of(cls, internal_id: str, aborts: Aborts) -> _Opened | None:
        held = OPEN_REQUESTS.get()
        return None if held is None else cls(held, internal_id, aborts)

    def _send(self) -> None:
        if self.sent is None:
            self.sent = self._aborts.soon(self.internal_id)

    def close(self) -> None:
        self.held.closed(self.internal_id)


class _Prepared(NamedTuple):
    """A request checked and in vLLM's terms (`VllmEngine._prepare`)."""

    prompt_ids: list[int]
    options: SamplingOptions
    params: SamplingParams
    lora: LoRARequest | None
    readouts: bool  # readouts asked for: taken from the worker between events
    prefill_only: bool  # max_tokens 0: one token sampled and dropped


def _nothing() -> None:
    """The release of a gate not held."""
