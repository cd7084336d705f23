"""Admission on the live server (real vLLM, the tiny model): a burst of 4x the bound on
every protocol at once, the same over native gRPC (Salience Generate, Evergreen
StartSession: refusals are UNAVAILABLE with retry info), and priority.

The bound is set on the live app's `Admission` for each test and restored afterwards (no
second engine). The tiny model starts a request within milliseconds and vLLM's CPU build
runs up to 128 at once, so a queue of real requests never builds here by itself: each
test holds `bound - 1` tickets of its own (standing for requests that wait) so that the
burst meets a full queue; the requests the burst gets admitted run on real vLLM.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import websockets
from google.protobuf import json_format

from app.admission import Admission, ProtocolName, Ticket
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as salience_pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.evergreen_client import outcome as evergreen_outcome
from tests.evergreen_frames import abort_status, turn
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.grpc_retry import retry_after_s
from tests.salience_client import open_and_generate

pytestmark = pytest.mark.e2e

BOUND = 4
BURST = 4 * BOUND


@contextmanager
def bounded(live: Any, held: int, priority: int = 0) -> Iterator[Admission]:
    """The live app's admission at `BOUND` queued requests, `held` of them taken by the
    test; restored (and the tickets given back) afterwards."""
    admission: Admission = live.app.state.admission

    async def hold() -> list[Ticket]:
        admission.max_requests = BOUND
        return [admission.admit(ProtocolName.ANTHROPIC, priority=priority) for _ in range(held)]

    async def restore(tickets: list[Ticket], saved: int | None) -> None:
        for ticket in tickets:
            ticket.release()
        admission.max_requests = saved

    saved = admission.max_requests
    tickets = live.call(hold())
    try:
        yield admission
    finally:
        live.call(restore(tickets, saved))


def strings(values: list[str]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


async def _openai(client: httpx.AsyncClient, live: Any, i: int) -> tuple[str, int, Any]:
    body = {"model": live.model, "prompt": f"burst {i}", "max_tokens": 8, "temperature": 0}
    response = await client.post(f"{live.base_url}/v1/completions", json=body)
    if response.status_code == 200:
        return "openai", 200, response.json()["choices"][0]["finish_reason"]
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "overloaded" and "retry after" in error["message"]
    return "openai", 503, None


async def _graphpipe(client: httpx.AsyncClient, live: Any, i: int) -> tuple[str, int, Any]:
    call = Infer([strings([f"burst {i}"])], config='{"max_tokens": 8, "temperature": 0}')
    response = await client.post(f"{live.base_url}/graphpipe", content=infer_request(call))
    assert response.headers["content-type"] == "application/octet-stream"
    answer = read_infer_response(response.content)
    if response.status_code == 200:
        assert answer.errors == []
        return "graphpipe", 200, answer.outputs[0].tolist()
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    [(code, message)] = answer.errors
    assert code == 503 and "retry after" in message
    return "graphpipe", 503, None


async def _evergreen(client: httpx.AsyncClient, live: Any, i: int) -> tuple[str, int, Any]:
    async with websockets.connect(f"{live.ws_url}/evergreen/ws") as ws:
        await ws.send(json.dumps(turn(f"burst {i}", 8, temperature=0)))
        kind, outcome = await evergreen_outcome(ws)
    if kind == "text":
        return "evergreen", 200, outcome
    assert kind == "abort", (kind, outcome)
    status, code = outcome
    assert status["code"] == "UNAVAILABLE" and status["retry_after_s"] >= 1
    assert "retry after" in status["message"] and code == 4014
    return "evergreen", 503, None


async def salience_outcome(ws: Any, call_id: str) -> tuple[str, Any]:
    """("done", finish reason) or ("error", the error) for `call_id`."""
    while True:
        reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=120))
        if "error" in reply:
            assert reply["id"] in (call_id, ""), reply
            return "error", reply["error"]
        assert reply["id"] == call_id
        if "done" in reply["event"]:
            return "done", reply["event"]["done"].get("finishReason")


async def _salience(client: httpx.AsyncClient, live: Any, i: int) -> tuple[str, int, Any]:
    async with websockets.connect(f"{live.ws_url}/salience/ws") as ws:
        await open_and_generate(ws, live.model, "g", [5 + i, 6, 7], 8)
        kind, outcome = await salience_outcome(ws, "g")
    if kind == "done":
        return "salience", 200, outcome
    assert outcome["code"] == "UNAVAILABLE" and "retry after" in outcome["message"]
    return "salience", 503, None


def _check_counts(
    outcomes: list[Any], before: dict[str, Any], after: dict[str, Any], names: Sequence[str]
) -> None:
    """Each protocol's share of a burst of BURST calls against a full queue: every call
    admitted (200) or refused (503), some refused, and the admission's counters moved by
    exactly as many."""
    for name in names:
        mine = [o for o in outcomes if o[0] == name]
        admitted = [o for o in mine if o[1] == 200]
        refused = [o for o in mine if o[1] == 503]
        assert len(admitted) + len(refused) == BURST
        assert refused, f"{name}: the burst met a full queue, something must be refused"
        assert after["refused"].get(name, 0) - before["refused"].get(name, 0) == len(refused)
        assert after["admitted"].get(name, 0) - before["admitted"].get(name, 0) == len(admitted)


def _burst(live: Any, calls: list[Any]) -> list[tuple[str, int, Any]]:
    async def run() -> list[tuple[str, int, Any]]:
        limits = httpx.Limits(max_connections=4 * BURST)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            return list(await asyncio.gather(*(call(client, live, i) for i, call in calls)))

    return asyncio.run(run())


def test_a_burst_of_four_times_the_bound_on_every_protocol(live_server: Any) -> None:
    live = live_server
    protocols = [_openai, _graphpipe, _evergreen, _salience]
    calls = [(i, protocol) for i in range(BURST) for protocol in protocols]
    with bounded(live, held=BOUND - 1) as admission:
        before = live.call(_counts(admission))
        outcomes = _burst(live, calls)
        after = live.call(_counts(admission))
        metrics = httpx.get(f"{live.base_url}/metrics").text
    names = ("openai", "graphpipe", "evergreen", "salience")
    _check_counts(outcomes, before, after, names)
    for name in names:
        assert f'switchboard_refused_total{{protocol="{name}"}}' in metrics
    # The one free slot admits some of the burst (whichever protocol comes first), and
    # what is admitted completes.
    assert any(o[1] == 200 for o in outcomes)
    assert all(o[2] is not None for o in outcomes if o[1] == 200)
    assert after["in_flight"] == BOUND - 1  # only the test's own tickets
    assert after["queued"] == {"anthropic": BOUND - 1}
    assert live.wait_idle() == 0


def grpc_refusal(error: grpc.aio.AioRpcError) -> int:
    """The retry hint of a gRPC refusal (asserting it is one: UNAVAILABLE, retry info)."""
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    retry = retry_after_s(error)
    assert retry is not None and retry >= 1, error.trailing_metadata()
    return retry


async def _grpc_salience(channel: grpc.aio.Channel, live: Any, i: int) -> tuple[str, int, Any]:
    stub = salience_grpc.SalienceStub(channel)
    opened = await stub.OpenSession(salience_pb.OpenSessionRequest(model=live.model), timeout=60)
    request = salience_pb.GenerateRequest(
        session_id=opened.session_id, append_tokens=[5 + i, 6, 7], max_tokens=8
    )
    try:
        events = [event async for event in stub.Generate(request, timeout=120)]
    except grpc.aio.AioRpcError as error:
        grpc_refusal(error)
        assert "retry after" in (error.details() or "")
        return "salience", 503, None
    finally:
        await stub.CloseSession(salience_pb.CloseSessionRequest(session_id=opened.session_id))
    return "salience", 200, events[-1].done.finish_reason


async def _grpc_evergreen(channel: grpc.aio.Channel, live: Any, i: int) -> tuple[str, int, Any]:
    message = json_format.ParseDict(
        turn(f"burst {i}", 8, temperature=0), service_pb.SessionMessage()
    )
    call = evergreen_grpc.EvergreenServiceStub(channel).StartSession(iter([message]), timeout=120)
    replies = []
    try:
        async for reply in call:
            replies.append(reply)
    except grpc.aio.AioRpcError as error:
        retry = grpc_refusal(error)
        fields = abort_status(replies[-1])
        assert fields["code"] == "UNAVAILABLE" and fields["retry_after_s"] == retry
        return "evergreen", 503, None
    text = b"".join(f.chunk_fragment.data for r in replies for f in r.node_fragments)
    return "evergreen", 200, text.decode()


def test_a_burst_of_four_times_the_bound_over_grpc(live_server: Any) -> None:
    live = live_server
    calls = [(i, call) for i in range(BURST) for call in (_grpc_salience, _grpc_evergreen)]

    async def burst() -> list[tuple[str, int, Any]]:
        async with grpc.aio.insecure_channel(live.grpc_target) as channel:
            return list(await asyncio.gather(*(call(channel, live, i) for i, call in calls)))

    with bounded(live, held=BOUND - 1) as admission:
        before = live.call(_counts(admission))
        outcomes = asyncio.run(burst())
        after = live.call(_counts(admission))
    _check_counts(outcomes, before, after, ("salience", "evergreen"))
    assert any(o[1] == 200 for o in outcomes)
    assert all(o[2] for o in outcomes if o[1] == 200)  # a finish reason, a response text
    assert after["in_flight"] == BOUND - 1  # only the test's own tickets
    assert after["queued"] == {"anthropic": BOUND - 1}
    assert live.wait_idle() == 0


async def _counts(admission: Admission) -> dict[str, Any]:
    return {
        "admitted": dict(admission.admitted),
        "refused": dict(admission.refused),
        "in_flight": admission.in_flight,
        "queued": dict(admission.queued()),
    }


def test_a_higher_priority_request_is_admitted_while_lower_priority_ones_wait(
    live_server: Any,
) -> None:
    """The queue full of priority-5 work: priority 5 is refused, the default priority 0
    (it runs first) is admitted and completes, and the server stays ready for it."""
    live = live_server
    url = f"{live.base_url}/v1/completions"
    body = {"model": live.model, "prompt": "priority", "max_tokens": 4}
    with bounded(live, held=BOUND, priority=5):
        low = httpx.post(url, json={**body, "priority": 5}, timeout=60)
        assert low.status_code == 503 and low.headers["retry-after"]
        assert httpx.get(f"{live.base_url}/ready", timeout=60).status_code == 200
        high = httpx.post(url, json={**body, "priority": 0}, timeout=60)
        assert high.status_code == 200, high.text
        assert high.json()["choices"][0]["finish_reason"] == "length"
    with bounded(live, held=BOUND, priority=0):
        assert httpx.get(f"{live.base_url}/ready", timeout=60).status_code == 503
    assert live.wait_idle() == 0
