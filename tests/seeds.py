"""The published schemas our own must equal (`shared/seeds/` beside the checkout: CI lays
it there). A git worktree finds them beside its main checkout. Missing seeds fail the
test that needs them, saying where they were looked for: a schema test that skipped
would pass without having compared anything."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _checkouts() -> list[Path]:
    """This checkout, and the main one when this is a git worktree (its `.git` is a file
    naming the worktree's directory inside the main checkout's `.git`)."""
    dot_git = ROOT / ".git"
    if not dot_git.is_file():
        return [ROOT]
    gitdir = Path(dot_git.read_text().removeprefix("gitdir:").strip())
    common = gitdir / "commondir"
    main_git = (gitdir / common.read_text().strip()).resolve() if common.is_file() else gitdir
    return [ROOT, main_git.parent]


def published(name: str) -> Path:
    """The published schema `name` (e.g. `salience.proto`); fails the test when absent."""
    places = [checkout.parent / "shared" / "seeds" / name for checkout in _checkouts()]
    for place in places:
        if place.is_file():
            return place
    pytest.fail(f"the published {name} is missing: looked for {', '.join(map(str, places))}")
