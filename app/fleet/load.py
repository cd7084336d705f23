"""A steady streaming load through a fleet's front, every request's outcome kept.

`SteadyLoad` runs `streams` clients, each streaming short chat completions one after the
other (with `pause_s` between them) until stopped, on its own event loop in a thread, so
that whoever drives the fleet (a test, `bench/fleet_roll.py`) restarts or kills replicas
meanwhile. Each request is an `Outcome`: when it started and ended, its TTFT, and whether
it failed, as a client sees it: a status other than 200, an error event in the stream, a
stream without its `data: [DONE]`, a transport error, or no end within `timeout_s`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import httpx
import orjson


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic()
    ended: float
    ttft_s: float | None  # None: no content came
    error: str | None  # None: the stream completed


@dataclass
class SteadyLoad:
    url: str  # the front: a router's base URL
    model: str
    streams: int = 3
    max_tokens: int = 16
    pause_s: float = 0.1
    timeout_s: float = 120.0
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self) -> list[Outcome]:
        """Stop after each client's request in flight; every outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 10)
        return self.outcomes

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.streams * 2)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.streams)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            self.outcomes.append(await self._one(client, f"client {index}, request {n}"))
            await asyncio.sleep(self.pause_s)

    async def _one(self, client: httpx.AsyncClient, text: str) -> Outcome:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        started = time.monotonic()
        ttft: float | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                async with client.stream(
                    "POST", f"{self.url}/v1/chat/completions", json=body
                ) as answer:
                    if answer.status_code != 200:
                        body_text = (await answer.aread()).decode(errors="replace")
                        error = f"{answer.status_code}: {body_text[:200]}"
                    else:
                        done = False
                        async for line in answer.aiter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: "):
                                event = orjson.loads(line[6:])
                                if "error" in event:
                                    error = f"error event: {line[:200]}"
                                elif ttft is None and event.get("choices"):
                                    ttft = time.monotonic() - started
                        if error is None and not done:
                            error = "the stream ended without data: [DONE]"
        except (httpx.HTTPError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        return Outcome(started, time.monotonic(), ttft, error)
