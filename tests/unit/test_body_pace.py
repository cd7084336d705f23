"""Big bodies are taken at a bounded pace per client (`app.routes.body_pace`). Fails if
a body within its client's burst waits, if a client's flood is taken faster than the
pace, if one client's flood delays another client's body, if a client's bodies pass each
other, if the buckets of clients gone quiet are kept, or if a live server reads a big
body past its client's pace (an HTTP body, a Responses websocket frame)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from starlette.testclient import TestClient

from app.config import Settings
from app.main import create_app
from app.routes.body_pace import QUANTUM, BodyPace
from app.routes.body_worker import IN_CHILD_BYTES
from tests.fake_engine import FakeEngine

MIB = 1 << 20
ENDS = {"response.completed", "response.incomplete", "response.failed", "error"}


class _Clock:
    """A clock that moves only when the pace sleeps, each sleep recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def _pace(clock: _Clock, rate: float = MIB, burst: float = 4 * MIB) -> BodyPace:
    return BodyPace(rate, burst=burst, clock=clock, sleep=clock.sleep)


async def test_a_body_within_its_clients_burst_never_waits() -> None:
    clock = _Clock()
    pace = _pace(clock)
    await pace.pay("a", 4 * MIB)
    assert clock.slept == []
    clock.now += 4.0  # the bucket is full again
    await pace.pay("a", 4 * MIB)
    assert clock.slept == []


async def test_a_flood_is_taken_at_the_pace() -> None:
    clock = _Clock()
    pace = _pace(clock)
    for _ in range(5):  # 20 MiB back to back at 1 MiB/s: 4 of the burst, 16 paced
        await pace.pay("a", 4 * MIB)
    assert sum(clock.slept) == pytest.approx(16.0)
    assert max(clock.slept) <= QUANTUM / MIB + 1e-9  # a quantum at a time


async def test_one_clients_flood_never_delays_another_clients_body() -> None:
    clock = _Clock()
    pace = _pace(clock)
    flood = asyncio.ensure_future(pace.pay("hostile", 32 * MIB))
    while not clock.slept:  # the flood is past its burst, waiting
        await asyncio.sleep(0)
    before = len(clock.slept)
    await pace.pay("honest", 4 * MIB)
    assert not flood.done()
    # Only the flood's sleeps went by meanwhile: the honest body's own bucket was full.
    assert clock.now - 100.0 == pytest.approx(sum(clock.slept))
    assert len(clock.slept) - before <= 1
    await flood


async def test_a_clients_bodies_are_taken_in_the_order_they_came() -> None:
    clock = _Clock()
    pace = _pace(clock)
    done: list[str] = []

    async def body(name: str) -> None:
        await pace.pay("a", 6 * MIB)
        done.append(name)

    await asyncio.gather(body("first"), body("second"), body("third"))
    assert done == ["first", "second", "third"]
    assert sum(clock.slept) == pytest.approx(14.0)


async def test_the_buckets_of_clients_gone_quiet_are_forgotten() -> None:
    clock = _Clock()
    pace = _pace(clock)
    for client in range(100):
        await pace.pay(client, 2 * MIB)
    assert len(pace._buckets) == 100  # none full again yet
    clock.now += 2.0  # each 2 MiB short of full at 1 MiB/s: full again now
    await pace.pay("next", QUANTUM)
    assert list(pace._buckets) == ["next"]


def _app(rate: int) -> TestClient:
    """A server at `rate`; its lifespan (the client's `with`) closes the body worker."""
    settings = Settings(model="fake", big_body_bytes_per_s=rate)
    return TestClient(create_app(settings, engine=FakeEngine(max_model_len=1 << 24)))


def _chat(size: int) -> dict[str, object]:
    content = "y" * size
    return {"model": "fake", "messages": [{"role": "user", "content": content}], "max_tokens": 1}


def test_a_live_servers_big_bodies_are_read_at_their_clients_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 256 KiB/s (a bucket of a MiB, the least there is): three bodies of 512 KiB take
    no less than 2 s (unpaced: a few tenths); a small body meanwhile is not held, and a
    body the children do not parse is not paced."""
    client = _app(256 << 10)
    start = time.monotonic()
    with client:
        for _ in range(2):
            answer = client.post("/v1/chat/completions", json=_chat(512 << 10))
            assert answer.status_code == 200, answer.text
        with ThreadPoolExecutor(1) as thread:
            paced = thread.submit(client.post, "/v1/chat/completions", json=_chat(512 << 10))
            small = client.post("/v1/chat/completions", json=_chat(16))
            assert small.status_code == 200 and not paced.done()
            assert paced.result().status_code == 200
        assert time.monotonic() - start >= 1.9
        pace: BodyPace = client.app.state.objects.body_pace  # type: ignore[attr-defined]
        taken: list[int] = []
        take = pace.take

        async def watched(who: Hashable, size: int) -> None:
            taken.append(size)
            await take(who, size)

        monkeypatch.setattr(pace, "take", watched)
        answer = client.post("/v1/chat/completions", json=_chat(IN_CHILD_BYTES - 512))
        assert answer.status_code == 200 and taken == []
        answer = client.post("/v1/chat/completions", json=_chat(IN_CHILD_BYTES))
        assert answer.status_code == 200 and sum(taken) > IN_CHILD_BYTES


def test_a_big_responses_websocket_frame_waits_for_its_clients_pace() -> None:
    client = _app(256 << 10)
    frame = {"type": "response.create", "model": "fake", "max_output_tokens": 1}
    text = orjson.dumps({**frame, "input": "y" * (512 << 10)}).decode()
    start = time.monotonic()
    with client, client.websocket_connect("/v1/responses") as socket:
        for _ in range(3):  # 1.5 MiB: a MiB of the burst, 512 KiB paced
            socket.send_text(text)
            while (event := socket.receive_json())["type"] not in ENDS:
                pass
            assert event["type"] in {"response.completed", "response.incomplete"}, event
        assert time.monotonic() - start >= 1.9
