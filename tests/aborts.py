"""Abort tests that can fail: a long workload, vLLM's own count of its requests, a bound.

Every abort test (the engine layer and each protocol) starts the same `Workload`, waits
until the engine holds all of it, aborts it the protocol's way, and requires the engine
to be idle again within `Workload.bound` (a third of the workload's natural length). Two
rules make a broken abort fail rather than pass by luck:

- The count is the engine core's own (`Engine.engine_requests()`: its scheduler's running
  + waiting requests, reported with the outputs of every engine step, the step that
  follows an abort included), not our wrapper's counter, which drops in a `finally`
  whether or not vLLM aborted anything.
- The workload is long: `WORKERS` chat prompts (as token ids) decoded greedily for
  `max_tokens` each, all at once (one request cannot run 5 s in the live server's
  1,024-token context). The abort must come within `bound` of the submission
  (`AbortWatch.all_in_engine`) and the engine be idle within `bound` after it
  (`AbortWatch.idle`). `measure_workload` runs its first half (`max_tokens / 2` each)
  once on the engine, timed from submission to the engine's idle, and takes 1.5x that as
  `natural` (required >= 5 s): the whole runs longer than its half, so `natural` is
  under 1.5x the whole's length, and a workload left running would still hold the
  engine past the point where the test gives up (`2 * bound` after the submission at
  most). Half the run measured, not all of it: the whole took 40-60 s of both cores,
  the suite's dearest fixture.

Why `natural` holds for every protocol: greedy decoding is deterministic, so the same
prompts decode to the same tokens (and stop at the same EOS) on any route; the
measurement runs without `ignore_eos`, so a route that sets it (OpenAI) or sends copies
of one prompt under `ignore_eos` (chat's `n`) runs at least as long. Evergreen and chat
build the prompt from `texts` with the model's chat template, which is how `prompts` are
made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from app.engine.base import (
    ChatMessage,
    ChatPrompt,
    GenerationRequest,
    SamplingOptions,
    TextPart,
)

WORKERS = 96  # concurrent requests; vLLM's CPU default runs up to 128 at once
PROMPT_ROOM = 64  # tokens left for each chat-templated prompt
MIN_NATURAL = 5.0  # seconds
# A websocket client that has stopped reading (its queue full of the workload's output)
# cannot complete a close handshake: the server's close frame waits behind that output.
# Abort tests close such sockets with this timeout (seconds), then drop the connection.
CLOSE_TIMEOUT = 1.0


@dataclass(frozen=True)
class Workload:
    texts: tuple[str, ...]  # one user message each
    prompts: tuple[tuple[int, ...], ...]  # the same messages, chat-templated, as token ids
    max_tokens: int
    natural: float  # seconds: under 1.5x what the engine runs it for when nobody aborts

    @property
    def bound(self) -> float:
        return self.natural / 3


async def _drain(engine: Any, request: GenerationRequest) -> None:
    async for _ in engine.generate(request):
        pass


async def _run_all(
    engine: Any, prompts: Sequence[Sequence[int]], max_tokens: int, tag: str
) -> None:
    """Every prompt at once, decoded greedily for `max_tokens`, to the end."""
    await asyncio.gather(
        *(
            _drain(
                engine,
                GenerationRequest(
                    f"{tag}-{i}",
                    prompt_token_ids=prompt,
                    sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0),
                ),
            )
            for i, prompt in enumerate(prompts)
        )
    )


async def measure_workload(engine: Any) -> Workload:
    """Build the workload and run it once, unaborted, on `engine` (on the server's loop)."""
    texts = tuple(f"Tell me story number {i}, and make it long." for i in range(WORKERS))
    prompts = tuple(
        tuple(
            engine.tokenizer.apply_chat_template(
                ChatPrompt((ChatMessage("user", (TextPart(text),)),))
            )
        )
        for text in texts
    )
    assert max(len(p) for p in prompts) <= PROMPT_ROOM
    max_tokens = engine.info.max_model_len - PROMPT_ROOM
    await wait_engine(engine, lambda n: n == 0, timeout=120)
    started = time.monotonic()
    await _run_all(engine, prompts, max_tokens // 2, "natural")
    await wait_engine(engine, lambda n: n == 0, timeout=120)
    half = time.monotonic() - started
    workload = Workload(texts, prompts, max_tokens, natural=1.5 * half)
    assert workload.natural >= MIN_NATURAL, (
        f"the abort workload ran only {workload.natural:.1f} s: it cannot tell an abort "
        "from a natural end"
    )
    return workload


@asynccontextmanager
async def busy_engine(
    engine: Any, loop: asyncio.AbstractEventLoop, workload: Workload
) -> AsyncIterator[None]:
    """The engine (living on `loop`) running all of `workload` for the block, aborted on
    exit: a lone request then decodes at the pace of a full batch, so that a few hundred
    tokens of it last seconds where alone they could end before a protocol's abort lands
    (one request cannot run long in the live server's 1,024-token context)."""
    ballast = _run_all(engine, workload.prompts, workload.max_tokens, "ballast")
    running = asyncio.run_coroutine_threadsafe(ballast, loop)
    try:
        seen = await wait_engine(engine, lambda n: n >= WORKERS, workload.bound)
        assert seen >= WORKERS, f"the engine held {seen} of the ballast's {WORKERS} requests"
        yield
    finally:
        running.cancel()
        await wait_engine(engine, lambda n: n == 0, timeout=3 * workload.natural)


async def wait_engine(engine: Any, done: Callable[[int], bool], timeout: float) -> int:
    """Poll the engine's own request count until `done(count)`; return the last count."""
    deadline = time.monotonic() + timeout
    while not done(count := int(engine.engine_requests())) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return count


class AbortWatch:
    """Times one abort test against its workload. Use on any event loop:

    watch = await AbortWatch.start(engine, workload)  # engine idle; clock running
    ... submit the workload ...
    await watch.all_in_engine()  # vLLM holds all of it; abort right after
    ... abort ...
    await watch.idle()  # vLLM holds none of it, well before it could have finished
    """

    def __init__(self, engine: Any, workload: Workload) -> None:
        self.engine = engine
        self.workload = workload
        self.started = time.monotonic()
        self.aborted = self.started

    @classmethod
    async def start(cls, engine: Any, workload: Workload) -> AbortWatch:
        # A previous test's leftovers (a broken abort) must not count as this one's; they
        # drain slower than the workload alone ran (their output still flows).
        left = await wait_engine(engine, lambda n: n == 0, timeout=3 * workload.natural)
        assert left == 0, f"{left} engine requests before the test"
        return cls(engine, workload)

    async def all_in_engine(self) -> None:
        deadline = self.started + self.workload.bound
        seen = await wait_engine(self.engine, lambda n: n >= WORKERS, deadline - time.monotonic())
        self.aborted = time.monotonic()
        assert seen >= WORKERS, (
            f"the engine held {seen} of the workload's {WORKERS} requests "
            f"{self.aborted - self.started:.1f} s after its submission"
        )

    async def leave(self, calls: Sequence[asyncio.Task[Any]]) -> None:
        """Once vLLM holds all of the workload (and none of `calls`, its clients' calls,
        has ended by itself), cancel them: every client goes away at once."""
        await self.all_in_engine()
        assert not any(call.done() for call in calls)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    async def idle(self) -> None:
        deadline = self.aborted + self.workload.bound
        left = await wait_engine(self.engine, lambda n: n == 0, deadline - time.monotonic())
        took = time.monotonic() - self.aborted
        assert left == 0, (
            f"{left} engine requests still held {took:.1f} s after the abort; unaborted the "
            f"workload runs {self.workload.natural:.1f} s"
        )
