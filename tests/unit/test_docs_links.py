"""The README and docs/ hold together as code and pages move: every relative link points
at a file that exists (and a link into a markdown page at one of its headings); every
path in the repository a page names (`bench/frontends.py`, `tests/fleet/`,
`app/store/*.py`, in prose or in a command) exists, and every `app.module.name` it names
is defined; every benchmark's table has exactly one place, between its `bench:NAME`
markers, for bench/harness.py's `write_table` to fill; every benchmark that publishes has
its claim on docs/benchmarks.md in the page's shape (what holds, the command, the latest
run's results file); and every results file is in the record, bench/results/README.md."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
RECORD = ROOT / "bench" / "results" / "README.md"

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_OPENING = re.compile(r"^<!-- bench:([\w.-]+) -->$", re.M)
_CLOSING = re.compile(r"^<!-- /bench:([\w.-]+) -->$", re.M)
_BENCH_NAME = re.compile(r"""\b(?:publish|write_table)\(\s*["']([\w.-]+)["']""")
# A path in the repository: one of its top-level directories, then path characters; not
# inside another path or a URL (`../bench/...` is a link, checked as one).
_REPO_PATH = re.compile(
    r"(?<![\w./:-])((?:app|bench|tests|scripts|docs|schemas|deploy|fbs)/[\w./*-]*[\w*/])"
)
# A placeholder in a path (`bench/NAME.py`, `bench/results/NAME.json`) names no file.
_PLACEHOLDER = re.compile(r"(?:^|/)[A-Z_]+(?:[./]|$)")
_DOTTED = re.compile(r"`(app(?:\.\w+)+)`")
_CLAIM_SECTION = re.compile(r"^(#{2,3}) ([^\n]+)\n(.*?)(?=^#{2,3} |\Z)", re.S | re.M)
_NOT_CLAIMS = {
    "How the benchmarks run",
    "Adding or re-running a claim",
    "Experiments behind the defaults",
}


def _prose(path: Path) -> str:
    """The page without its code blocks, where `](` is code, not a link."""
    return _FENCE.sub("", path.read_text())


def _anchors(path: Path) -> set[str]:
    """The heading ids GitHub gives a page: lower case, punctuation dropped, spaces as
    hyphens, a repeat numbered -1, -2, ..."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in _HEADING.findall(_prose(path)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def _links(path: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_CODE_SPAN.sub("", _prose(path)))
        if not re.match(r"(https?|mailto):", target)
    ]


def _missing_paths(text: str) -> list[str]:
    """The repository paths `text` names that do not exist (a glob must match one)."""
    missing = []
    for path in _REPO_PATH.findall(text):
        path = path.rstrip(".")
        if _PLACEHOLDER.search(path):
            continue
        found = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
        if not found:
            missing.append(path)
    return missing


def _defined(module: Path, name: str) -> bool:
    """Whether `module` defines `name` at its top level (a function, a class, an
    assignment or an import)."""
    for node in ast.parse(module.read_text()).body:
        if (
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name == name
        ):
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == name for target in targets):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            return True
    return False


def _dotted_resolves(dotted: str) -> bool:
    """`app.a.b` is a package or module, or `app.a.b.Name` a name defined in module
    `app.a.b` (found by reading the files: nothing is imported)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:split])
        module = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if not module.exists():
            continue
        rest = parts[split:]
        return not rest or (len(rest) == 1 and _defined(module, rest[0]))
    return False


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in _links(document):
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{document.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_path_a_document_names_exists(document: Path) -> None:
    text = document.read_text()
    missing = _missing_paths(text)
    unresolved = [name for name in _DOTTED.findall(text) if not _dotted_resolves(name)]
    assert not missing, f"{document.relative_to(ROOT)} names missing paths: {missing}"
    assert not unresolved, f"{document.relative_to(ROOT)} names no such code: {unresolved}"


def test_the_path_check_can_fail() -> None:
    assert _missing_paths("run `bench/per_token.py`, then bench/harness.py.") == [
        "bench/per_token.py"
    ]
    assert _missing_paths("`bench/results/NAME.json`, `tests/e2e/test_responses_*.py`") == []
    assert _missing_paths("`tests/e2e/test_nothing_*.py`") == ["tests/e2e/test_nothing_*.py"]
    assert _dotted_resolves("app.engine.cpu_host")
    assert not _dotted_resolves("app.engine.cpu_host.no_such_name")
    assert not _dotted_resolves("app.no_such_module")


def test_every_bench_marker_pair_appears_exactly_once() -> None:
    openings: Counter[str] = Counter()
    closings: Counter[str] = Counter()
    for document in DOCUMENTS:
        text = document.read_text()
        openings.update(_OPENING.findall(text))
        closings.update(_CLOSING.findall(text))
        for name in _OPENING.findall(text):
            pair = rf"^<!-- bench:{re.escape(name)} -->$.*?^<!-- /bench:{re.escape(name)} -->$"
            assert re.search(pair, text, re.S | re.M), f"bench:{name} opens but never closes"
    assert openings == closings, "every bench:NAME marker needs its /bench:NAME"
    assert {name: n for name, n in openings.items() if n != 1} == {}


def _published() -> dict[str, set[str]]:
    """Each bench/ script that publishes a table, with the names it publishes under."""
    return {
        f"bench/{script.name}": names
        for script in sorted((ROOT / "bench").glob("*.py"))
        if (names := set(_BENCH_NAME.findall(script.read_text())))
    }


def test_every_benchmark_has_its_markers() -> None:
    marked = {name for document in DOCUMENTS for name in _OPENING.findall(document.read_text())}
    used = set().union(*_published().values())
    assert used, "no publish(...) or write_table(...) call found under bench/"
    assert used - marked == set(), "benchmarks whose table has no bench:NAME markers"


def test_every_claim_on_the_benchmarks_page_has_its_shape() -> None:
    """What docs/benchmarks.md's "Adding or re-running a claim" asks of a claim: what
    holds, the command with its script, the latest run with its results file."""
    wrong = []
    run_scripts: set[str] = set()
    for level, heading, body in _CLAIM_SECTION.findall(BENCHMARKS.read_text()):
        if heading in _NOT_CLAIMS or (level == "###" and "**Holds" not in body):
            continue
        run = re.search(r"\*\*Run:\*\* `[^`]*?(bench/\w+\.py)", body)
        latest = re.search(r"\*\*Latest:\*\*[^*]*?`(bench/results/[\w.-]+\.json)`", body, re.S)
        if "**Holds" not in body or not run or not latest:
            wrong.append(heading)
            continue
        run_scripts.add(run.group(1))
        if not (ROOT / latest.group(1)).exists():
            wrong.append(f"{heading}: no {latest.group(1)}")
    assert not wrong, f"claims without **Holds:**, **Run:** bench/X.py or **Latest:**: {wrong}"
    unclaimed = set(_published()) - run_scripts
    assert not unclaimed, f"benchmarks with no claim on docs/benchmarks.md: {sorted(unclaimed)}"


def test_every_results_file_is_in_the_record() -> None:
    record = RECORD.read_text()
    absent = [
        path.name
        for path in sorted((ROOT / "bench" / "results").glob("*.json"))
        if f"`{path.name}`" not in record
    ]
    assert not absent, f"bench/results/README.md says nothing of {absent}"


def test_the_benchmarks_page_stays_short() -> None:
    """docs/benchmarks.md is the claims that hold now; a run's history goes to
    bench/results/README.md, its tables to the topic's doc (issue 43: under 300 lines)."""
    lines = len(BENCHMARKS.read_text().splitlines())
    assert lines < 300, f"docs/benchmarks.md has {lines} lines: move history or tables out"
