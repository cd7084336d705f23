"""The committed protobuf and gRPC modules are what scripts/generate makes of schemas/*.proto,
and the gRPC services they define are the published ones: the full names a generated
client calls, each method's streaming shape and message types."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from schemas import evergreen_service_pb2 as evergreen_service_pb
from schemas import evergreen_service_pb2_grpc as evergreen_grpc
from schemas import salience_pb2 as salience_pb
from schemas import salience_pb2_grpc as salience_grpc

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


def _generated(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*_pb2*.py"))


def test_committed_modules_match_the_generator(tmp_path: Path) -> None:
    if shutil.which("flatc") is None:
        pytest.fail("flatc is missing: scripts/setup installs Debian's flatbuffers-compiler")
    subprocess.run([str(ROOT / "scripts" / "generate"), str(tmp_path)], check=True, cwd=ROOT)
    fresh = tmp_path / "schemas"
    files = _generated(SCHEMAS)
    assert files == _generated(fresh)
    # Stubs for exactly the protos that define a service.
    assert [f for f in files if f.endswith("_grpc.py")] == [
        "evergreen_service_pb2_grpc.py",
        "salience_pb2_grpc.py",
    ]
    match, mismatch, errors = filecmp.cmpfiles(SCHEMAS, fresh, files, shallow=False)
    assert (mismatch, errors) == ([], []), "run scripts/generate and commit the result"
    assert match == files


def test_salience_service_is_the_published_one() -> None:
    service = salience_pb.DESCRIPTOR.services_by_name["Salience"]
    assert service.full_name == "salience.v1.Salience"
    shapes = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert shapes == {
        "OpenSession": ("OpenSessionRequest", "OpenSessionResponse", False, False),
        "CloseSession": ("CloseSessionRequest", "CloseSessionResponse", False, False),
        "ForkSession": ("ForkSessionRequest", "ForkSessionResponse", False, False),
        "Generate": ("GenerateRequest", "GenerateEvent", False, True),
        "GetReadoutManifest": ("GetReadoutManifestRequest", "ReadoutManifest", False, False),
        "DumpSession": ("DumpSessionRequest", "DumpSessionResponse", False, False),
    }
    assert hasattr(salience_grpc, "SalienceStub")
    assert hasattr(salience_grpc, "add_SalienceServicer_to_server")


def test_evergreen_service_is_the_published_one() -> None:
    service = evergreen_service_pb.DESCRIPTOR.services_by_name["EvergreenService"]
    assert service.full_name == "evergreen.v2.EvergreenService"
    [method] = service.methods
    assert (method.name, method.client_streaming, method.server_streaming) == (
        "StartSession",
        True,
        True,
    )
    assert method.input_type.full_name == method.output_type.full_name
    assert method.input_type.full_name == "evergreen.v2.SessionMessage"
    assert hasattr(evergreen_grpc, "EvergreenServiceStub")
    assert hasattr(evergreen_grpc, "add_EvergreenServiceServicer_to_server")
