"""House rules that code review alone does not keep: which layer may import what.

Read from each source's own import statements, so a lazy import inside a function counts
too. The layers (DESIGN.md):

- `app/protocols/` (the sans-IO cores): no web framework, server, socket library, gRPC or
  vLLM;
- `app/sessions/` (the session layer, transport-independent): the same; and `app/batches/`
  (the batch lane and runner, on that layer);
- `app/engine/` (the engine seam): no web framework, server or gRPC, and nothing of the
  layers above it (`app.routes`, `app.protocols`, `app.sessions`);
- vLLM is imported under `app/engine/` only: nothing else in `app/` may import it;
- no import circle in `app/` (a lazy import closes one as well as a module-level one);
- no module of `app/` imports another's private name (a leading underscore): what two
  modules share is public where it is written.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "websockets", "grpc")
CORE_FORBIDDEN = (*FRAMEWORKS, "vllm")
ENGINE_FORBIDDEN = (*FRAMEWORKS, "app.routes", "app.protocols", "app.sessions")


@cache
def _tree(path: Path) -> ast.Module:
    """`path` parsed, once a run: the rules read each file three or four times, and the
    trees are only read."""
    return ast.parse(path.read_text(), filename=str(path))


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at `root` and the package's modules it imports (a name
    imported from a package is the module of that name, if there is one, else the
    package's `__init__`)."""
    modules = {_module(path, root) for path in root.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        found: set[str | None] = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                found.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.update(owner(f"{node.module}.{alias.name}") for alias in node.names)
        module = _module(path, root)
        graph[module] = {name for name in found if name is not None and name != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group: list[str] = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def _private_imports(path: Path) -> list[str]:
    tree = _tree(path)
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


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
    "path",
    _sources("protocols") + _sources("sessions") + _sources("batches"),
    ids=lambda p: str(p.relative_to(APP)),
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


def test_no_import_circle_in_app() -> None:
    assert len(_graph(APP)) > 100
    assert not _circles(_graph(APP))


def test_the_circle_rule_catches_a_lazy_circle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "store" / "__init__.py").write_text("from pkg.store.a import A\n")
    (package / "store" / "a.py").write_text("def f():\n    from pkg.store import b\n")
    (package / "store" / "b.py").write_text("from pkg.store.a import f\n")
    assert _circles(_graph(package)) == [["pkg.store.a", "pkg.store.b"]]


@pytest.mark.parametrize("path", sorted(APP.rglob("*.py")), ids=lambda p: str(p.relative_to(APP)))
def test_no_private_name_imported_across_modules(path: Path) -> None:
    bad = _private_imports(path)
    assert not bad, f"{path} imports {bad}: a name two modules share is public"


def test_the_private_rule_catches_one(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text("from app.store.redis import _redacted, RedisStore\nfrom os import _exit\n")
    assert _private_imports(sample) == ["app.store.redis._redacted"]
