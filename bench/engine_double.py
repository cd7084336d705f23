"""Engine doubles for measuring a frontend's own CPU per token: vLLM's engine taken out,
everything above it kept (bench/per_token.py).

One `Stepper` stands for the engine core: a shared clock whose every step hands each
active request one token, as one engine step does for every running request; a request
becomes active when it is added, gets its first token at the next step and ends after
its `max_tokens` (finish reason "length"); an abort drops it at once. Two doubles sit on
it, at two depths:

- `StubLLM` replaces `AsyncLLM` itself: its `generate()` yields `RequestOutput` deltas
  (text and token ids, `RequestOutputKind.DELTA`), one per request per step, through
  vLLM's own per-request `RequestOutputCollector`, as `AsyncLLM.generate` does, with no
  detokenizer, no stats and no output-handler task: the cheapest engine a Python
  frontend could sit on. Everything else (the tokenizer, the configs, the renderer) is
  the real `AsyncLLM`'s it wraps.
- `StubEngineCore` replaces the engine-core client under a real `AsyncLLM`
  (`install_stub_core`): vLLM's output handler, `OutputProcessor` (detokenizer,
  `RequestOutput`s, collectors), `IterationStats` and stat loggers (the EPP gauges) all
  run as in production; only the engine core process and its ZMQ socket are gone.

Each step's tokens are ids whose text is short printable ASCII, cycled per request, so
the detokenizer and the JSON encoders see ordinary text. Steps run on the frontend's own
event loop (a real engine's outputs arrive there too, from a socket); the stepper's own
cost per token is the `step loop` target of bench/per_token.py (its outputs read and
dropped).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
)
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.engine.output_processor import RequestOutputCollector
from vllm.v1.metrics.stats import PrefillStats, SchedulerStats

_WORD_PIECE = re.compile(r" ?[A-Za-z]{2,7}")
KV_BLOCKS = 4096  # what the stub engine core reports as its KV cache (gauges only)


def text_tokens(tokenizer: Any, count: int = 256) -> list[tuple[int, str]]:
    """`count` token ids whose own text is a word piece (2-7 letters, maybe after a
    space), with it: text any order of them decodes to, as a model's output would."""
    found: list[tuple[int, str]] = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if _WORD_PIECE.fullmatch(text) and token_id not in tokenizer.all_special_ids:
            found.append((token_id, text))
            if len(found) == count:
                break
    return found


@dataclass(eq=False)
class _Active:
    request_id: str
    max_tokens: int
    prompt_len: int
    offset: int
    sent: int = 0
    sink: Any = None  # the double's own per-request state (a collector)
    first: bool = True


@dataclass
class Stepper:
    """The engine core's clock: one token per active request per step, a step every
    `period_s` while any request is active (a step overdue runs at once)."""

    period_s: float
    tokens: Sequence[tuple[int, str]]
    steps: int = 0
    _active: dict[str, _Active] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _next: int = 0

    def add(self, request_id: str, max_tokens: int, prompt_len: int, sink: Any = None) -> None:
        self._next += 7
        self._active[request_id] = _Active(
            request_id, max_tokens, prompt_len, self._next % len(self.tokens), sink=sink
        )
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._active.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._active)

    async def step(self) -> list[tuple[_Active, int, str, bool]]:
        """The next step's `(request, token id, its text, finished)`, one per request
        active when it runs; finished requests leave."""
        while not self._active:
            self._wake.clear()
            await self._wake.wait()
        await asyncio.sleep(self.period_s)
        self.steps += 1
        out = []
        tokens = self.tokens
        for request in list(self._active.values()):
            token_id, text = tokens[(request.offset + request.sent) % len(tokens)]
            request.sent += 1
            finished = request.sent >= request.max_tokens
            if finished:
                del self._active[request.request_id]
            out.append((request, token_id, text, finished))
        return out


# -- StubLLM: in place of AsyncLLM -------------------------------------------------------


class StubLLM:
    """`AsyncLLM`'s `generate`/`abort` on a `Stepper`; every other attribute is the
    wrapped `AsyncLLM`'s."""

    def __init__(self, llm: Any, stepper: Stepper) -> None:
        self._llm = llm
        self._stepper = stepper
        self._task: asyncio.Task[None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def _run(self) -> None:
        while True:
            for request, token_id, text, finished in await self._stepper.step():
                completion = CompletionOutput(
                    index=0,
                    text=text,
                    token_ids=[token_id],
                    cumulative_logprob=None,
                    logprobs=None,
                    finish_reason="length" if finished else None,
                    stop_reason=None,
                )
                collector, prompt_ids = request.sink
                collector.put(
                    RequestOutput(
                        request_id=request.request_id,
                        prompt=None,
                        prompt_token_ids=prompt_ids,
                        prompt_logprobs=None,
                        outputs=[completion],
                        finished=finished,
                        num_cached_tokens=0,
                    )
                )

    async def generate(
        self, prompt: Any, params: Any, request_id: str, **_: Any
    ) -> AsyncGenerator[RequestOutput, None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        prompt_ids = prompt["prompt_token_ids"]
        collector = RequestOutputCollector(RequestOutputKind.DELTA, request_id)
        self._stepper.add(request_id, params.max_tokens, len(prompt_ids), (collector, prompt_ids))
        try:
            finished = False
            while not finished:
                out = collector.get_nowait() or await collector.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            self._stepper.abort(request_id)
            raise
        finally:
            collector.close()

    async def abort(self, request_id: str) -> None:
        self._stepper.abort(request_id)


# -- StubEngineCore: in place of the engine-core client under a real AsyncLLM -----------


class StubEngineCore:
    """What `AsyncLLM` asks of its engine-core client, answered from a `Stepper`."""

    engine_ranks_managed: ClassVar[list[int]] = [0]

    def __init__(self, stepper: Stepper) -> None:
        self._stepper = stepper
        self.resources = SimpleNamespace(engine_dead=False)

    async def add_request_async(self, request: Any) -> None:
        self._stepper.add(
            request.request_id, request.sampling_params.max_tokens, len(request.prompt_token_ids)
        )

    async def abort_requests_async(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._stepper.abort(request_id)

    async def get_output_async(self) -> EngineCoreOutputs:
        step = await self._stepper.step()
        now = time.monotonic()
        outputs = []
        for request, token_id, _, finished in step:
            output = EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[token_id],
                finish_reason=FinishReason.LENGTH if finished else None,
            )
            if request.first:  # as the scheduler reports a request's prefill
                request.first = False
                output.events = [
                    EngineCoreEvent(type=EngineCoreEventType.QUEUED, timestamp=now),
                    EngineCoreEvent(type=EngineCoreEventType.SCHEDULED, timestamp=now),
                ]
                output.prefill_stats = PrefillStats(
                    num_prompt_tokens=request.prompt_len, num_computed_tokens=request.prompt_len
                )
            outputs.append(output)
        running = len(self._stepper)
        stats = SchedulerStats(num_running_reqs=running, kv_cache_usage=running / KV_BLOCKS)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats, timestamp=now)

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def collective_rpc_async(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    async def add_lora_async(self, request: Any) -> bool:
        return True

    async def remove_lora_async(self, lora_id: int) -> bool:
        return True

    def dp_engines_running(self) -> bool:
        return False

    def get_kv_event_sources(self) -> dict[int, Any]:
        return {}

    def shutdown(self, timeout: float | None = None) -> None:
        pass


def install_stub_core(stepper: Stepper) -> None:
    """Every `AsyncLLM` made from now on in this process runs on `StubEngineCore`."""

    def make(**kwargs: Any) -> StubEngineCore:
        # The real client learns the KV cache's size from the engine core's handshake.
        kwargs["vllm_config"].cache_config.num_gpu_blocks = KV_BLOCKS
        return StubEngineCore(stepper)

    EngineCoreClient.make_async_mp_client = staticmethod(make)  # type: ignore[method-assign]
