"""State that outlives a request: the Responses API's stored responses, Salience's
sessions, files and batches.

- `base`: the contract every response store keeps (records by id, time to live, a size
  bound, a cancel flag per id), its errors, and the bounds every store by tenant keeps
  (`BoundedStore`: the response and the conversations' stores on either backend);
- `sqlite`: the embedded default, one file under the state directory, surviving restarts;
- `redis`: one Redis shared by every replica;
- `conversations`: the Conversations API's store (a conversation and its items in order),
  on the same backing store, `sqlite_conversations` and `redis_conversations`;
- `sessions`: where Salience sessions live (the contract, and the process's own store);
  `redis_sessions`: one Redis that replicas share (`--salience-store`), with how a
  session is written there (`redis_session_fields`) and its images
  (`redis_session_images`);
- `batches`: the batches' store contract (files, batches, their requests and results,
  chunks under leases), `sqlite_batches` and `redis_batches`;
- `redis_connection`: one Redis as every store on it uses it (connected on first use,
  its failures mapped once).

`open_store(location, ...)` picks one from `--responses-store`: a `redis://` or
`rediss://` URL, or a file path for SQLite (`sqlite:///abs/path` is taken too);
`open_conversations(location, ...)` the conversations' store at the same place;
`open_sessions(location, ...)` Salience's, from `--salience-store` ("memory" or a Redis
URL); `open_batches(location, ...)` the batches', from `--batch-store`. Each opens
nothing: no file, no connection, until its first use.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.base import VisionInfo
from app.store.base import DEFAULT_CLOCK, Clock, ResponseStore
from app.store.batches import BatchStore
from app.store.conversations import ConversationStore
from app.store.sessions import MemorySessions, SessionBackend


def _redis(location: str) -> bool:
    return location.startswith(("redis://", "rediss://", "unix://"))


def _path(location: str) -> Path:
    return Path(location.removeprefix("sqlite://")).expanduser()


def open_store(
    location: str,
    *,
    ttl_s: float,
    max_bytes: int,
    max_record_bytes: int = 0,
    clock: Clock = DEFAULT_CLOCK,
) -> ResponseStore:
    """The store at `location`; nothing is opened or connected until its first use."""
    if _redis(location):
        from app.store.redis import RedisStore

        return RedisStore(
            location,
            ttl_s=ttl_s,
            max_bytes=max_bytes,
            max_record_bytes=max_record_bytes,
            clock=clock,
        )
    from app.store.sqlite import SqliteStore

    return SqliteStore(
        _path(location),
        ttl_s=ttl_s,
        max_bytes=max_bytes,
        max_record_bytes=max_record_bytes,
        clock=clock,
    )


def open_conversations(
    location: str,
    *,
    ttl_s: float,
    max_bytes: int,
    max_record_bytes: int = 0,
    clock: Clock = DEFAULT_CLOCK,
) -> ConversationStore:
    """The conversations' store at `location` (tables or keys of their own beside the
    responses'); nothing is opened or connected until its first use."""
    if _redis(location):
        from app.store.redis_conversations import RedisConversations

        return RedisConversations(
            location,
            ttl_s=ttl_s,
            max_bytes=max_bytes,
            max_record_bytes=max_record_bytes,
            clock=clock,
        )
    from app.store.sqlite_conversations import SqliteConversations

    return SqliteConversations(
        _path(location),
        ttl_s=ttl_s,
        max_bytes=max_bytes,
        max_record_bytes=max_record_bytes,
        clock=clock,
    )


def open_sessions(
    location: str, *, ttl_s: float, lease_s: float, vision: VisionInfo | None
) -> SessionBackend:
    """Salience's session store at `location`; nothing is connected until its first use."""
    if location == "memory":
        return MemorySessions()
    from app.store.redis_sessions import RedisSessions

    return RedisSessions(location, ttl_s=ttl_s, lease_s=lease_s, vision=vision)


def open_batches(location: str, *, max_bytes: int, clock: Clock = DEFAULT_CLOCK) -> BatchStore:
    """The batches' store at `location` (tables or keys of their own beside the
    responses'); nothing is opened or connected until its first use."""
    if _redis(location):
        from app.store.redis_batches import RedisBatches

        return RedisBatches(location, max_bytes=max_bytes, clock=clock)
    from app.store.sqlite_batches import SqliteBatches

    return SqliteBatches(_path(location), max_bytes=max_bytes, clock=clock)
