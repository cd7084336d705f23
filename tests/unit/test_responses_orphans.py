"""A background response whose server died (`app.sessions.stored_responses`): a run holds a
lease on its response while it runs; a response still queued or in progress whose lease
has run out ends `failed` with a reason when anyone reads it, and a stream following it
ends. On the fake engine, with the store of another replica played by writes of its own.

How these fail: a dead server's response stays `in_progress` (its stream never ends); a
live run's response is declared dead, or one that ended between its read and the look at
its lease (a cross-replica cancel's `cancelled` overwritten by `failed`); the run's lease
outlives it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from app.admission import Admission
from app.protocols.openai.responses.record import StoredResponse
from app.sessions.responses import Responses
from app.sessions.stored_responses import ORPHANED
from app.store.sqlite import SqliteStore
from app.store.sqlite_batches import SqliteBatches
from app.telemetry.record import RequestRecord
from schemas.openai_responses import ResponsesRequest
from tests.fake_engine import FakeEngine
from tests.principals import ANYONE


def _responses(tmp_path: Path, engine: FakeEngine) -> tuple[Responses, SqliteBatches]:
    leases = SqliteBatches(tmp_path / "b.sqlite3", max_bytes=1 << 20)
    store = SqliteStore(tmp_path / "r.sqlite3", ttl_s=60, max_bytes=1 << 22)
    return Responses(engine, Admission(None, None), store, None, leases=leases, lease_s=5), leases


async def _left_behind(responses: Responses, status: str) -> str:
    """A background response another server wrote `status` and then died."""
    body = {"id": "resp_dead", "object": "response", "status": status, "background": True}
    await responses.records.store.put(
        ANYONE.tenant, "resp_dead", StoredResponse({**body, "output": []}).encode()
    )
    return "resp_dead"


async def _events(responses: Responses, response_id: str) -> list[Any]:
    return [body async for _, body in await responses.runs.replay(ANYONE, response_id, None)]


async def test_a_response_whose_server_died_ends_failed(tmp_path: Path) -> None:
    responses, leases = _responses(tmp_path, FakeEngine())
    dead = await _left_behind(responses, "in_progress")
    now = time.time()
    assert await leases.lease("response:" + dead, owner="dead", now=now - 10, until=now - 1)
    follower = await asyncio.wait_for(_events(responses, dead), 10)
    assert follower[-1]["type"] == "response.failed"
    ended = await responses.runs.current(ANYONE, dead)
    assert ended.status == "failed"
    assert ended.response["error"] == {"code": "server_error", "message": ORPHANED}
    assert await responses.records.store.cancel_requested(dead)  # a slow owner cannot write
    cancelled = await responses.runs.cancel(ANYONE, dead)
    assert cancelled["status"] == "failed"
    await responses.close()
    await leases.close()


async def test_a_response_whose_server_lives_is_left_running(tmp_path: Path) -> None:
    responses, leases = _responses(tmp_path, FakeEngine())
    alive = await _left_behind(responses, "queued")
    now = time.time()
    assert await leases.lease("response:" + alive, owner="other", now=now, until=now + 60)
    assert (await responses.runs.current(ANYONE, alive)).status == "queued"
    assert not await responses.records.store.cancel_requested(alive)
    await responses.close()
    await leases.close()


async def test_a_run_that_ended_after_its_record_was_read_is_not_declared_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    responses, leases = _responses(tmp_path, FakeEngine())
    running = await _left_behind(responses, "in_progress")
    now = time.time()
    assert await leases.lease("response:" + running, owner="other", now=now, until=now + 60)
    looked = leases.leased

    async def owner_ends_first(key: str, now: float) -> bool:
        # The other replica's run ends just before the lease is looked at: its last
        # record, then its lease let go (the order a run keeps).
        body = {"id": running, "object": "response", "status": "cancelled", "background": True}
        await responses.records.store.put(
            ANYONE.tenant, running, StoredResponse({**body, "output": []}).encode()
        )
        await leases.unlease(key, owner="other")
        return await looked(key, now)

    monkeypatch.setattr(leases, "leased", owner_ends_first)
    assert (await responses.runs.current(ANYONE, running)).status == "cancelled"
    assert (await responses.records.load(ANYONE, running)).status == "cancelled"
    assert not await responses.records.store.cancel_requested(running)
    await responses.close()
    await leases.close()


async def test_a_run_holds_its_lease_until_it_ends(tmp_path: Path) -> None:
    engine = FakeEngine(step_delay=0.002)
    responses, leases = _responses(tmp_path, engine)
    body = ResponsesRequest.model_validate(
        {"model": "fake", "input": "a story", "max_output_tokens": 200, "background": True}
    )
    record = RequestRecord("req", name="POST /v1/responses")
    queued = await responses.runs.start(ANYONE, await responses.start(ANYONE, body, record))
    key = "response:" + queued["id"]
    assert await leases.leased(key, time.time())
    events = await asyncio.wait_for(_events(responses, queued["id"]), 10)
    assert events[-1]["type"] == "response.incomplete"  # at max_output_tokens
    await asyncio.sleep(0.05)  # the run's last step: its lease ended
    assert not await leases.leased(key, time.time())
    assert (await responses.runs.current(ANYONE, queued["id"])).status == "incomplete"
    await responses.close()
    await leases.close()
