"""The gRPC server the app's lifespan runs, on a fake engine: it starts and stops with the
app, is off with port 0, refuses a port in use, its health service follows
`engine.check_health()`, `--api-key` guards the protocol services (not health and
reflection), messages are bounded by `--grpc-max-message-bytes`, and status messages are
cut to fit a trailer. (The protocol services on real vLLM: tests/e2e/test_grpc_*.py.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from app.config import Settings
from app.errors import ConfigError, EngineDead
from app.main import create_app
from app.routes.grpc.calls import STATUS_MESSAGE_BYTES
from schemas import evergreen_service_pb2 as service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as pb
from schemas import salience_pb2_grpc as salience_grpc
from tests.conftest import free_port
from tests.fake_engine import FakeEngine


@contextmanager
def app_on(
    port: int, engine: FakeEngine | None = None, api_key: str | None = None, **more: Any
) -> Iterator[grpc.Channel]:
    settings = Settings(model="fake", grpc_port=port, api_key=api_key, **more)
    app = create_app(settings, engine=engine or FakeEngine())
    with TestClient(app), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel


def _reflection(channel: grpc.Channel) -> Any:
    """Any: types-grpcio-reflection types the stub's method as Incomplete."""
    return reflection_pb2_grpc.ServerReflectionStub(channel)


def check(channel: grpc.Channel, service: str = "") -> int:
    # Any: types-grpcio-health-checking declares HealthStub without its methods.
    stub: Any = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    return int(reply.status)


def test_serves_while_the_app_runs_and_stops_with_it() -> None:
    port = free_port()
    with app_on(port) as channel:
        assert check(channel) == health_pb2.HealthCheckResponse.SERVING
    with socket.socket() as sock:  # the port is free again
        sock.bind(("127.0.0.1", port))


def test_health_follows_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    with app_on(free_port(), engine) as channel:
        assert check(channel) == health_pb2.HealthCheckResponse.SERVING

        async def dead() -> None:
            raise EngineDead("engine process died")

        monkeypatch.setattr(engine, "check_health", dead)
        assert check(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as info:
            check(channel, "no.such.Service")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_port_zero_turns_it_off() -> None:
    app = create_app(Settings(model="fake", grpc_port=0), engine=FakeEngine())
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200


def test_a_port_in_use_stops_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(Settings(model="fake", grpc_port=port), engine=FakeEngine())
        with pytest.raises(ConfigError, match="cannot listen for gRPC"), TestClient(app):
            pass


def test_the_flag() -> None:
    from app.cli import _settings_parser

    known, _ = _settings_parser().parse_known_args(["--model", "m", "--grpc-port", "0"])
    given = {k: v for k, v in vars(known).items() if v is not None and k != "help"}
    assert Settings(**given).grpc_port == 0
    assert Settings.model_fields["grpc_port"].default == 50051


def test_the_api_key_guards_the_protocol_services_only() -> None:
    with app_on(free_port(), api_key="sekrit") as channel:
        salience = salience_grpc.SalienceStub(channel)
        evergreen = evergreen_grpc.EvergreenServiceStub(channel)
        request = pb.OpenSessionRequest(model="fake")
        refused = []
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "sekrit"),)):
            with pytest.raises(grpc.RpcError) as info:
                salience.OpenSession(request, metadata=metadata, timeout=10)
            refused.append((info.value.code(), info.value.details()))
            with pytest.raises(grpc.RpcError) as info:
                list(evergreen.StartSession(iter([service_pb.SessionMessage()]), metadata=metadata))
            refused.append((info.value.code(), info.value.details()))
        assert set(refused) == {(grpc.StatusCode.UNAUTHENTICATED, "Missing or invalid API key")}
        key = (("authorization", "Bearer sekrit"),)
        assert salience.OpenSession(request, metadata=key, timeout=10).session_id
        assert list(evergreen.StartSession(iter([]), metadata=key, timeout=10)) == []
        # Health and reflection stay open, as /health and /openapi.json do.
        assert check(channel) == health_pb2.HealthCheckResponse.SERVING
        listing = next(
            _reflection(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
        )
        names = {s.name for s in listing.list_services_response.service}
        assert {"salience.v1.Salience", "evergreen.v2.EvergreenService"} <= names


def test_messages_are_bounded_both_ways() -> None:
    engine = FakeEngine(max_model_len=2048)
    with app_on(free_port(), engine, grpc_max_message_bytes=1024) as channel:
        salience = salience_grpc.SalienceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            salience.OpenSession(pb.OpenSessionRequest(model="x" * 2000), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        session = salience.OpenSession(pb.OpenSessionRequest(model="fake"), timeout=10)
        # Two requests of 400 two-byte ids each fit; the dump of all 800 does not.
        for offset in (0, 400):
            request = pb.GenerateRequest(
                session_id=session.session_id, append_tokens=[200] * 400, offset=offset
            )
            assert list(salience.Generate(request, timeout=10))[-1].HasField("done")
        with pytest.raises(grpc.RpcError) as info:
            salience.DumpSession(pb.DumpSessionRequest(session_id=session.session_id))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_status_message_quoting_a_long_input_is_cut_to_fit_a_trailer() -> None:
    """A client refuses trailers over 16 KiB: uncut, these calls would end
    RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of their own status."""
    long_name = "\u00e9" * 50_000  # 100 kB of UTF-8, 300 kB percent-encoded
    with app_on(free_port()) as channel:
        salience = salience_grpc.SalienceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            salience.OpenSession(pb.OpenSessionRequest(model=long_name), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value.details()
        details = info.value.details() or ""
        assert details.endswith(" [cut]")
        assert len(details.encode()) <= STATUS_MESSAGE_BYTES + len(" [cut]")
        turn = {
            "actions": [
                {
                    "name": "GENERATE",
                    "inputs": [{"name": "prompt", "id": "p"}],
                    "outputs": [{"name": long_name, "id": "r"}],
                }
            ]
        }
        message = json_format.ParseDict(turn, service_pb.SessionMessage())
        evergreen = evergreen_grpc.EvergreenServiceStub(channel)
        received = []
        with pytest.raises(grpc.RpcError) as info:
            for reply in evergreen.StartSession(iter([message]), timeout=10):
                received.append(reply)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert (info.value.details() or "").endswith(" [cut]")
        # The ABORT message, a body of the protocol, still says it all.
        status = struct_pb2.Struct()
        assert received[-1].actions[0].configs[0].Unpack(status)
        assert long_name in str(status["message"])
