"""Every package says what it holds, and docs/layout.md's paragraph per package says the
same: each of a package's modules and subpackages is named there (in backticks, or as a
table row), and every module a list or a table of it names exists. Fails when a module
is added and not listed, or moved and still listed (the README's map is the front page's
short form of the same; tests/unit/test_docs_links.py checks the paths it names)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app"
LAYOUT = ROOT / "docs" / "layout.md"

# `name`, `name/` or `name.py` in backticks: a module or a package named in a text.
_NAMED = re.compile(r"`([a-z_][a-z0-9_]*)(?:/|\.py)?`")
# A list item's or a table row's head: what the text says the package holds.
_LISTED = (
    re.compile(r"^\s*- ((?:`[a-z_][a-z0-9_]*/?`(?:, | and )?)+)", re.M),
    re.compile(r"^    ([a-z_][a-z0-9_]*)  +\S", re.M),
)


def _packages() -> list[Path]:
    return sorted({path.parent for path in APP.rglob("*.py")} - {APP.parent})


def _children(package: Path) -> set[str]:
    """The package's modules and subpackages."""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return modules | {p.name for p in package.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def _named(text: str) -> set[str]:
    named = set(_NAMED.findall(text))
    return named | set(_LISTED[1].findall(text))


def _listed(text: str) -> set[str]:
    heads = {name for head in _LISTED[0].findall(text) for name in _NAMED.findall(head)}
    return heads | set(_LISTED[1].findall(text))


def _docstring(package: Path) -> str:
    init = package / "__init__.py"
    assert init.exists(), f"{package} has no __init__.py to say what it holds"
    return ast.get_docstring(ast.parse(init.read_text())) or ""


def _layout() -> dict[str, str]:
    """docs/layout.md's paragraphs, by the package each heads (`### app/x/`)."""
    sections = re.split(r"^### `(app(?:/[a-z_0-9]+)*)/`\n", LAYOUT.read_text(), flags=re.M)
    return dict(zip(sections[1::2], sections[2::2], strict=True))


def _name(package: Path) -> str:
    return str(package.relative_to(ROOT))


def _problems(text: str, package: Path) -> list[str]:
    children = _children(package)
    unlisted = sorted(children - _named(text))
    missing = sorted(_listed(text) - children)
    return [f"not named: {unlisted}"] * bool(unlisted) + [f"no such module: {missing}"] * bool(
        missing
    )


@pytest.mark.parametrize("package", _packages(), ids=_name)
def test_a_package_docstring_names_what_it_holds(package: Path) -> None:
    assert not _problems(_docstring(package), package), _problems(_docstring(package), package)


@pytest.mark.parametrize("package", _packages(), ids=_name)
def test_the_layout_has_a_true_paragraph_per_package(package: Path) -> None:
    layout = _layout()
    assert _name(package) in layout, f"docs/layout.md has no section `{_name(package)}/`"
    problems = _problems(layout[_name(package)], package)
    assert not problems, problems


def test_the_layout_heads_only_packages_that_exist() -> None:
    assert set(_layout()) == {_name(package) for package in _packages()}


def test_the_rules_catch_a_missing_and_a_stale_module(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    for name in ("kept", "new"):
        (package / f"{name}.py").write_text("")
    text = "- `kept`: what it keeps;\n- `gone`: moved away.\n    old   a table row\n"
    assert _problems(text, package) == ["not named: ['new']", "no such module: ['gone', 'old']"]
    assert _problems("- `kept`, `new`: both.\n", package) == []
