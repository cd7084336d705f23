"""The README and docs/ hold together as pages move between them: every relative link
points at a file that exists (and a link into a markdown page at one of its headings), and
every benchmark's table has exactly one place, between its `bench:NAME` markers, for
bench/common.py's `write_table` to fill."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_OPENING = re.compile(r"^<!-- bench:([\w.-]+) -->$", re.M)
_CLOSING = re.compile(r"^<!-- /bench:([\w.-]+) -->$", re.M)
_BENCH_NAME = re.compile(r"""\b(?:publish|write_table)\(\s*["']([\w.-]+)["']""")


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


def test_every_benchmark_has_its_markers() -> None:
    marked = {name for document in DOCUMENTS for name in _OPENING.findall(document.read_text())}
    used = {
        name
        for script in sorted((ROOT / "bench").glob("*.py"))
        for name in _BENCH_NAME.findall(script.read_text())
    }
    assert used, "no publish(...) or write_table(...) call found under bench/"
    assert used - marked == set(), "benchmarks whose table has no bench:NAME markers"
