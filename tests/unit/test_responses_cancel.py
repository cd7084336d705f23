"""Cancel wins (`app.sessions.stored_responses`): a background response cancelled at any
moment before it has ended ends `cancelled`, its record written last, its admission place
given back and nothing left in the engine; on the deterministic fake engine, one test per
window the cancel can land in:

- queued: the run's task has not taken a step yet (the cancel right after create);
- admitted: the engine holds the request but has not started it (its queue);
- running: tokens are coming;
- ending: the engine has finished and the last record is being written: a cancel from
  this process waits and answers the response as it ended, one from another replica
  (the store's flag) that was raised first wins the write;
- on another replica: the flag in the shared store, read by the owner.

(Rendering is no window: a response is planned before it exists for anyone, its id first
told by the answer to create.) The same on real vLLM across two replicas:
tests/fleet/test_responses_replicas.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from app.admission import Admission
from app.engine.base import GenerationRequest, TokenEvent
from app.protocols.openai.responses.record import StoredResponse
from app.sessions import stored_responses
from app.sessions.responses import Responses
from app.store.sqlite import SqliteStore
from app.telemetry.record import RequestRecord
from schemas.openai_responses import ResponsesRequest
from tests.fake_engine import FakeEngine
from tests.principals import ANYONE

LONG = 400


class GatedEngine(FakeEngine):
    """Holds every request before its first event until `gate` opens: a request the
    engine has taken and not started."""

    def __init__(self) -> None:
        super().__init__(step_delay=0.005)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        self.running.add(request.request_id)
        try:
            self.waiting.set()
            await self.gate.wait()
            async for event in super().generate(request):
                yield event
        finally:
            self.running.discard(request.request_id)


class GatedStore(SqliteStore):
    """Holds the conditional write (a run's last) until `gate` opens."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, ttl_s=60, max_bytes=1 << 22)
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()

    async def put(
        self,
        tenant: str,
        key: str,
        data: bytes,
        *,
        quota: int = 0,
        unless_cancelled: bool = False,
    ) -> bool:
        if unless_cancelled:
            self.holding.set()
            await self.gate.wait()
        return await super().put(tenant, key, data, quota=quota, unless_cancelled=unless_cancelled)


def _body(max_tokens: int = LONG) -> ResponsesRequest:
    return ResponsesRequest.model_validate(
        {"input": "a story", "max_output_tokens": max_tokens, "background": True}
    )


async def _started(responses: Responses, max_tokens: int = LONG) -> dict[str, Any]:
    call = await responses.start(ANYONE, _body(max_tokens), RequestRecord("test", name="test"))
    return await responses.runs.start(ANYONE, call)


async def _record(responses: Responses, response_id: str) -> StoredResponse:
    return await responses.records.load(ANYONE, response_id)


async def _follow(responses: Responses, response_id: str) -> list[Any]:
    return [body async for _, body in await responses.runs.replay(ANYONE, response_id, None)]


def _sqlite(tmp_path: Path) -> SqliteStore:
    return SqliteStore(tmp_path / "r.sqlite3", ttl_s=60, max_bytes=1 << 22)


async def _ends_cancelled(
    responses: Responses, admission: Admission, engine: FakeEngine, response_id: str
) -> dict[str, Any]:
    """Cancel, and check what every window must end with."""
    follower = asyncio.create_task(_follow(responses, response_id))
    await asyncio.sleep(0)
    answer = await responses.runs.cancel(ANYONE, response_id)
    assert answer["status"] == "cancelled", answer
    assert (await _record(responses, response_id)).status == "cancelled"
    events = await asyncio.wait_for(follower, 5)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "cancelled"
    assert not any(e["type"] == "response.completed" for e in events)
    assert admission.in_flight == 0 and not engine.running
    await asyncio.sleep(0.05)  # nothing written after it
    assert (await _record(responses, response_id)).status == "cancelled"
    return answer


async def test_a_cancel_before_the_run_takes_a_step(tmp_path: Path) -> None:
    engine, admission = FakeEngine(step_delay=0.005), Admission(None, None)
    responses = Responses(engine, admission, _sqlite(tmp_path), None)
    queued = await _started(responses)  # its task exists, has not run
    answer = await responses.runs.cancel(ANYONE, queued["id"])
    assert answer["status"] == "cancelled"
    assert engine.requests == []  # it never reached the engine
    assert admission.in_flight == 0
    await asyncio.sleep(0.05)
    assert (await _record(responses, queued["id"])).status == "cancelled"
    await responses.close()


async def test_a_cancel_while_the_engine_holds_it_unstarted(tmp_path: Path) -> None:
    engine, admission = GatedEngine(), Admission(None, None)
    responses = Responses(engine, admission, _sqlite(tmp_path), None)
    queued = await _started(responses)
    await asyncio.wait_for(engine.waiting.wait(), 5)
    assert (await _record(responses, queued["id"])).status == "queued"
    answer = await _ends_cancelled(responses, admission, engine, queued["id"])
    assert answer["usage"]["output_tokens"] == 0
    await responses.close()


async def test_a_cancel_while_it_runs(tmp_path: Path) -> None:
    engine, admission = FakeEngine(step_delay=0.005), Admission(None, None)
    responses = Responses(engine, admission, _sqlite(tmp_path), None)
    queued = await _started(responses)
    for _ in range(500):
        if (await _record(responses, queued["id"])).status == "in_progress":
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # some tokens out
    answer = await _ends_cancelled(responses, admission, engine, queued["id"])
    assert 0 < answer["usage"]["output_tokens"] < LONG
    assert answer["output"][0]["status"] == "incomplete"
    await responses.close()


async def _last_write_held(
    tmp_path: Path,
) -> tuple[Responses, GatedStore, Admission, dict[str, Any]]:
    """A short run whose engine has finished and whose last write the store holds."""
    admission = Admission(None, None)
    store = GatedStore(tmp_path / "r.sqlite3")
    responses = Responses(FakeEngine(), admission, store, None)
    queued = await _started(responses, max_tokens=4)
    await asyncio.wait_for(store.holding.wait(), 5)
    return responses, store, admission, queued


async def test_a_cancel_here_while_the_last_record_is_written_answers_that_end(
    tmp_path: Path,
) -> None:
    responses, store, admission, queued = await _last_write_held(tmp_path)
    cancel = asyncio.create_task(responses.runs.cancel(ANYONE, queued["id"]))
    await asyncio.sleep(0.05)
    assert not cancel.done()  # it waits for the write
    store.gate.set()
    answer = await asyncio.wait_for(cancel, 5)
    assert answer["status"] == "incomplete"  # max_output_tokens: the end it had
    assert (await _record(responses, queued["id"])).response == answer
    assert admission.in_flight == 0
    await responses.close()


async def test_another_replicas_cancel_raised_before_the_last_write_wins_it(
    tmp_path: Path,
) -> None:
    responses, store, admission, queued = await _last_write_held(tmp_path)
    follower = asyncio.create_task(_follow(responses, queued["id"]))
    await store.request_cancel(queued["id"])  # as another replica does
    store.gate.set()
    events = await asyncio.wait_for(follower, 5)
    assert [e["type"] for e in events][-1] == "response.incomplete"
    assert events[-1]["response"]["status"] == "cancelled"
    assert not any(e["type"] == "response.completed" for e in events)
    assert (await _record(responses, queued["id"])).status == "cancelled"
    assert admission.in_flight == 0
    await responses.close()


async def test_a_cancel_on_another_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored_responses, "CANCEL_POLL_S", 0.01)
    engine, admission = FakeEngine(step_delay=0.005), Admission(None, None)
    owner = Responses(engine, admission, _sqlite(tmp_path), None)
    other = Responses(FakeEngine(), Admission(None, None), _sqlite(tmp_path), None)
    queued = await _started(owner)
    await asyncio.sleep(0.05)
    answer = await other.runs.cancel(ANYONE, queued["id"])
    assert answer["status"] == "cancelled"
    assert 0 < answer["usage"]["output_tokens"] < LONG
    await asyncio.sleep(0.05)
    assert admission.in_flight == 0 and not engine.running
    assert (await _record(owner, queued["id"])).status == "cancelled"
    await owner.close()
    await other.close()
