"""A real `redis-server` (Debian's package, installed by scripts/setup) for the tests that
share a store: the fleet's own member (`app.fleet.members.RedisServer`: a free loopback
port, nothing persisted), stopped with the fixture that started it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import redis

from app.fleet.members import RedisServer

START_TIMEOUT = 30.0


@contextmanager
def redis_server(workdir: Path, *extra: str) -> Iterator[str]:
    """A fresh redis-server (`extra`: more of its flags); yields its URL."""
    server = RedisServer("redis", workdir, extra=list(extra))
    try:
        server.start()
        server.wait_ready(START_TIMEOUT)
        yield server.url
    finally:
        server.stop(10)


def sorted_set(client: redis.Redis, key: str) -> list[str]:
    """The members of the sorted set `key`, lowest score first."""
    # redis-py types a reply as the union of its sync and async clients' results.
    return [member.decode() for member in cast("list[bytes]", client.zrange(key, 0, -1))]


def keys(client: redis.Redis, pattern: str) -> list[str]:
    """The keys matching `pattern`."""
    return [key.decode() for key in cast("list[bytes]", client.keys(pattern))]
