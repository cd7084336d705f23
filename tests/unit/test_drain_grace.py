"""The drain's grace (`Drain(grace_s=...)`): its `run` returns, and so the listener
closes, no sooner than the grace after `begin`, however soon the work in flight ends;
the work's own ending is not held up by it."""

from __future__ import annotations

import asyncio
import time

from app.admission import Admission
from app.drain import Drain

GRACE_S = 0.3


async def _abort(request_id: str) -> None:
    raise AssertionError(f"nothing was in flight to abort: {request_id}")


async def test_the_drain_returns_no_sooner_than_its_grace() -> None:
    drain = Drain(Admission(None, None), timeout_s=5.0, grace_s=GRACE_S)
    began = time.monotonic()
    drain.begin()
    await asyncio.sleep(GRACE_S / 2)  # the grace runs from begin, not from run
    await drain.run(_abort)
    assert time.monotonic() - began >= GRACE_S


async def test_without_a_grace_an_idle_drain_returns_at_once() -> None:
    drain = Drain(Admission(None, None), timeout_s=5.0)
    began = time.monotonic()
    await drain.run(_abort)
    assert time.monotonic() - began < GRACE_S  # a lower bound of the test above, not a timing
