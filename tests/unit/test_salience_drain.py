"""The drain on Salience, on the fake engine. Over gRPC as on the websocket: once the
drain has begun every new call (unary ones included) is refused UNAVAILABLE with the
retry hint, as a new socket is, and a Generate still running at the drain's goodbyes
ends the same way. On a socket already open, no new session is opened (the lifecycle's
rule), while the sessions held stay usable until the goodbye.

How they fail if the behaviour breaks: without the refusal at the gRPC door, the unary
calls succeed while draining (as they did); without the goodbye, the stuck Generate below
is never ended by the drain and its call runs into its deadline (DEADLINE_EXCEEDED, no
retry hint) instead of UNAVAILABLE; without the lifecycle's drain, the open socket's
OpenSession succeeds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from app import drain as drain_module
from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.main import create_app
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import free_port
from tests.fake_engine import FakeEngine
from tests.grpc_retry import retry_after_s


class StuckEngine(FakeEngine):
    """Yields one token, then never another, and ignores abort: a request the drain's cut
    cannot end, so only the goodbye can."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            yield await inner.__anext__()
            await asyncio.Event().wait()
        finally:
            await inner.aclose()


@contextmanager
def served(engine: FakeEngine) -> Iterator[tuple[Any, TestClient, salience_grpc.SalienceStub]]:
    port = free_port()
    app = create_app(Settings(model="fake", grpc_port=port, drain_timeout_s=0), engine=engine)
    with TestClient(app) as client, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield app, client, salience_grpc.SalienceStub(channel)


def refusal(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def test_every_call_is_refused_unavailable_with_a_retry_hint_once_draining() -> None:
    with served(FakeEngine()) as (app, client, stub):
        sid = stub.OpenSession(pb.OpenSessionRequest(model="fake"), timeout=10).session_id
        assert client.portal is not None
        client.portal.call(app.state.drain.begin)
        calls = {
            "OpenSession": lambda: stub.OpenSession(pb.OpenSessionRequest(), timeout=10),
            "ForkSession": lambda: stub.ForkSession(
                pb.ForkSessionRequest(session_id=sid), timeout=10
            ),
            "DumpSession": lambda: stub.DumpSession(
                pb.DumpSessionRequest(session_id=sid), timeout=10
            ),
            "CloseSession": lambda: stub.CloseSession(
                pb.CloseSessionRequest(session_id=sid), timeout=10
            ),
            "GetReadoutManifest": lambda: stub.GetReadoutManifest(
                pb.GetReadoutManifestRequest(), timeout=10
            ),
            "Generate": lambda: list(stub.Generate(pb.GenerateRequest(session_id=sid), timeout=10)),
        }
        for name, call in calls.items():
            error = refusal(call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, (name, error)
            assert "shutting down" in (error.details() or ""), name
            assert (retry_after_s(error) or 0) >= 1, name
        # Refused at the door: the session is still there, untouched.
        assert len(app.state.objects.salience.store.table) == 1


def test_a_generate_running_at_the_goodbyes_ends_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drain_module, "_AFTER_CUT_S", 0.1)  # the stuck call outlives the cut
    engine = StuckEngine()
    with served(engine) as (app, client, stub):
        sid = stub.OpenSession(pb.OpenSessionRequest(model="fake"), timeout=10).session_id
        request = pb.GenerateRequest(session_id=sid, append_tokens=[1, 2], max_tokens=50)
        stream = stub.Generate(request, timeout=15)
        first = next(stream)
        assert first.token.id == 3
        assert client.portal is not None
        drained = threading.Thread(
            target=client.portal.call,
            args=(app.state.drain.run, engine.abort),
        )
        drained.start()
        with pytest.raises(grpc.RpcError) as ended:
            list(stream)
        drained.join(30)
        error = ended.value
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        assert "shutting down" in (error.details() or "") and (retry_after_s(error) or 0) >= 1
        # The engine request was closed, and the session kept what was decoded.
        session = app.state.objects.salience.store.table.get(sid)
        assert engine.running == set() and session.tokens.tolist() == [1, 2, 3]
        assert not session.busy


def test_an_open_socket_opens_no_session_once_draining_and_keeps_its_others() -> None:
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    with TestClient(app) as client, client.websocket_connect("/salience/ws") as ws:
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": "fake"}})
        sid = ws.receive_json()["response"]["sessionId"]
        assert client.portal is not None
        client.portal.call(app.state.drain.begin)
        for method, request in (("OpenSession", {}), ("ForkSession", {"sessionId": sid})):
            ws.send_json({"id": method, "method": method, "request": request})
            error = ws.receive_json()["error"]
            assert error["code"] == "UNAVAILABLE" and "shutting down" in error["message"]
        ws.send_json({"id": "d", "method": "DumpSession", "request": {"sessionId": sid}})
        assert ws.receive_json() == {"id": "d", "response": {}}
