"""The live server's gRPC port as standard gRPC tooling sees it (real vLLM): the health
service over the engine, reflection complete enough to list the services and call one
with no generated code (what grpcurl does), and docs/grpc.md's client example as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SALIENCE = "salience.v1.Salience"
EVERGREEN = "evergreen.v2.EvergreenService"


def test_health_is_serving_for_the_server_and_each_service(live_server: LiveServer) -> None:
    with grpc.insecure_channel(live_server.grpc_target) as channel:
        # Any: types-grpcio-health-checking declares HealthStub without its methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        for service in ("", SALIENCE, EVERGREEN):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_reflection_lists_the_services_and_calls_one_without_generated_code(
    live_server: LiveServer,
) -> None:
    with grpc.insecure_channel(live_server.grpc_target) as channel:
        # Any: types-grpcio-reflection types the stub's method as Incomplete.
        stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)
        listing = next(
            stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
            )
        )
        names = {s.name for s in listing.list_services_response.service}
        assert {SALIENCE, EVERGREEN, "grpc.health.v1.Health"} <= names
        # As grpcurl does: the schema from the server, then a call built from it alone.
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName(SALIENCE)
        assert [m.name for m in service.methods] == [
            "OpenSession",
            "CloseSession",
            "ForkSession",
            "Generate",
            "GetReadoutManifest",
            "DumpSession",
        ]
        method = service.methods_by_name["GetReadoutManifest"]
        request_class: Any = GetMessageClass(method.input_type)
        reply_class: Any = GetMessageClass(method.output_type)
        call = channel.unary_unary(
            f"/{SALIENCE}/GetReadoutManifest",
            request_serializer=request_class.SerializeToString,
            response_deserializer=reply_class.FromString,
        )
        manifest = call(request_class(), timeout=30)
        assert manifest.dtype == "float32" and list(manifest.layers) == [0, 1]
        evergreen = pool.FindServiceByName(EVERGREEN).methods_by_name["StartSession"]
        assert evergreen.client_streaming and evergreen.server_streaming


def test_the_documented_example_runs(live_server: LiveServer) -> None:
    doc = (ROOT / "docs" / "grpc.md").read_text()
    section = doc[doc.index("# Native gRPC") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    program = code.group(1).replace("http://127.0.0.1:8000", live_server.base_url)
    program = program.replace("127.0.0.1:50051", live_server.grpc_target)
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    # Sampled at temperature 1: an early EOS may end it before max_tokens.
    assert 1 <= run.stdout.count("token {") <= 8 and "done {" in run.stdout
