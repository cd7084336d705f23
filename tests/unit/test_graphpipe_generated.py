"""The committed GraphPipe code is what scripts/generate makes of fbs/graphpipe.fbs, and
the ids the core hard-codes are the schema's."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from app.protocols.graphpipe import decode
from app.protocols.graphpipe.tensors import TensorType
from fbs.graphpipe import graphpipe_generated as fb
from tests.seeds import published

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "fbs" / "graphpipe"


def test_committed_code_matches_the_generator(tmp_path: Path) -> None:
    if shutil.which("flatc") is None:
        pytest.fail("flatc is missing: scripts/setup installs Debian's flatbuffers-compiler")
    subprocess.run([str(ROOT / "scripts" / "generate"), str(tmp_path)], check=True, cwd=ROOT)
    fresh = tmp_path / "fbs" / "graphpipe"
    files = sorted(p.name for p in GENERATED.iterdir() if p.is_file())
    assert files == sorted(p.name for p in fresh.iterdir() if p.is_file())
    match, mismatch, errors = filecmp.cmpfiles(GENERATED, fresh, files, shallow=False)
    assert (mismatch, errors) == ([], []), "run scripts/generate and commit the result"
    assert match == files


def test_committed_schema_is_the_published_one() -> None:
    assert (ROOT / "fbs" / "graphpipe.fbs").read_bytes() == published("graphpipe.fbs").read_bytes()


def test_type_ids_are_the_schemas() -> None:
    generated = {name: value for name, value in vars(fb.Type).items() if not name.startswith("_")}
    assert generated == {t.name: t.value for t in TensorType}


def test_union_ids_are_the_schemas() -> None:
    assert (fb.Req.InferRequest, fb.Req.MetadataRequest) == (decode.REQ_INFER, decode.REQ_METADATA)
