"""Waiting for a condition in a test, always with a deadline: a condition that never holds
fails the test with what it waited for, rather than hanging it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.01


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll `condition` on the event loop until it holds; fail after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"waited {timeout:.0f} s for {what}") from None


def until_sync(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """`until` for a test that runs no event loop of its own (it drives a server in a
    thread): poll, sleeping; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(POLL_S)
