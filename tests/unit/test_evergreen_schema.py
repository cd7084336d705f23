"""Our Evergreen schemas are the published ones: `evergreen.proto` byte for byte, and
`evergreen_service.proto` but for its import path (protoc runs from the repository root
here), which changes nothing on the wire."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import evergreen_service_pb2 as service_pb
from tests.seeds import published

ROOT = Path(__file__).resolve().parents[2]


def test_schemas_are_the_published_ones() -> None:
    assert (ROOT / "schemas" / "evergreen.proto").read_bytes() == (
        published("evergreen.proto").read_bytes()
    )
    ours = (ROOT / "schemas" / "evergreen_service.proto").read_text().splitlines()
    theirs = published("evergreen_service.proto").read_text().splitlines()
    differ = [line for line in ours if line not in theirs]
    assert [line for line in differ if not line.startswith("//")] == [
        'import "schemas/evergreen.proto";'
    ]
    assert [line for line in theirs if line not in ours] == ['import "evergreen.proto";']


def test_wire_names_and_numbers() -> None:
    # What a peer built from the published schema decodes: package, names, field numbers.
    message = service_pb.SessionMessage.DESCRIPTOR
    assert message.full_name == "evergreen.v2.SessionMessage"
    assert {f.name: f.number for f in message.fields} == {"node_fragments": 1, "actions": 2}
    fragment = message.fields_by_name["node_fragments"].message_type
    assert {f.name: f.number for f in fragment.fields} == {
        "id": 1,
        "seq": 2,
        "continued": 3,
        "child_ids": 4,
        "chunk_fragment": 5,
    }
    action = message.fields_by_name["actions"].message_type
    assert {f.name: f.number for f in action.fields} == {
        "name": 2,
        "inputs": 3,
        "outputs": 4,
        "configs": 5,
        "target_spec": 6,
    }
    chunk = fragment.fields_by_name["chunk_fragment"].message_type
    assert {f.name: f.number for f in chunk.fields} == {"metadata": 1, "ref": 3, "data": 10}


def test_a_missing_published_schema_fails_the_test() -> None:
    # A schema test that skipped where the seeds are missing would pass having compared
    # nothing (CI lays shared/ beside the checkout; a git worktree finds its main one's).
    with pytest.raises(pytest.fail.Exception, match="looked for"):
        published("no-such-schema.proto")
