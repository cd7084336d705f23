"""The Salience websocket over the fake engine: concurrent calls on one socket, cancel,
busy sessions, disconnects, failed calls rolled back, binary Generate streams.

Some tests drive the ASGI app directly through `tests.asgi_wire.Wire`, whose inbox can
hold several frames at once: the route then reads them back to back without yielding to
the event loop, as it does when a burst arrives in one TCP read.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from starlette.testclient import TestClient

from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError
from app.main import create_app
from schemas import salience_pb2 as pb
from schemas import salience_ws_pb2 as ws_pb
from tests.asgi_wire import Wire
from tests.fake_engine import FakeEngine
from tests.salience_client import dump, gen

WS = "/salience/ws"


async def test_cancel_in_the_same_burst_as_its_generate_still_ends_the_call() -> None:
    engine = FakeEngine(step_delay=0.01)
    wire = Wire(create_app(Settings(model="fake"), engine=engine), WS)
    sid = await wire.open_session()
    wire.send(
        gen("g", sessionId=sid, appendTokens=[65, 66], maxTokens=50),
        {"id": "g", "cancel": True},
        dump("d", sid),
    )
    # The Generate was applied in frame order, before the DumpSession.
    assert await wire.recv() == {"id": "d", "response": {"tokens": [65, 66]}}
    done = await wire.recv()
    assert done["id"] == "g"
    assert done["event"]["done"]["finishReason"] == "FINISH_REASON_CANCELLED"
    assert engine.running == set()
    wire.send(gen("again", sessionId=sid, offset=2, maxTokens=1))  # not busy any more
    assert (await wire.recv())["event"]["token"] == {"id": 67, "position": 2}
    await wire.disconnect()


async def test_disconnect_aborts_the_generate_and_keeps_the_session() -> None:
    engine = FakeEngine(step_delay=0.01)
    app = create_app(Settings(model="fake"), engine=engine)
    wire = Wire(app, WS)
    sid = await wire.open_session()
    wire.send(gen("g", sessionId=sid, appendTokens=[1, 2, 3], maxTokens=400))
    for _ in range(3):
        assert "token" in (await wire.recv())["event"]
    await wire.disconnect()
    assert engine.running == set()  # the handler returned only after the abort
    again = Wire(app, WS)
    again.send(dump("d", sid))
    tokens = (await again.recv())["response"]["tokens"]
    assert tokens[:3] == [1, 2, 3] and 6 <= len(tokens) < 403
    # Free again: the next call goes on from the session's real length.
    again.send(gen("g2", sessionId=sid, offset=len(tokens), maxTokens=1))
    assert (await again.recv())["event"]["token"]["position"] == len(tokens)
    await again.disconnect()


async def test_close_session_cancels_its_generate_and_is_idempotent() -> None:
    engine = FakeEngine(step_delay=0.01)
    wire = Wire(create_app(Settings(model="fake"), engine=engine), WS)
    sid = await wire.open_session()
    wire.send(gen("g", sessionId=sid, appendTokens=[1], maxTokens=400))
    assert "token" in (await wire.recv())["event"]
    wire.send(gen("busy", sessionId=sid, offset=1))
    busy = await wire.recv()
    while busy["id"] == "g":
        busy = await wire.recv()
    assert busy["id"] == "busy" and busy["error"]["code"] == "ABORTED"
    wire.send({"id": "c", "method": "CloseSession", "request": {"sessionId": sid}})
    replies = [await wire.recv()]
    while "done" not in replies[-1].get("event", {}):
        replies.append(await wire.recv())
    assert replies[-1]["event"]["done"]["finishReason"] == "FINISH_REASON_CANCELLED"
    assert {"id": "c", "response": {}} in replies
    wire.send({"id": "c2", "method": "CloseSession", "request": {"sessionId": sid}}, dump("d", sid))
    assert await wire.recv() == {"id": "c2", "response": {}}
    assert (await wire.recv())["error"]["code"] == "NOT_FOUND"
    assert engine.running == set()
    await wire.disconnect()


async def test_concurrent_generates_on_one_socket() -> None:
    engine = FakeEngine(step_delay=0.005)
    wire = Wire(create_app(Settings(model="fake"), engine=engine), WS)
    a, b = await wire.open_session(), await wire.open_session()
    wire.send(
        gen("a", sessionId=a, appendTokens=[10], maxTokens=5),
        gen("b", sessionId=b, appendTokens=[100, 101], maxTokens=5),
    )
    streams: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    while not all(s and "done" in s[-1] for s in streams.values()):
        reply = await wire.recv()
        streams[reply["id"]].append(reply["event"])
    assert [e["token"]["id"] for e in streams["a"][:-1]] == [11, 12, 13, 14, 15]
    assert [e["token"]["position"] for e in streams["b"][:-1]] == [2, 3, 4, 5, 6]
    assert streams["b"][-1]["done"] == {
        "promptTokens": 2,
        "completionTokens": 5,
        "totalTokens": 7,
        "finishReason": "FINISH_REASON_LENGTH",
    }
    await wire.disconnect()


class FailingEngine(FakeEngine):
    """Fails a request once it has yielded `fail_after` decoded tokens (None: never)."""

    fail_after: int | None = None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        if self.fail_after == 0:
            raise EngineError("engine fell over")
        produced = 0
        async for event in super().generate(request):
            yield event
            produced += len(event.token_ids)
            if self.fail_after is not None and produced >= self.fail_after:
                raise EngineError("engine fell over")


async def until(wire: Wire, key: str) -> list[dict[str, Any]]:
    """The replies up to the first carrying `key` ("error") or a done event ("done")."""
    replies = [await wire.recv()]
    while key not in replies[-1] and key not in replies[-1].get("event", {}):
        replies.append(await wire.recv())
    return replies


async def test_a_generate_failing_before_its_first_token_is_rolled_back() -> None:
    engine = FailingEngine()
    wire = Wire(create_app(Settings(model="fake"), engine=engine), WS)
    sid = await wire.open_session()
    wire.send(gen("g0", sessionId=sid, appendTokens=[1, 2, 3], maxTokens=2))
    await until(wire, "done")
    engine.fail_after = 0
    # Truncating to 1 and appending: the client gets an error, so the session must be
    # what the client still believes, [1, 2, 3, 4, 5], truncated tail included.
    wire.send(gen("g1", sessionId=sid, appendTokens=[9, 9], offset=1, truncating=True, maxTokens=3))
    assert await until(wire, "error") == [
        {"id": "g1", "error": {"code": "INTERNAL", "message": "engine fell over"}}
    ]
    wire.send(dump("d", sid))
    assert (await wire.recv())["response"]["tokens"] == [1, 2, 3, 4, 5]
    await wire.disconnect()


async def test_tokens_streamed_before_a_failure_stay_in_the_session() -> None:
    engine = FailingEngine()
    engine.fail_after = 2
    wire = Wire(create_app(Settings(model="fake"), engine=engine), WS)
    sid = await wire.open_session()
    wire.send(gen("g", sessionId=sid, appendTokens=[1, 2], maxTokens=5))
    replies = await until(wire, "error")
    assert [r["event"]["token"]["id"] for r in replies[:-1]] == [3, 4]
    assert replies[-1]["error"]["code"] == "INTERNAL"
    wire.send(dump("d", sid))
    assert (await wire.recv())["response"]["tokens"] == [1, 2, 3, 4]
    await wire.disconnect()


def test_binary_generate_stream_and_errors_in_the_callers_encoding() -> None:
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    with TestClient(app) as client, client.websocket_connect("/salience/ws") as ws:

        def call(frame: ws_pb.ClientFrame) -> ws_pb.ServerFrame:
            ws.send_bytes(frame.SerializeToString())
            return ws_pb.ServerFrame.FromString(ws.receive_bytes())

        opened = call(ws_pb.ClientFrame(id="o", open_session=pb.OpenSessionRequest(model="fake")))
        sid = opened.open_session.session_id
        request = pb.GenerateRequest(
            session_id=sid, append_tokens=[40, 41, 42], max_tokens=2, logprob_top_k=2
        )
        request.logprobs_ranges.add(start=2, end=4)
        first = call(ws_pb.ClientFrame(id="g", generate=request))
        events = [first.event]
        while events[-1].WhichOneof("event") != "done":
            frame = ws_pb.ServerFrame.FromString(ws.receive_bytes())
            assert frame.id == "g"
            events.append(frame.event)
        prefill, decoded, covered_decode, done = events
        assert (prefill.token.position, prefill.token.is_prefill) == (2, True)
        assert prefill.token.has_sampled_logprob and len(prefill.token.logprobs) == 2
        assert (decoded.token.id, decoded.token.position, decoded.token.is_prefill) == (
            43,
            3,
            False,
        )
        assert decoded.token.has_sampled_logprob and [t.id for t in decoded.token.logprobs] == [
            43,
            44,
        ]
        # Position 4 is outside logprobs_ranges: no logprob.
        assert covered_decode.token.position == 4 and not covered_decode.token.has_sampled_logprob
        assert done.done.total_tokens == 5
        drift = call(ws_pb.ClientFrame(id="x", generate=pb.GenerateRequest(session_id=sid)))
        assert drift.id == "x" and drift.error.code == "FAILED_PRECONDITION"
        missing = call(ws_pb.ClientFrame(id="y", dump_session=pb.DumpSessionRequest()))
        assert missing.error.code == "NOT_FOUND"
        # JSON and binary calls share the socket; each is answered in its own encoding.
        ws.send_json(dump("j", sid))
        assert ws.receive_json() == {"id": "j", "response": {"tokens": [40, 41, 42, 43, 44]}}


def test_context_and_session_limits_over_the_socket() -> None:
    settings = Settings(model="fake", salience_max_sessions=1, salience_max_session_tokens=8)
    app = create_app(settings, engine=FakeEngine(max_model_len=16))
    with TestClient(app) as client, client.websocket_connect("/salience/ws") as ws:
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        evicted = ws.receive_json()["response"]["sessionId"]
        # At the cap, a new session evicts the least recently used idle one.
        ws.send_json({"id": "o2", "method": "OpenSession", "request": {"model": "fake"}})
        sid = ws.receive_json()["response"]["sessionId"]
        ws.send_json(dump("gone", evicted))
        assert ws.receive_json()["error"]["code"] == "NOT_FOUND"
        ws.send_json(gen("g", sessionId=sid, appendTokens=[1] * 6, maxTokens=3))
        assert ws.receive_json()["error"]["code"] == "RESOURCE_EXHAUSTED"
        ws.send_json(dump("d", sid))
        assert ws.receive_json() == {"id": "d", "response": {}}  # nothing was appended


def test_metrics_count_evictions_and_the_sessions_held() -> None:
    """/metrics reads the lifecycle: zeros before any session, then one eviction at a cap
    of one, one session holding the tokens of its Generate. Fails if a family is missing
    or not read from the app's sessions."""
    settings = Settings(model="fake", salience_max_sessions=1)
    app = create_app(settings, engine=FakeEngine())

    def metric(client: TestClient, line: str) -> float:
        body = client.get("/metrics").text
        [value] = [row.split()[-1] for row in body.splitlines() if row.startswith(line + " ")]
        return float(value)

    evicted = 'switchboard_sessions_evicted_total{protocol="salience",reason="cap"}'
    held = 'switchboard_sessions{protocol="salience"}'
    tokens = 'switchboard_session_tokens{protocol="salience"}'
    with TestClient(app) as client:
        assert (metric(client, evicted), metric(client, held), metric(client, tokens)) == (0, 0, 0)
        with client.websocket_connect("/salience/ws") as ws:
            for call in ("a", "b"):
                ws.send_json({"id": call, "method": "OpenSession", "request": {"model": "fake"}})
                sid = ws.receive_json()["response"]["sessionId"]
            ws.send_json(gen("g", sessionId=sid, appendTokens=[1, 2, 3]))
            assert "done" in ws.receive_json()["event"]
        assert (metric(client, evicted), metric(client, held), metric(client, tokens)) == (1, 1, 3)


def test_a_request_that_is_not_an_object_is_invalid_and_the_socket_survives() -> None:
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    with TestClient(app) as client, client.websocket_connect("/salience/ws") as ws:
        for request in (5, True, "x", [1]):
            ws.send_json({"id": "r", "method": "OpenSession", "request": request})
            assert ws.receive_json()["error"]["code"] == "INVALID_ARGUMENT"
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        assert "sessionId" in ws.receive_json()["response"]


async def test_closing_a_session_from_another_socket_aborts_its_generate() -> None:
    engine = FakeEngine(step_delay=0.01)
    app = create_app(Settings(model="fake"), engine=engine)
    first, second = Wire(app, WS), Wire(app, WS)
    sid = await first.open_session()
    first.send(gen("g", sessionId=sid, appendTokens=[1], maxTokens=400))
    assert "token" in (await first.recv())["event"]
    second.send({"id": "c", "method": "CloseSession", "request": {"sessionId": sid}})
    assert await second.recv() == {"id": "c", "response": {}}
    replies = await until(first, "done")
    assert replies[-1]["event"]["done"]["finishReason"] == "FINISH_REASON_CANCELLED"
    assert len(replies) < 100 and engine.running == set()
    await first.disconnect()
    await second.disconnect()
