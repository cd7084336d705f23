"""`BatchGate`: lets a request that must not share an engine step with another run alone.

Why it exists: vLLM 0.32's CPU LoRA path (`PunicaWrapperCPU.add_lora_logits`, used
whenever the engine runs with `--enable-lora`, adapter or not) maps logits rows to
adapters with one index per request in the batch, while prompt logprobs hand it one row
per prompt token. A request asking for prompt logprobs batched with any other request
fails the worker ("The expanded size of the tensor (1) must match the existing size (3)")
and the engine core dies: every later request answers 503 until a restart. Alone in its
batch, the one index broadcasts over every row, which is also the right adapter. Found by
the fuzz suite (tests/fuzz); `VllmEngine` holds the gate only where that path runs.

Invariants:
- While an exclusive holder runs, no other holder is admitted.
- An exclusive arrival waits for every shared holder to leave; shared arrivals queue
  behind a waiting exclusive one, so a steady stream of requests cannot starve it.
- Leaving never awaits (`release` is synchronous), so a cancelled holder cannot leave the
  gate closed; a waiter cancelled before entering leaves no trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class BatchGate:
    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while True:
            changed = self._changed  # taken before the check: no await in between
            if ready():
                return
            await changed.wait()

    async def enter(self, exclusive: bool) -> Callable[[], None]:
        """Wait for admission; returns the (synchronous) release."""
        if exclusive:
            self._waiting_exclusive += 1
            try:
                await self._until(lambda: not self._exclusive and self._shared == 0)
            finally:
                self._waiting_exclusive -= 1
                self._notify()  # shared arrivals queued behind this one may go now
            self._exclusive = True
        else:
            await self._until(lambda: not self._exclusive and self._waiting_exclusive == 0)
            self._shared += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            if exclusive:
                self._exclusive = False
            else:
                self._shared -= 1
            self._notify()

        return release
