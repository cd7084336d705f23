"""One Redis as every store on it uses it: a client made on first use, and Redis's
failures turned into the store's, in one place.

- The client is made on the first call, on the loop that makes it (a redis-py client
  belongs to one loop), so opening a store connects nothing: a server whose store is
  never used never reaches Redis. It holds at most `MAX_CONNECTIONS`; a call waits for a
  free one (up to `POOL_WAIT_S`).
- `failures()` maps what Redis raises, most specific first: a transaction's `WatchError`
  passes through unchanged (the caller runs its transaction again); out of memory (`OOM`
  under `maxmemory` with `noeviction`) is `store_full`; anything else (refused, timed out,
  a protocol error) `store_unavailable`, for that call only. `call` and `pipeline` run
  under it; a store that talks to the client another way wraps that in it too.
- Messages name the store and its URL without the password (`redacted`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from app.store.base import full, unavailable

# Redis runs one command at a time: a burst of calls (every replica's requests racing to
# record their results) waits for one of a few connections rather than opening one each,
# which adds handshakes and Redis clients, not throughput. A connect is given as long as a
# command (a handshake of dozens at once on a loaded host took over 2 s in CI).
MAX_CONNECTIONS = 16
POOL_WAIT_S = 20.0  # for a free connection, before the call fails as the store unavailable
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 5.0


class RedisConnection:
    """One Redis at `url`, for the store `store` names in its errors."""

    def __init__(self, url: str, *, store: str) -> None:
        self.url = url
        self.where = redacted(url)
        self.store = store
        self._client: aioredis.Redis | None = None

    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            pool = aioredis.BlockingConnectionPool.from_url(
                self.url,
                max_connections=MAX_CONNECTIONS,
                timeout=POOL_WAIT_S,
                socket_connect_timeout=CONNECT_TIMEOUT_S,
                socket_timeout=SOCKET_TIMEOUT_S,
            )
            self._client = aioredis.Redis.from_pool(pool)
        return self._client

    @contextmanager
    def failures(self) -> Iterator[None]:
        try:
            yield
        except redis_errors.WatchError:
            raise
        except redis_errors.OutOfMemoryError as exc:
            raise full(f"{self.where}: {exc!r}", "it has no room left", store=self.store) from exc
        except (redis_errors.RedisError, OSError) as exc:
            raise unavailable(self.where, exc, store=self.store) from exc

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One command (`method` of redis-py's client), its failures the store's."""
        with self.failures():
            return await getattr(self._redis(), method)(*args, **kwargs)

    @asynccontextmanager
    async def pipeline(self, *, transaction: bool) -> AsyncIterator[Any]:
        """A pipeline (MULTI/EXEC when `transaction`), its failures the store's."""
        with self.failures():
            async with self._redis().pipeline(transaction=transaction) as pipe:
                yield pipe

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
