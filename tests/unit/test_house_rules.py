"""House rules that code review alone does not keep: which layer may import what.

Read from each source's own import statements, so a lazy import inside a function counts
too. The layers (DESIGN.md):

- `app/protocols/` (the sans-IO cores): no web framework, server, socket library, gRPC or
  vLLM;
- `app/sessions/` (the session layer, transport-independent): the same;
- `app/engine/` (the engine seam): no web framework, server or gRPC, and nothing of the
  layers above it (`app.routes`, `app.protocols`, `app.sessions`);
- vLLM is imported under `app/engine/` only: nothing else in `app/` may import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "websockets", "grpc")
CORE_FORBIDDEN = (*FRAMEWORKS, "vllm")
ENGINE_FORBIDDEN = (*FRAMEWORKS, "app.routes", "app.protocols", "app.sessions")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _matches(name: str, forbidden: tuple[str, ...]) -> bool:
    """`name` is a forbidden module or inside one; "grpc" also covers grpc_health,
    grpc_reflection, grpc_tools (grpcio's sibling packages)."""
    top = name.split(".")[0]
    return any(
        name == rule or name.startswith(rule + ".") or (rule == "grpc" and top.startswith("grpc"))
        for rule in forbidden
    )


def _sources(layer: str) -> list[Path]:
    return sorted((APP / layer).rglob("*.py"))


def _check(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return [name for name in _imports(path) if _matches(name, forbidden)]


def test_the_rules_see_every_layer() -> None:
    assert len(_sources("protocols")) > 20
    assert len(_sources("sessions")) >= 3
    assert len(_sources("engine")) > 10


@pytest.mark.parametrize(
    "path", _sources("protocols") + _sources("sessions"), ids=lambda p: str(p.relative_to(APP))
)
def test_cores_and_sessions_import_no_framework_server_or_engine(path: Path) -> None:
    bad = _check(path, CORE_FORBIDDEN)
    assert not bad, f"{path} imports {bad}: protocol cores and sessions are transport-free"


@pytest.mark.parametrize("path", _sources("engine"), ids=lambda p: str(p.relative_to(APP)))
def test_the_engine_knows_no_transport_or_protocol(path: Path) -> None:
    bad = _check(path, ENGINE_FORBIDDEN)
    assert not bad, f"{path} imports {bad}: the engine seam knows no wire"


OUTSIDE_ENGINE = [p for p in sorted(APP.rglob("*.py")) if "engine" not in p.relative_to(APP).parts]


@pytest.mark.parametrize("path", OUTSIDE_ENGINE, ids=lambda p: str(p.relative_to(APP)))
def test_only_the_engine_imports_vllm(path: Path) -> None:
    bad = _check(path, ("vllm",))
    assert not bad, f"{path} imports {bad}: vLLM belongs under app/engine/"


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "core.py"
    sample.write_text(
        "def f():\n    from starlette.websockets import WebSocket\n    import grpc.aio\n"
        "    from vllm.utils import x\n    from app.routes.http import sse\n"
    )
    assert _check(sample, CORE_FORBIDDEN) == ["starlette.websockets", "grpc.aio", "vllm.utils"]
    assert _check(sample, ENGINE_FORBIDDEN) == [
        "starlette.websockets",
        "grpc.aio",
        "app.routes.http",
    ]
    assert _check(sample, ("vllm",)) == ["vllm.utils"]
