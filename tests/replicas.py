"""Replicas on the live server's engine, for the tests of state that replicas share (the
response store, conversations): apps of their own settings, each served on its own port
on the engine's loop, so that they share nothing but the store they are given."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.conftest import LiveServer, free_port, tiny_model_path

START_S = 60.0


@contextmanager
def app_on_live_engine(live: LiveServer, **settings: Any) -> Iterator[str]:
    """A second app (a replica, as far as the store can tell) with `settings`; yields its
    base URL."""
    from app.config import Settings

    port = free_port()
    config = Settings(
        model=str(tiny_model_path()),
        served_model_name=live.model,
        host="127.0.0.1",
        port=port,
        grpc_port=0,
        log_level="warning",
        **settings,
    )
    with live.another_app(config, start_s=START_S):
        yield f"http://127.0.0.1:{port}"
