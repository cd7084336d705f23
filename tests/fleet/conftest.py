"""The fleet's fixture (tests/fleet_setup.py builds and launches it) and what its tests
read off the replicas: which replica served what, by vLLM's and admission's own counters
on each replica's /metrics (the routers do not say where they sent a request)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from app.fleet.fleet import Fleet
from tests.conftest import LIVE_MODEL


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    from tests.fleet_setup import started, stop

    try:
        yield started()
    finally:
        stop()


def admitted(fleet: Fleet, protocol: str) -> list[float]:
    """Each replica's count of admitted units of work of `protocol`."""
    return [r.metric("switchboard_admitted_total", protocol=protocol) for r in fleet.replicas]


def stream_whole(client: openai.OpenAI, max_tokens: int) -> str:
    """A streamed chat through a front, every token carried to its usage chunk; its text."""
    chunks = list(
        client.chat.completions.create(
            model=LIVE_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == max_tokens
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
