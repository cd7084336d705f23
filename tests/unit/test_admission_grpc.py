"""Admission and drain on gRPC Evergreen sessions, over the fake engine: a GENERATE the
bound refuses, and a draining server's new session, both end the call with the ABORT
message (UNAVAILABLE, `retry_after_s`) and the status UNAVAILABLE with the same hint as
retry info, as on the websocket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format

from app.admission import ProtocolName
from app.config import Settings
from app.main import create_app
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from tests.conftest import free_port
from tests.evergreen_frames import abort_status, turn
from tests.fake_engine import FakeEngine
from tests.grpc_retry import retry_after_s


@contextmanager
def served(**settings: Any) -> Iterator[tuple[Any, TestClient, grpc.Channel]]:
    port = free_port()
    app = create_app(Settings(model="fake", grpc_port=port, **settings), engine=FakeEngine())
    with TestClient(app) as client, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield app, client, channel


def _session(
    channel: grpc.Channel, actions: bool = True
) -> tuple[list[service_pb.SessionMessage], grpc.RpcError]:
    stub = evergreen_grpc.EvergreenServiceStub(channel)
    first = turn("ab", 4)
    if not actions:  # a node and nothing to do: the session alone is refused
        del first["actions"]
    message = json_format.ParseDict(first, service_pb.SessionMessage())
    received = []
    with pytest.raises(grpc.RpcError) as ended:
        for reply in stub.StartSession(iter([message]), timeout=10):
            received.append(reply)
    return received, ended.value


def test_a_refused_generate_ends_the_grpc_session_unavailable() -> None:
    with served(max_queued_requests=1) as (app, client, channel):
        assert client.portal is not None
        held = client.portal.call(app.state.admission.admit, ProtocolName.OPENAI)
        received, error = _session(channel)
        client.portal.call(held.release)
        assert app.state.admission.refused["evergreen"] == 1
    status = abort_status(received[-1])
    assert status["code"] == "UNAVAILABLE" and status["retry_after_s"] >= 1
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "retry after" in (error.details() or "")
    assert retry_after_s(error) == status["retry_after_s"]


def test_a_draining_server_refuses_a_new_grpc_session() -> None:
    with served() as (app, client, channel):
        assert client.portal is not None
        client.portal.call(app.state.drain.begin)
        received, error = _session(channel, actions=False)
    status = abort_status(received[-1])
    assert status["code"] == "UNAVAILABLE"
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (
        error.details() or ""
    )
    assert retry_after_s(error) == status["retry_after_s"]
