"""House rules that code review alone does not keep.

Protocol cores are sans-IO: nothing under `app/protocols/` may import a web framework, a
server, a socket library, gRPC or vLLM (DESIGN.md). Read from the source's own import
statements, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTOCOLS = Path(__file__).resolve().parents[2] / "app" / "protocols"
FORBIDDEN = ("fastapi", "starlette", "uvicorn", "websockets", "grpc", "vllm")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _forbidden(name: str) -> bool:
    top = name.split(".")[0]
    return top in FORBIDDEN or top.startswith("grpc")


SOURCES = sorted(PROTOCOLS.rglob("*.py"))


def test_the_rule_sees_the_cores() -> None:
    assert len(SOURCES) > 20


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PROTOCOLS)))
def test_protocol_cores_import_no_framework_server_or_engine(path: Path) -> None:
    bad = [name for name in _imports(path) if _forbidden(name)]
    assert not bad, f"{path} imports {bad}: protocol cores are sans-IO"


def test_the_rule_catches_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "core.py"
    sample.write_text(
        "def f():\n    from starlette.websockets import WebSocket\n    import grpc.aio\n"
    )
    assert [n for n in _imports(sample) if _forbidden(n)] == ["starlette.websockets", "grpc.aio"]
