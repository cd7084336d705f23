"""What the store contract tests share (tests/unit/test_response_store.py and
test_conversation_store.py): an injected clock, so that expiry is tested by moving it
rather than by waiting, and where a test's stores of one backend live."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """`request.param`'s location, fresh for the test: a SQLite file of its own, or the
    `redis_url` fixture's redis-server database, flushed."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        redis.Redis.from_url(url).flushdb()
        return url
    return str(tmp_path / "responses.sqlite3")
